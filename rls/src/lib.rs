//! redis-ratelimit-rls: Envoy's rate limit service (RLS v3) on the
//! redis-ratelimit module. See README.md.
pub mod config;
