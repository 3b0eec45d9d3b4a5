//! Logs: LOG_LEVEL and LOG_FORMAT (text or json). (Stub with the design's
//! signature; the HTTP helper writes the real module.)

/// Installs the global subscriber.
pub fn init(level: &str, format: &str) {
    let _ = (level, format);
}
