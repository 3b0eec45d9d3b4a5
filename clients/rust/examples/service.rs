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
//!
//! Observability: `GET /metrics` serves the kit's metrics (`ratelimit_*`;
//! OpenMetrics to a scraper whose `Accept` asks for it, else the Prometheus
//! text format), unless `RL_METRICS=0`. Deny events are shipped when
//! `RL_DENY_EVENTS_FILE` (a file of JSON lines) or `RL_DENY_EVENTS_BULK` (an
//! Elasticsearch URL, `http://host:port`) is set; `RL_DENY_EVENTS_FLUSH_MS`
//! (5000) and `RL_DENY_EVENTS_TIMEOUT_MS` (2000) change the flush interval
//! and the sink's timeout. `GET /deny-events` answers the shipper's counters.
//!
//! The protection loop, with `RL_POLICY` set to a policy's name (the policy
//! itself is set on the server: `RL.POLICY SET name ... ADAPT ... STAGES
//! ...`, with a `WINDOW`):
//! - `GET /api`: a core route under the policy (key `{prefix}loop:<user>`),
//!   whose rule names the breaker `downstream`; its backend fails (500)
//!   every `RL_FAIL_EVERY`-th request (0: never), and answers 503 without
//!   calling it while the breaker is open;
//! - `GET /extra`: a non-core route under the same policy, with a degrade
//!   handler (`200 cached`, header `x-degraded: stage-<n>` or `denied`);
//!   its own limiter, so `extra_redis_calls` counts its calls alone;
//! - `GET /protection`: this instance's view (JSON: `stage`, `scale`,
//!   `breaker`, the loop's counters, `extra_redis_calls`, `fail_every`);
//! - `GET /control?fail_every=n`: changes the failing fraction.
//!
//! `RL_REPORT_MS`, `RL_POLL_MS` and `RL_HOLD_MS` set the loop's timings
//! (the kit's defaults: 1000, 1000, 5000).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use redis_ratelimit_client::{
    BreakerConfig, BreakerError, Client, DegradeReason, DenyEvents, FallbackMode, Limiter, Metrics,
    Protection, RateLimitLayer, RequestParts, Rule, Sink,
};

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

/// The request's identity: `x-user`, else `user=` in the query, else the
/// peer address.
fn user(req: &RequestParts<'_>) -> Option<String> {
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
}

/// The client's address, for the deny events.
fn peer(req: &RequestParts<'_>) -> Option<String> {
    req.extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip().to_string())
}

/// The deny events' shipper the environment asks for, if any.
fn deny_events() -> Option<DenyEvents> {
    let sink = match (
        std::env::var("RL_DENY_EVENTS_FILE"),
        std::env::var("RL_DENY_EVENTS_BULK"),
    ) {
        (Ok(path), _) => Sink::file(path),
        (_, Ok(url)) => Sink::bulk(&url).unwrap_or_else(|e| {
            eprintln!("service: RL_DENY_EVENTS_BULK: {e}");
            std::process::exit(2);
        }),
        _ => return None,
    };
    let events = DenyEvents::builder(sink)
        .flush_interval(Duration::from_millis(env_u64(
            "RL_DENY_EVENTS_FLUSH_MS",
            5000,
        )))
        .timeout(Duration::from_millis(env_u64(
            "RL_DENY_EVENTS_TIMEOUT_MS",
            2000,
        )))
        .start()
        .unwrap_or_else(|e| {
            eprintln!("service: {e}");
            std::process::exit(2);
        });
    Some(events)
}

/// The routes of the protection loop (see the module's doc).
async fn protected_routes(
    protection: Protection,
    limiter: Limiter,
    observe: Observe,
    policy: String,
    prefix: &str,
) -> Router {
    let client = limiter.client().clone();
    let rule = || {
        Rule::policy(policy.as_str())
            .name(policy.as_str())
            .key_prefix(format!("{prefix}loop:"))
            .breaker("downstream")
    };
    let fail = |what: String| {
        eprintln!("service: {what}");
        std::process::exit(2);
    };
    let api_limiter = limiter.clone();
    let api_layer = RateLimitLayer::builder(limiter)
        .key(user)
        .client_ip(peer)
        .rule(rule())
        .protection(protection.clone())
        .build()
        .await
        .unwrap_or_else(|e| fail(e.to_string()));
    // Its own limiter: its counters are the non-core route's alone.
    // Given the loop too: its deny cache's answers count as the policy's
    // denials (RL.OUTCOME ... DENIED n).
    let extra_limiter = observe
        .on(Limiter::builder(client).protection(protection.clone()))
        .build();
    let extra_layer = RateLimitLayer::builder(extra_limiter.clone())
        .key(user)
        .client_ip(peer)
        .rule(rule())
        .protection(protection.clone())
        .core(false)
        .degrade(|_req, why| {
            let why = match why {
                DegradeReason::Stage(n) => format!("stage-{n}"),
                DegradeReason::Denied => "denied".to_string(),
            };
            axum::http::Response::builder()
                .header("x-degraded", why)
                .body(bytes::Bytes::from_static(b"cached\n"))
                .expect("a response")
        })
        .build()
        .await
        .unwrap_or_else(|e| fail(e.to_string()));

    let fail_every = Arc::new(AtomicU64::new(env_u64("RL_FAIL_EVERY", 0)));
    let served = Arc::new(AtomicU64::new(0));
    let downstream = protection
        .find_breaker("downstream")
        .expect("the rule names it");
    let api = {
        let (fail_every, served, downstream) = (fail_every.clone(), served.clone(), downstream);
        get(move || {
            let (fail_every, served, downstream) =
                (fail_every.clone(), served.clone(), downstream.clone());
            async move {
                // The backend: every n-th request fails.
                let backend = async {
                    let n = served.fetch_add(1, Ordering::Relaxed) + 1;
                    let every = fail_every.load(Ordering::Relaxed);
                    if every > 0 && n % every == 0 {
                        Err("backend failed")
                    } else {
                        Ok("api\n")
                    }
                };
                match downstream.call(backend).await {
                    Ok(body) => (StatusCode::OK, body),
                    Err(BreakerError::Failed(e)) => (StatusCode::INTERNAL_SERVER_ERROR, e),
                    Err(BreakerError::Open(_)) => {
                        (StatusCode::SERVICE_UNAVAILABLE, "downstream breaker open")
                    }
                }
            }
        })
    };
    let view = {
        let (protection, fail_every) = (protection.clone(), fail_every.clone());
        get(move || {
            let (protection, fail_every) = (protection.clone(), fail_every.clone());
            let extra = extra_limiter.stats().redis_calls;
            let cache_hits = api_limiter.stats().deny_cache_hits;
            let redis_denied = api_limiter.stats().redis_denied;
            let policy = policy.clone();
            async move {
                let s = protection.stats();
                let breaker = protection
                    .find_breaker("downstream")
                    .map_or("none", |b| b.state().as_str());
                format!(
                    "{{\"stage\":{},\"scale\":{},\"breaker\":\"{breaker}\",\"reports_sent\":{},\"reports_failed\":{},\"outcomes_sent\":{},\"outcomes_lost\":{},\"outcomes_pending\":{},\"reads_ok\":{},\"reads_failed\":{},\"denied_sent\":{},\"denied_lost\":{},\"denied_pending\":{},\"deny_cache_hits\":{cache_hits},\"redis_denied\":{redis_denied},\"extra_redis_calls\":{extra},\"fail_every\":{}}}",
                    protection.stage(&policy),
                    protection.scale(&policy),
                    s.reports_sent,
                    s.reports_failed,
                    s.outcomes_sent,
                    s.outcomes_lost,
                    s.outcomes_pending,
                    s.reads_ok,
                    s.reads_failed,
                    s.denied_sent,
                    s.denied_lost,
                    s.denied_pending,
                    fail_every.load(Ordering::Relaxed),
                )
            }
        })
    };
    let control = get(move |uri: axum::http::Uri| {
        let fail_every = fail_every.clone();
        async move {
            let n = uri
                .query()
                .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("fail_every=")))
                .and_then(|v| v.parse().ok());
            match n {
                Some(n) => {
                    fail_every.store(n, Ordering::Relaxed);
                    (StatusCode::OK, format!("fail_every={n}\n"))
                }
                None => (StatusCode::BAD_REQUEST, "fail_every=<n>\n".to_string()),
            }
        }
    });
    Router::new()
        .route("/api", api)
        .layer(api_layer)
        .merge(
            Router::new()
                .route("/extra", get(|| async { "extra\n" }))
                .layer(extra_layer),
        )
        .route("/protection", view)
        .route("/control", control)
}

/// The metrics and deny events every limiter of the service reports to.
#[derive(Clone)]
struct Observe {
    metrics: Option<Metrics>,
    events: Option<DenyEvents>,
}

impl Observe {
    fn on(
        &self,
        mut builder: redis_ratelimit_client::LimiterBuilder,
    ) -> redis_ratelimit_client::LimiterBuilder {
        if let Some(m) = &self.metrics {
            builder = builder.metrics(m.clone());
        }
        if let Some(e) = &self.events {
            builder = builder.deny_events(e.clone());
        }
        builder
    }
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
    // The protection loop, when the service watches a policy: the limiter's
    // local-only fallback follows the policy's scale.
    let policy = std::env::var("RL_POLICY").ok();
    let protection = policy.as_ref().map(|policy| {
        Protection::builder(client.clone())
            .policy(policy.as_str())
            .report_interval(Duration::from_millis(env_u64("RL_REPORT_MS", 1000)))
            .stage_poll(Duration::from_millis(env_u64("RL_POLL_MS", 1000)))
            .stage_hold(Duration::from_millis(env_u64("RL_HOLD_MS", 5000)))
            .start()
            .expect("RL_HOLD_MS must be longer than RL_POLL_MS")
    });
    let observe = Observe {
        metrics: (env_u64("RL_METRICS", 1) == 1).then(Metrics::new),
        events: deny_events(),
    };
    let mut limiter = observe.on(Limiter::builder(client));
    if let Some(protection) = &protection {
        limiter = limiter.protection(protection.clone());
    }
    let limiter = limiter
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
        .key(user)
        .client_ip(peer)
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

    let mut app = Router::new().route("/", hello).layer(layer);
    if let (Some(policy), Some(protection)) = (policy, protection) {
        app = app.merge(
            protected_routes(
                protection,
                limiter.clone(),
                observe.clone(),
                policy,
                &prefix,
            )
            .await,
        );
    }
    if let Some(metrics) = observe.metrics.clone() {
        app = app.route(
            "/metrics",
            get(move |headers: axum::http::HeaderMap| {
                let metrics = metrics.clone();
                async move {
                    let accept = headers
                        .get(axum::http::header::ACCEPT)
                        .and_then(|v| v.to_str().ok());
                    let (content_type, body) = metrics.render(accept).expect("its own registry");
                    ([(axum::http::header::CONTENT_TYPE, content_type)], body)
                }
            }),
        );
    }
    if let Some(events) = observe.events.clone() {
        app = app.route(
            "/deny-events",
            get(move || {
                let s = events.stats();
                async move {
                    format!(
                        "{{\"recorded\":{},\"shipped\":{},\"dropped\":{},\"sink_errors\":{},\"batches\":{},\"pending\":{}}}",
                        s.recorded, s.shipped, s.dropped, s.sink_errors, s.batches, s.pending
                    )
                }
            }),
        );
    }
    let app = app.route(
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
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .expect("serve");
    // What is left of the deny events, within the sink's timeout.
    if let Some(events) = observe.events {
        events.close().await;
    }
}
