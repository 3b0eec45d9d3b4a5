//! redis-ratelimit-exporter: the module's `INFO ratelimit` (and, for the
//! policies' fingerprints, `RL.POLICY LIST`/`GET`) of one or more Redis or
//! Valkey nodes as Prometheus series on `GET /metrics`.
//!
//! Every scrape of `/metrics` reads every node at once (nothing is cached
//! between scrapes but the connections and the exporter's own counters), so
//! the values are the servers' at scrape time. The series are listed in
//! `exporter/metrics.txt` and in docs/operations.md.

pub mod config;
pub mod fingerprint;
pub mod info;
pub mod render;
pub mod scrape;

use std::sync::Arc;

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

pub use config::Config;
pub use scrape::Scraper;

/// The HTTP routes: `GET /metrics`, and `GET /` pointing to it.
pub fn router(scraper: Arc<Scraper>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let scraper = Arc::clone(&scraper);
                async move {
                    let body = render::encode(scraper.scrape().await);
                    ([(CONTENT_TYPE, render::CONTENT_TYPE)], body)
                }
            }),
        )
        .route(
            "/",
            get(|| async {
                "redis-ratelimit-exporter: Prometheus metrics at /metrics\n".into_response()
            }),
        )
}

/// Serves `config` until SIGINT or SIGTERM. Prints the address it listens on
/// (`listening on ADDR`) to stderr once bound.
pub async fn run(config: Config) -> Result<(), String> {
    let scraper = Arc::new(Scraper::new(&config)?);
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("--listen {}: {e}", config.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("--listen {}: {e}", config.listen))?;
    let nodes: Vec<&str> = scraper.nodes.iter().map(|n| n.label.as_str()).collect();
    eprintln!(
        "redis-ratelimit-exporter {}: listening on {addr}, nodes {}",
        env!("CARGO_PKG_VERSION"),
        nodes.join(", ")
    );
    axum::serve(listener, router(scraper))
        .with_graceful_shutdown(shutdown())
        .await
        .map_err(|e| format!("serving: {e}"))
}

async fn shutdown() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
