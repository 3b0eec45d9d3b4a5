//! The RLS v3 service: what gRPC's ShouldRateLimit and HTTP's /json call.
use crate::proto;

/// Decides RateLimitRequests. (First commit: the signatures; the engine
/// follows.)
pub struct RateLimiter {}

impl RateLimiter {
    /// Decides one request.
    pub async fn should_rate_limit(
        &self,
        req: proto::RateLimitRequest,
    ) -> Result<proto::RateLimitResponse, tonic::Status> {
        let _ = req;
        Err(tonic::Status::unavailable("redis-ratelimit-rls: not ready"))
    }

    /// The configuration in use, one line per limit (/rlconfig).
    pub fn config_dump(&self) -> String {
        String::new()
    }
}
