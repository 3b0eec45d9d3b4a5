//! Prometheus metrics. (Stub with the design's signatures; the HTTP helper
//! writes the real module.)

/// The service's metrics; cheap to clone.
#[derive(Clone, Default)]
pub struct Metrics {}

/// One descriptor's counters (domain and stats key).
#[derive(Clone, Default)]
pub struct DescriptorStats {}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {}
    }
    pub fn descriptor(&self, domain: &str, stats_key: &str) -> DescriptorStats {
        let _ = (domain, stats_key);
        DescriptorStats {}
    }
    pub fn redis_call(&self, seconds: f64, ok: bool) {
        let _ = (seconds, ok);
    }
    pub fn redis_error(&self) {}
    pub fn breaker_open(&self, open: bool) {
        let _ = open;
    }
    pub fn config_load(&self, ok: bool) {
        let _ = ok;
    }
    pub fn call(&self, result: &'static str) {
        let _ = result;
    }
    pub fn render(&self, accept: Option<&str>) -> (&'static str, String) {
        let _ = accept;
        ("text/plain; version=0.0.4", String::new())
    }
}

impl DescriptorStats {
    pub fn total_hits(&self, n: u64) {
        let _ = n;
    }
    pub fn over_limit(&self, n: u64) {
        let _ = n;
    }
    pub fn near_limit(&self, n: u64) {
        let _ = n;
    }
    pub fn within_limit(&self, n: u64) {
        let _ = n;
    }
    pub fn shadow_mode(&self, n: u64) {
        let _ = n;
    }
    pub fn over_limit_with_local_cache(&self, n: u64) {
        let _ = n;
    }
}
