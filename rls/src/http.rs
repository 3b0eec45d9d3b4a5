//! The HTTP port: /healthcheck, /json, /metrics, /rlconfig. (Stub with the
//! design's signatures; the HTTP helper writes the real module.)
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::metrics::Metrics;
use crate::service::RateLimiter;

/// What the HTTP handlers share.
#[derive(Clone)]
pub struct HttpState {
    pub service: Arc<RateLimiter>,
    pub metrics: Metrics,
    pub health: Health,
}

/// The service's health: failing while no configuration is loaded (when
/// required) and once shutdown has begun.
#[derive(Clone)]
pub struct Health {
    inner: Arc<HealthInner>,
}

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
        self.inner.config_loaded.store(true, Ordering::Release);
    }

    /// Shutdown has begun: fail from now on.
    pub fn fail(&self) {
        self.inner.failed.store(true, Ordering::Release);
    }

    pub fn is_ok(&self) -> bool {
        !self.inner.failed.load(Ordering::Acquire)
            && (!self.inner.require_config || self.inner.config_loaded.load(Ordering::Acquire))
    }
}

/// Serves the HTTP port on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, state: HttpState) -> io::Result<()> {
    let _ = state;
    axum::serve(listener, axum::Router::new()).await
}
