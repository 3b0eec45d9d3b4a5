//! The RLS v3 service: what gRPC's ShouldRateLimit and HTTP's /json call.
//!
//! The configuration in use is held in an [`ArcSwap`]: a reload swaps it
//! whole, and each call decides with the one it loaded when it began, so no
//! call sees half a configuration or waits for a reload.
use std::sync::Arc;

use arc_swap::ArcSwap;
use tonic::{Request, Response, Status};

use crate::config::Config;
use crate::engine::Engine;
use crate::proto;
use crate::proto::rate_limit_service_server::RateLimitService;

/// Decides RateLimitRequests with the configuration in use.
pub struct RateLimiter {
    engine: Engine,
    config: ArcSwap<Config>,
}

impl RateLimiter {
    pub fn new(engine: Engine, config: Config) -> RateLimiter {
        RateLimiter {
            engine,
            config: ArcSwap::from_pointee(config),
        }
    }

    /// Decides one request.
    pub async fn should_rate_limit(
        &self,
        req: proto::RateLimitRequest,
    ) -> Result<proto::RateLimitResponse, tonic::Status> {
        let config = self.config.load_full();
        self.engine.decide(&config, &req).await
    }

    /// Puts `config` in use for the calls that begin from now on.
    pub fn set_config(&self, config: Config) {
        self.config.store(Arc::new(config));
    }

    /// The configuration in use.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// The configuration in use, one line per limit (/rlconfig).
    pub fn config_dump(&self) -> String {
        self.config.load().dump()
    }
}

/// The gRPC face of a shared [`RateLimiter`].
#[derive(Clone)]
pub struct Grpc(pub Arc<RateLimiter>);

#[tonic::async_trait]
impl RateLimitService for Grpc {
    async fn should_rate_limit(
        &self,
        request: Request<proto::RateLimitRequest>,
    ) -> Result<Response<proto::RateLimitResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.0.should_rate_limit(request.into_inner()).await;
        self.0
            .engine
            .metrics()
            .grpc_request("ShouldRateLimit", started.elapsed().as_secs_f64());
        result.map(Response::new)
    }
}
