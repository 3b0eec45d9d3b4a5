//! The example service: an axum app with seed 000's limits in one RL.ALL, a
//! per-user limit (5/s, an exact sliding window) and a global one (15,000/s,
//! a token bucket whose share each instance takes locally first).
//!
//! ```sh
//! make run                      # a redis-server with the module on 6379
//! make example                  # this service on 127.0.0.1:3000
//! curl -i -H 'x-user: alice' http://127.0.0.1:3000/
//! ```
//!
//! Environment (all optional): `RL_URL` (redis://127.0.0.1:6379/),
//! `RL_CLUSTER` (comma-separated node URLs, instead of `RL_URL`),
//! `PORT` (3000), `RL_INSTANCES` (1), `RL_FALLBACK` (local, open, closed),
//! `RL_DEADLINE_MS` (100, the kit's default), `RL_USER_LIMIT` (5), `RL_USER_WINDOW_MS` (1000),
//! `RL_GLOBAL_LIMIT` (15000), `RL_PREFIX` (rl:), `RL_LOCAL` (1),
//! `RL_DENY_CACHE` (1), `RL_BREAKER_OPEN_MS` (1000), `RL_X_HEADERS` (0),
//! `RL_BARE` (0: 1 serves without the layer, for the benchmark).
//! The key is the `x-user` header, else the `user` query parameter, else
//! the peer address. `GET /stats` answers the kit's counters.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use redis_ratelimit_client::{BreakerConfig, Client, FallbackMode, Limiter, RateLimitLayer, Rule};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn stats(limiter: &Limiter) -> String {
    let pairs = limiter.stats().pairs();
    let fields: Vec<String> = pairs.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    format!(
        "{{{},\"breaker_open\":{}}}",
        fields.join(","),
        limiter.breaker_open()
    )
}

#[tokio::main]
async fn main() {
    let port = env_u64("PORT", 3000) as u16;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind");
    let hello = get(|| async { "hello\n" });

    if env_u64("RL_BARE", 0) == 1 {
        let app = Router::new().route("/", hello);
        eprintln!(
            "service: bare, listening on {}",
            listener.local_addr().unwrap()
        );
        axum::serve(listener, app).await.expect("serve");
        return;
    }

    let client = match std::env::var("RL_CLUSTER") {
        Ok(nodes) => {
            let nodes: Vec<&str> = nodes.split(',').collect();
            Client::cluster(&nodes).await
        }
        Err(_) => {
            let url = std::env::var("RL_URL").unwrap_or("redis://127.0.0.1:6379/".into());
            Client::standalone(&url).await
        }
    };
    let client = client.unwrap_or_else(|e| {
        eprintln!("service: {e}");
        std::process::exit(2);
    });
    let fallback = match std::env::var("RL_FALLBACK").as_deref() {
        Ok("open") => FallbackMode::FailOpen,
        Ok("closed") => FallbackMode::FailClosed,
        _ => FallbackMode::LocalOnly,
    };
    let limiter = Limiter::builder(client)
        .instances(env_u64("RL_INSTANCES", 1))
        .fallback(fallback)
        .deadline(Duration::from_millis(env_u64(
            "RL_DEADLINE_MS",
            redis_ratelimit_client::DEFAULT_DEADLINE.as_millis() as u64,
        )))
        .local_level(env_u64("RL_LOCAL", 1) == 1)
        .deny_cache(env_u64("RL_DENY_CACHE", 1) == 1)
        .breaker(BreakerConfig {
            failures: 5,
            open_for: Duration::from_millis(env_u64("RL_BREAKER_OPEN_MS", 1000)),
        })
        .build();
    // A hash tag puts both keys in one slot, as RL.ALL needs in a cluster.
    let prefix = std::env::var("RL_PREFIX").unwrap_or("rl:".into());
    let global = env_u64("RL_GLOBAL_LIMIT", 15_000);
    let layer = RateLimitLayer::builder(limiter.clone())
        .key(|req| {
            if let Some(user) = req.headers.get("x-user").and_then(|v| v.to_str().ok()) {
                return Some(user.to_string());
            }
            if let Some(q) = req.uri.query() {
                if let Some(user) = q.split('&').find_map(|kv| kv.strip_prefix("user=")) {
                    return Some(user.to_string());
                }
            }
            req.extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(addr)| addr.ip().to_string())
        })
        .rule(
            Rule::sliding(
                env_u64("RL_USER_LIMIT", 5),
                env_u64("RL_USER_WINDOW_MS", 1000),
            )
            .name("per-user")
            .key_prefix(format!("{{{prefix}api}}:user:")),
        )
        .rule(
            Rule::token_bucket(global, global, 1000)
                .name("global")
                .fixed_key(format!("{{{prefix}api}}:global"))
                .global(),
        )
        .x_ratelimit_headers(env_u64("RL_X_HEADERS", 0) == 1)
        .build()
        .await
        .unwrap_or_else(|e| {
            eprintln!("service: {e}");
            std::process::exit(2);
        });

    let app = Router::new().route("/", hello).layer(layer).route(
        "/stats",
        get(move || {
            let limiter = limiter.clone();
            async move { stats(&limiter) }
        }),
    );
    eprintln!("service: listening on {}", listener.local_addr().unwrap());
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .expect("serve");
}
