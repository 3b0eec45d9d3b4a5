//! The HTTP port (`PORT`, 8080): what the reference serves there, with
//! the same status codes and bodies, plus its debug port's `/rlconfig` and
//! the metrics:
//! - `/healthcheck`: `200 OK` while healthy, else `500` with no body;
//! - `/json`: a RateLimitRequest in proto3 JSON, answered with the
//!   RateLimitResponse: `200` (OK), `429` (OVER_LIMIT), `500` (UNKNOWN);
//!   `400 Bad Request` for a body that is not a request and for a call
//!   the service refuses (the reference answers both so), the cause in
//!   the log;
//! - `/metrics`: Prometheus text 0.0.4, or OpenMetrics when asked;
//! - `/rlconfig`: the configuration in use, one line per limit.
//!
//! Like the reference's router, every path answers any method.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;

use crate::json;
use crate::metrics::Metrics;
use crate::proto::rate_limit_response::Code;
use crate::service::RateLimiter;

const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

/// What the HTTP handlers share.
#[derive(Clone)]
pub struct HttpState {
    pub service: Arc<RateLimiter>,
    pub metrics: Metrics,
    pub health: Health,
}

/// The service's health, as the reference's health checker keeps it:
/// failing while no configuration is loaded (when
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` asks for one) and once
/// shutdown has begun (SIGTERM), so load balancers stop sending before the
/// process goes. Cheap to clone; every clone is the same switch.
#[derive(Clone, Debug)]
pub struct Health {
    inner: Arc<HealthInner>,
}

#[derive(Debug)]
struct HealthInner {
    require_config: bool,
    config_loaded: AtomicBool,
    failed: AtomicBool,
}

impl Health {
    /// `require_config`: HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED.
    pub fn new(require_config: bool) -> Health {
        Health {
            inner: Arc::new(HealthInner {
                require_config,
                config_loaded: AtomicBool::new(false),
                failed: AtomicBool::new(false),
            }),
        }
    }

    /// A configuration with at least one domain has been loaded.
    pub fn set_config_loaded(&self) {
        self.set_config(true);
    }

    /// A configuration was put in use, with domains or none: as the
    /// reference's SetConfig, the latest one decides (an empty one after a
    /// full one fails the check again).
    pub fn set_config(&self, has_domains: bool) {
        self.inner
            .config_loaded
            .store(has_domains, Ordering::Release);
    }

    /// Fail from now on (shutdown has begun), until [`Health::ok`].
    pub fn fail(&self) {
        self.inner.failed.store(true, Ordering::Release);
    }

    /// Undo [`Health::fail`]; a missing required configuration still fails.
    pub fn ok(&self) {
        self.inner.failed.store(false, Ordering::Release);
    }

    /// Whether `/healthcheck` answers 200.
    pub fn is_ok(&self) -> bool {
        !self.inner.failed.load(Ordering::Acquire)
            && (!self.inner.require_config || self.inner.config_loaded.load(Ordering::Acquire))
    }
}

/// The HTTP port's routes.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthcheck", any(healthcheck))
        .route("/json", any(json_handler))
        .route("/metrics", any(metrics_handler))
        .route("/rlconfig", any(rlconfig))
        .fallback(not_found)
        .with_state(state)
}

/// Serves the HTTP port on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, state: HttpState) -> io::Result<()> {
    axum::serve(listener, router(state)).await
}

/// The routes of the metrics port of `USE_PROMETHEUS` (`PROMETHEUS_ADDR`):
/// the scrape at `path` (`PROMETHEUS_PATH`, `/metrics` by default).
pub fn metrics_router(metrics: Metrics, path: &str) -> Router {
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    Router::new()
        .route(&path, any(scrape))
        .fallback(not_found)
        .with_state(metrics)
}

/// Serves [`metrics_router`] on `listener` until the task is dropped.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    path: &str,
) -> io::Result<()> {
    axum::serve(listener, metrics_router(metrics, path)).await
}

fn text(status: StatusCode, body: impl Into<Body>) -> Response {
    (status, [(header::CONTENT_TYPE, TEXT_PLAIN)], body.into()).into_response()
}

/// Go's `http.Error`, as the reference answers a refused `/json`.
fn http_error(status: StatusCode) -> Response {
    let reason = status.canonical_reason().unwrap_or("Error");
    (
        status,
        [
            (header::CONTENT_TYPE, TEXT_PLAIN),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        format!("{reason}\n"),
    )
        .into_response()
}

async fn not_found() -> Response {
    text(StatusCode::NOT_FOUND, "404 page not found\n")
}

async fn healthcheck(State(state): State<HttpState>) -> Response {
    if state.health.is_ok() {
        text(StatusCode::OK, "OK")
    } else {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}

/// The status `/json` answers a response with: 429 over the limit, 500
/// when the service left the overall code unknown, else 200.
pub fn json_status(resp: &crate::proto::RateLimitResponse) -> StatusCode {
    match Code::try_from(resp.overall_code) {
        Ok(Code::OverLimit) => StatusCode::TOO_MANY_REQUESTS,
        Ok(Code::Unknown) => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::OK,
    }
}

async fn json_handler(State(state): State<HttpState>, body: Bytes) -> Response {
    let req = match json::parse_request(&body) {
        Ok(req) => req,
        Err(e) => {
            tracing::warn!("error: /json: {e}");
            return http_error(StatusCode::BAD_REQUEST);
        }
    };
    let resp = match state.service.should_rate_limit(req).await {
        Ok(resp) => resp,
        Err(status) => {
            tracing::warn!(code = ?status.code(), "error: /json: {}", status.message());
            return http_error(StatusCode::BAD_REQUEST);
        }
    };
    (
        json_status(&resp),
        [(header::CONTENT_TYPE, "application/json")],
        json::write_response(&resp),
    )
        .into_response()
}

fn render(metrics: &Metrics, headers: &HeaderMap) -> Response {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v: &HeaderValue| v.to_str().ok());
    let (content_type, body) = metrics.render(accept);
    (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn metrics_handler(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    render(&state.metrics, &headers)
}

async fn scrape(State(metrics): State<Metrics>, headers: HeaderMap) -> Response {
    render(&metrics, &headers)
}

async fn rlconfig(State(state): State<HttpState>) -> Response {
    text(StatusCode::OK, state.service.config_dump())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::RateLimitResponse;

    #[test]
    fn health_follows_config_and_shutdown() {
        let h = Health::new(true);
        assert!(!h.is_ok(), "no configuration yet");
        h.set_config_loaded();
        assert!(h.is_ok());
        let clone = h.clone();
        clone.fail();
        assert!(!h.is_ok(), "a clone is the same switch");
        h.ok();
        assert!(clone.is_ok());

        // The latest configuration decides, as the reference's SetConfig.
        h.set_config(false);
        assert!(!h.is_ok(), "an empty configuration after a full one");
        h.set_config(true);
        assert!(h.is_ok());

        let h = Health::new(false);
        assert!(h.is_ok(), "no configuration required");
        h.set_config(false);
        assert!(h.is_ok(), "an empty configuration, none required");
        h.fail();
        assert!(!h.is_ok());
    }

    #[test]
    fn json_status_codes_as_the_reference() {
        let with = |overall_code| RateLimitResponse {
            overall_code,
            ..Default::default()
        };
        assert_eq!(json_status(&with(1)), StatusCode::OK);
        assert_eq!(json_status(&with(2)), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(json_status(&with(0)), StatusCode::INTERNAL_SERVER_ERROR);
        // A code the .proto does not name: the reference's `else` is 200.
        assert_eq!(json_status(&with(7)), StatusCode::OK);
    }

    /// One HTTP/1.1 exchange on a new connection: the raw reply.
    async fn exchange(
        addr: std::net::SocketAddr,
        method: &str,
        path: &str,
        accept: &str,
        body: &str,
    ) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    /// A reply's status code, lower-cased headers and body.
    fn parse_reply(reply: &str) -> (u16, String, String) {
        let (head, body) = reply.split_once("\r\n\r\n").unwrap();
        let status = head[9..12].parse().unwrap();
        (status, head.to_ascii_lowercase(), body.to_owned())
    }

    /// The module: `RL_MODULE` (`make test` sets it), else the workspace's
    /// release build (as the end-to-end tests find it).
    fn module() -> std::path::PathBuf {
        match std::env::var_os("RL_MODULE").filter(|m| !m.is_empty()) {
            Some(m) => m.into(),
            None => std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/release/libredis_ratelimit.so"),
        }
    }

    /// A redis-server with the module, of its own on a free loopback port,
    /// stopped on drop.
    struct RedisServer {
        child: std::process::Child,
        url: String,
    }

    impl RedisServer {
        fn start() -> RedisServer {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let module = module();
            assert!(
                module.exists(),
                "no module at {} (set RL_MODULE or build it)",
                module.display()
            );
            let child = std::process::Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .arg("--loadmodule")
                .arg(&module)
                .args(["--save", "", "--appendonly", "no"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("redis-server on PATH");
            RedisServer {
                child,
                url: format!("redis://127.0.0.1:{port}"),
            }
        }
    }

    impl Drop for RedisServer {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// The HTTP port over a real socket, with a real RateLimiter on a real
    /// Redis. The requests here never reach Redis (an unmatched
    /// descriptor, invalid requests): the engine's decisions are the
    /// end-to-end tests' (rls/tests).
    #[tokio::test]
    async fn the_http_port_answers_as_the_reference() {
        use crate::config::Config;
        use crate::engine::{Engine, EngineOptions};
        use redis_ratelimit_client::{BreakerConfig, Client, RedisBreaker};
        use std::time::{Duration, Instant};

        let redis = RedisServer::start();
        let started = Instant::now();
        let client = loop {
            match Client::standalone(&redis.url).await {
                Ok(c) => break c,
                Err(e) if started.elapsed() < Duration::from_secs(10) => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("redis-server did not start: {e}"),
            }
        };
        let yaml = "domain: dom\ndescriptors:\n  - key: k1\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
        let config = Config::load(&[("config/a.yaml".into(), yaml.to_owned())], false).unwrap();
        let metrics = Metrics::new();
        let engine = Engine::new(
            client,
            RedisBreaker::new(BreakerConfig {
                failures: 5,
                open_for: Duration::from_secs(1),
            }),
            metrics.clone(),
            0,
            EngineOptions {
                cache_key_prefix: String::new(),
                hash_tag: crate::settings::HashTag::None,
                near_limit_ratio: 0.8,
                shadow_mode: false,
                quota_mode: false,
                headers: None,
            },
        );
        let health = Health::new(true);
        let state = HttpState {
            service: Arc::new(RateLimiter::new(engine, config)),
            metrics,
            health: health.clone(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, state));
        let call = |method: &'static str, path: &'static str, body: &'static str| async move {
            parse_reply(&exchange(addr, method, path, "*/*", body).await)
        };

        // Health: 500 without a body until a configuration is loaded.
        let (status, _, body) = call("GET", "/healthcheck", "").await;
        assert_eq!((status, body.as_str()), (500, ""));
        health.set_config_loaded();
        let (status, head, body) = call("GET", "/healthcheck", "").await;
        assert_eq!((status, body.as_str()), (200, "OK"));
        assert!(
            head.contains("content-type: text/plain; charset=utf-8"),
            "{head}"
        );

        // /json: an unmatched descriptor is OK without a limit.
        let (status, head, body) = call(
            "POST",
            "/json",
            r#"{"domain":"dom","descriptors":[{"entries":[{"key":"zz","value":"v"}]}]}"#,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert_eq!(body, r#"{"overallCode":"OK","statuses":[{"code":"OK"}]}"#);
        // A body that is not a request, and a request the service refuses:
        // 400 and Go's http.Error body, as the reference.
        for bad in ["{bad", "", r#"{"domian":"dom"}"#, r#"{"domain":""}"#] {
            let (status, head, body) = call("POST", "/json", bad).await;
            assert_eq!((status, body.as_str()), (400, "Bad Request\n"), "{bad}");
            assert!(
                head.contains("content-type: text/plain; charset=utf-8"),
                "{head}"
            );
        }

        let (status, _, body) = call("GET", "/rlconfig", "").await;
        assert_eq!(status, 200);
        assert!(
            body.contains("dom.k1: unit=MINUTE requests_per_unit=1"),
            "{body}"
        );
        let (status, head, body) = call("GET", "/metrics", "").await;
        assert_eq!(status, 200);
        assert!(
            head.contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
        assert!(
            body.contains("ratelimit_service_config_load_success"),
            "{body}"
        );
        let (status, _, body) = call("GET", "/nope", "").await;
        assert_eq!((status, body.as_str()), (404, "404 page not found\n"));

        // Shutdown begins: health fails at once.
        health.fail();
        let (status, _, _) = call("GET", "/healthcheck", "").await;
        assert_eq!(status, 500);
        server.abort();
    }

    /// The metrics port of USE_PROMETHEUS over a real socket: the scrape at
    /// its path, in the format asked for, and 404 elsewhere.
    #[tokio::test]
    async fn the_metrics_port_serves_its_path() {
        let metrics = Metrics::new();
        metrics.descriptor("d", "d.k_v").total_hits(2);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_metrics(listener, metrics, "stats"));
        let get =
            |path: &'static str, accept: &'static str| exchange(addr, "GET", path, accept, "");
        let reply = get("/stats", "*/*").await;
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
        assert!(
            reply.contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            "{reply}"
        );
        assert!(
            reply.contains(r#"ratelimit_service_rate_limit_total_hits{domain="d",key1="k_v"} 2"#),
            "{reply}"
        );
        let reply = get("/stats", "application/openmetrics-text; version=1.0.0").await;
        assert!(reply.contains("application/openmetrics-text"), "{reply}");
        assert!(reply.contains("# EOF"), "{reply}");
        let reply = get("/metrics", "*/*").await;
        assert!(reply.starts_with("HTTP/1.1 404 Not Found\r\n"), "{reply}");
        assert!(reply.ends_with("404 page not found\n"), "{reply}");
        server.abort();
    }
}
