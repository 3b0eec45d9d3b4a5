//! redis-ratelimit-rls: start-up, serving, reloads and shutdown.
//!
//! The order: settings (a bad variable stops here, named), logs, Redis
//! (connected and checked for the module: a server without it is a clear
//! error, exit 1), the initial configuration (refused: exit 1 with
//! `path:line`), the watcher of the configuration folder (or, with
//! `CONFIG_TYPE=GRPC_XDS_SOTW`, the xDS client and its first answer), then
//! the gRPC (TLS with `GRPC_SERVER_USE_TLS`) and HTTP ports. SIGTERM or SIGINT: health fails, the gRPC server stops
//! accepting and finishes the calls in flight, then the process exits.
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use tonic_health::server::HealthReporter;

use redis_ratelimit_client::{BreakerConfig, Client, Error as KitError, RedisBreaker};
use redis_ratelimit_rls::config::runtime::{self, RuntimeDir};
use redis_ratelimit_rls::config::{Config, ConfigError};
use redis_ratelimit_rls::engine::{Engine, EngineOptions};
use redis_ratelimit_rls::http::{self, Health, HttpState};
use redis_ratelimit_rls::metrics::Metrics;
use redis_ratelimit_rls::proto::rate_limit_service_server::RateLimitServiceServer;
use redis_ratelimit_rls::service::{Grpc, RateLimiter};
use redis_ratelimit_rls::settings::{self, RedisTarget, Settings};
use redis_ratelimit_rls::xds::{self, ConfigType, XdsSettings};
use redis_ratelimit_rls::{logging, tls};
use tonic_health::ServingStatus;

const NAME: &str = "redis-ratelimit-rls";

fn main() -> ExitCode {
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{NAME}: {e}");
            return ExitCode::from(1);
        }
    };
    logging::init(&settings.log_level, &settings.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{NAME}: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            // A plain line: what stopped the start is read by a person.
            eprintln!("{NAME}: {message}");
            ExitCode::from(1)
        }
    }
}

async fn run(settings: Settings) -> Result<(), String> {
    let ignored: Vec<&str> = settings::IGNORED
        .iter()
        .copied()
        .filter(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
        .collect();
    if !ignored.is_empty() {
        tracing::warn!(
            "accepted and ignored (see README.md, \"Environment\"): {}",
            ignored.join(", ")
        );
    }

    // The variables of the other modules, checked before anything starts.
    let config_type = ConfigType::from_env()?;
    let xds_settings = match config_type {
        ConfigType::GrpcXdsSotw => Some(XdsSettings::from_env()?),
        ConfigType::File => None,
    };
    let server_tls = tls::server_tls_from_env()?;
    let client_san = tls::client_san_from_env()?;

    let client = connect(&settings).await?;
    redis_ratelimit_rls::engine::probe_each(&client, &settings.cache_key_prefix)
        .await
        .map_err(|e| format!("REDIS_URL={}: {e}", settings::mask(&settings.redis.url)))?;
    let metrics = Metrics::new();

    let dir = RuntimeDir {
        root: settings.runtime_root.clone(),
        subdirectory: settings.runtime_subdirectory.clone(),
        appdirectory: settings.runtime_appdirectory.clone(),
        ignore_dot_files: settings.runtime_ignore_dot_files,
    };
    let config = if xds_settings.is_some() {
        // The control plane's first answer replaces it.
        Config::default()
    } else {
        let initial = runtime::read(&dir)
            .and_then(|files| Config::load(&files, settings.merge_domain_config));
        match initial {
            Ok(c) => {
                metrics.config_load(true);
                tracing::info!(
                    folder = %dir.config_dir().display(),
                    domains = c.domains(),
                    "configuration loaded"
                );
                c
            }
            Err(e) => {
                metrics.config_load(false);
                return Err(format!("the configuration is refused: {e}"));
            }
        }
    };

    let health = Health::new(settings.healthy_with_at_least_one_config_loaded);
    if !config.is_empty() {
        health.set_config_loaded();
    }
    let (reporter, health_service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", grpc_status(health.is_ok()))
        .await;

    let breaker = RedisBreaker::new(BreakerConfig {
        failures: settings.breaker_failures,
        open_for: settings.breaker_open,
    });
    let engine = Engine::new(
        client,
        breaker,
        metrics.clone(),
        settings.local_cache_size_in_bytes,
        EngineOptions {
            cache_key_prefix: settings.cache_key_prefix.clone(),
            hash_tag: settings.hash_tag,
            near_limit_ratio: settings.near_limit_ratio,
            shadow_mode: settings.shadow_mode,
            quota_mode: settings.quota_mode,
            headers: settings.response_headers.clone(),
        },
    );
    let service = Arc::new(RateLimiter::new(engine, config));

    // Reloads: a refused configuration keeps the one in use.
    let (first_tx, mut first_rx) = tokio::sync::watch::channel(false);
    let reloader = Arc::new(Reloader {
        service: service.clone(),
        metrics: metrics.clone(),
        health: health.clone(),
        reporter: reporter.clone(),
        handle: tokio::runtime::Handle::current(),
        first: first_tx,
    });
    let mut _watcher = None;
    let mut xds_task = None;
    match xds_settings {
        None => {
            let reloader = reloader.clone();
            _watcher = Some(runtime::watch(
                dir.clone(),
                settings.merge_domain_config,
                settings.config_poll,
                move |result| reloader.apply(result, "reloaded"),
            ));
        }
        Some(xds_settings) => {
            let force_start = xds_settings.force_start_without_initial_config;
            let r = reloader.clone();
            xds_task = Some(xds::spawn(xds_settings, move |result| {
                r.apply(result, "received from the control plane")
            }));
            if !force_start {
                tracing::info!("waiting for the control plane's first configuration");
                let _ = first_rx.wait_for(|seen| *seen).await;
            }
        }
    }

    let grpc_listener = bind(
        &settings.grpc_host,
        settings.grpc_port,
        "GRPC_HOST/GRPC_PORT",
    )
    .await?;
    let http_listener = bind(&settings.host, settings.port, "HOST/PORT").await?;
    tracing::info!(
        grpc = %grpc_listener.local_addr().map_or_else(|_| "?".into(), |a| a.to_string()),
        http = %http_listener.local_addr().map_or_else(|_| "?".into(), |a| a.to_string()),
        "serving"
    );

    let http_task = tokio::spawn(http::serve(
        http_listener,
        HttpState {
            service: service.clone(),
            metrics: metrics.clone(),
            health: health.clone(),
        },
    ));
    let prometheus_task = match &settings.prometheus {
        Some(p) => {
            let listener = bind_addr(&p.addr, "PROMETHEUS_ADDR").await?;
            let (path, metrics) = (p.path.clone(), metrics.clone());
            Some(tokio::spawn(async move {
                http::serve_metrics(listener, metrics, &path).await
            }))
        }
        None => None,
    };

    let shutdown = {
        let health = health.clone();
        let reporter = reporter.clone();
        async move {
            wait_for_signal().await;
            tracing::warn!("shutting down: health fails, calls in flight finish");
            health.fail();
            reporter
                .set_service_status("", ServingStatus::NotServing)
                .await;
        }
    };
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = server_tls {
        builder = builder
            .tls_config(tls)
            .map_err(|e| format!("GRPC_SERVER_USE_TLS: {e}"))?;
    }
    let routes = tonic::service::Routes::new(health_service);
    let routes = match client_san {
        Some(san) => routes.add_service(RateLimitServiceServer::with_interceptor(
            Grpc(service.clone()),
            tls::client_san_interceptor(Some(san)),
        )),
        None => routes.add_service(RateLimitServiceServer::new(Grpc(service.clone()))),
    };
    let grpc = builder
        .add_routes(routes)
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(grpc_listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await;
    if let Some(t) = xds_task {
        t.abort();
    }
    http_task.abort();
    if let Some(t) = prometheus_task {
        t.abort();
    }
    grpc.map_err(|e| format!("the gRPC server failed: {e}"))
}

fn grpc_status(ok: bool) -> ServingStatus {
    if ok {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

/// Puts a new configuration in use (from the folder's watcher or the xDS
/// client), or logs and counts its refusal; either way the first one seen
/// releases a start that waits for the control plane.
struct Reloader {
    service: Arc<RateLimiter>,
    metrics: Metrics,
    health: Health,
    reporter: HealthReporter,
    handle: tokio::runtime::Handle,
    first: tokio::sync::watch::Sender<bool>,
}

impl Reloader {
    fn apply(&self, result: Result<Config, ConfigError>, how: &str) {
        match result {
            Ok(config) => {
                self.metrics.config_load(true);
                tracing::info!(domains = config.domains(), "configuration {how}");
                self.health.set_config(!config.is_empty());
                self.service.set_config(config);
                let reporter = self.reporter.clone();
                let status = grpc_status(self.health.is_ok());
                self.handle
                    .spawn(async move { reporter.set_service_status("", status).await });
            }
            Err(e) => {
                self.metrics.config_load(false);
                tracing::error!("configuration refused, the one in use stays: {e}");
            }
        }
        self.first.send_replace(true);
    }
}

/// Connects as REDIS_TYPE says, with REDIS_TIMEOUT as the deadline of each
/// call; the kit checks the module on every master.
async fn connect(settings: &Settings) -> Result<Client, String> {
    let redis = &settings.redis;
    let shown = format!("REDIS_URL={}", settings::mask(&redis.url));
    let connected = match &redis.target {
        RedisTarget::Single(url) => Client::standalone(url).await,
        RedisTarget::Sentinel { master, sentinels } => {
            let refs: Vec<&str> = sentinels.iter().map(String::as_str).collect();
            Client::sentinel(&refs, master).await
        }
        RedisTarget::Cluster(nodes) => {
            let refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
            Client::cluster(&refs).await
        }
    };
    match connected {
        Ok(client) => {
            tracing::info!(redis = %shown, kind = ?redis.kind, timeout = ?redis.timeout, "connected to Redis");
            Ok(client.with_deadline(redis.timeout))
        }
        Err(KitError::ModuleMissing(why)) if why.starts_with("MODULE LIST has no") => Err(format!(
            "{shown} has no ratelimit module: load it with --loadmodule /path/to/libredis_ratelimit.so \
             (or loadmodule in redis.conf) and restart the server"
        )),
        Err(KitError::ModuleMissing(why)) => Err(format!(
            "{shown} cannot run the ratelimit module's commands: {why}"
        )),
        Err(e) => Err(format!("cannot use Redis at {shown}: {e}")),
    }
}

async fn bind(host: &str, port: u16, what: &str) -> Result<tokio::net::TcpListener, String> {
    let addr = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("{what}: cannot listen on {addr}: {e}"))
}

/// PROMETHEUS_ADDR as Go's net.Listen takes it: `:9090` is every address.
async fn bind_addr(addr: &str, what: &str) -> Result<tokio::net::TcpListener, String> {
    let full = if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_string()
    };
    let parsed: Result<SocketAddr, _> = full.parse();
    let target = parsed.map_or(full.clone(), |a| a.to_string());
    tokio::net::TcpListener::bind(&target)
        .await
        .map_err(|e| format!("{what}: cannot listen on {addr}: {e}"))
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
