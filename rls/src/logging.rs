//! Logs: `LOG_LEVEL` and `LOG_FORMAT`, printed to stderr as the reference
//! (logrus) prints them, so that log pipelines parsing the reference's
//! lines keep working:
//! - `text`: logfmt, `time="2026-12-03T07:48:04Z" level=warning msg="..." key=value`;
//! - `json`: one object per line, `{"@message":"...","@timestamp":"2026-12-03T07:48:04.156840642Z","level":"warning","key":"value"}`
//!   (the reference's `@timestamp` and `@message` keys; fields beside them,
//!   keys sorted as logrus sorts them).
//!
//! The level applies to this service and the Rust kit it calls; the
//! libraries under them (tonic, hyper, h2) log at `warn` at most, as they
//! are not the service's own events. `RUST_LOG`, when set, replaces that
//! filter with tracing's own directives (for debugging those libraries).

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// The crates whose events `LOG_LEVEL` governs.
const OWN_TARGETS: [&str; 2] = ["redis_ratelimit_rls", "redis_ratelimit_client"];

/// A logrus level name (any case) as a filter: trace, debug, info,
/// warn/warning, error, and fatal/panic (which tracing has not: error).
pub fn parse_level(name: &str) -> Option<LevelFilter> {
    Some(match name.to_ascii_lowercase().as_str() {
        "trace" => LevelFilter::TRACE,
        "debug" => LevelFilter::DEBUG,
        "info" => LevelFilter::INFO,
        "warn" | "warning" => LevelFilter::WARN,
        "error" | "fatal" | "panic" => LevelFilter::ERROR,
        _ => return None,
    })
}

/// Installs the global subscriber: `level` a logrus level name (settings
/// has refused any other; `warn` if one gets here), `format` `json` (any
/// case) or else text. A second call changes nothing.
pub fn init(level: &str, format: &str) {
    let level = parse_level(level).unwrap_or(LevelFilter::WARN);
    let json = format.eq_ignore_ascii_case("json");
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .event_format(Logrus { json });
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => {
            layer.with_filter(EnvFilter::new(directives)).boxed()
        }
        _ => layer.with_filter(targets(level)).boxed(),
    };
    // Err only when a subscriber is already installed (a test, a second
    // call): that one stays.
    let _ = tracing_subscriber::registry().with(filter).try_init();
}

/// `level` for this service and the kit, at most `warn` for the rest.
fn targets(level: LevelFilter) -> Targets {
    OWN_TARGETS.iter().fold(
        Targets::new().with_default(level.min(LevelFilter::WARN)),
        |t, target| t.with_target(*target, level),
    )
}

/// The event formatter printing logrus's text or JSON lines.
#[derive(Debug, Clone, Copy)]
pub struct Logrus {
    /// One JSON object per line, else logfmt.
    pub json: bool,
}

/// logrus's name of a level.
fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::TRACE => "trace",
        Level::DEBUG => "debug",
        Level::INFO => "info",
        Level::WARN => "warning",
        Level::ERROR => "error",
    }
}

/// An event's message and other fields.
#[derive(Default)]
struct Fields {
    message: String,
    fields: Map<String, Value>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.message = match value {
                Value::String(s) => s,
                other => other.to_string(),
            };
        } else {
            self.fields.insert(field.name().to_owned(), value);
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::String(value.to_string()));
    }
}

/// Now, in RFC 3339 (UTC): to the second for text, to the nanosecond for
/// JSON, as logrus's two formatters print it.
fn now(nanos: bool) -> String {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let t = prost_types::Timestamp {
        seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        nanos: if nanos {
            since.subsec_nanos() as i32
        } else {
            0
        },
    };
    crate::json::timestamp(&t)
}

/// A logfmt value: bare when made only of characters logrus leaves bare,
/// else quoted with escapes.
fn logfmt_value(out: &mut String, value: &Value) {
    let text = match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let bare = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._/@^+".contains(c));
    if bare {
        out.push_str(&text);
    } else {
        out.push_str(&Value::String(text).to_string());
    }
}

impl<S, N> FormatEvent<S, N> for Logrus
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut f = Fields::default();
        event.record(&mut f);
        let level = level_name(event.metadata().level());
        let line = if self.json {
            format_json(level, &now(true), f)
        } else {
            format_text(level, &now(false), f)
        };
        writer.write_str(&line)?;
        writer.write_char('\n')
    }
}

/// A field named as one of logrus's own keys is renamed `fields.<name>`,
/// as logrus renames it.
fn renamed(fields: Map<String, Value>, reserved: [&str; 3]) -> Map<String, Value> {
    fields
        .into_iter()
        .map(|(k, v)| {
            if reserved.contains(&k.as_str()) {
                (format!("fields.{k}"), v)
            } else {
                (k, v)
            }
        })
        .collect()
}

fn format_json(level: &str, time: &str, f: Fields) -> String {
    let mut o = renamed(f.fields, ["@timestamp", "level", "@message"]);
    o.insert("@timestamp".into(), Value::String(time.to_owned()));
    o.insert("level".into(), Value::String(level.to_owned()));
    o.insert("@message".into(), Value::String(f.message));
    Value::Object(o).to_string()
}

fn format_text(level: &str, time: &str, f: Fields) -> String {
    let mut out = format!("time=\"{time}\" level={level} msg=");
    logfmt_value(&mut out, &Value::String(f.message));
    for (k, v) in renamed(f.fields, ["time", "level", "msg"]) {
        out.push(' ');
        out.push_str(&k);
        out.push('=');
        logfmt_value(&mut out, &v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// The lines `emit` logs through the formatter and the filter `init`
    /// builds for `level`.
    fn capture(json: bool, level: &str, emit: impl FnOnce()) -> Vec<String> {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(move || writer.clone())
            .event_format(Logrus { json })
            .with_filter(targets(parse_level(level).unwrap()));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, emit);
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn level_names_as_logrus() {
        assert_eq!(parse_level("DEBUG"), Some(LevelFilter::DEBUG));
        assert_eq!(parse_level("Warning"), Some(LevelFilter::WARN));
        assert_eq!(parse_level("warn"), Some(LevelFilter::WARN));
        assert_eq!(parse_level("info"), Some(LevelFilter::INFO));
        assert_eq!(parse_level("trace"), Some(LevelFilter::TRACE));
        assert_eq!(parse_level("error"), Some(LevelFilter::ERROR));
        assert_eq!(parse_level("fatal"), Some(LevelFilter::ERROR));
        assert_eq!(parse_level("PANIC"), Some(LevelFilter::ERROR));
        assert_eq!(parse_level("loud"), None);
        assert_eq!(parse_level(""), None);
    }

    #[test]
    fn json_lines_have_the_reference_keys() {
        let lines = capture(true, "info", || {
            tracing::warn!(domain = "d", hits = 3u64, ok = false, "over the \"limit\"");
            tracing::info!(level = "x", "a field named level");
            tracing::debug!("filtered out");
        });
        assert_eq!(lines.len(), 2, "{lines:?}");
        let first: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(first["@message"], "over the \"limit\"");
        assert_eq!(first["level"], "warning");
        assert_eq!(first["domain"], "d");
        assert_eq!(first["hits"], 3);
        assert_eq!(first["ok"], false);
        let time = first["@timestamp"].as_str().unwrap();
        assert!(time.ends_with('Z') && time.len() >= 20, "{time}");
        assert_eq!(first.as_object().unwrap().len(), 6);
        let second: Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(second["level"], "info");
        assert_eq!(second["fields.level"], "x");
    }

    #[test]
    fn text_lines_are_logfmt() {
        let lines = capture(false, "debug", || {
            tracing::debug!(key = "a b", n = 7i64, path = "/srv/x.yaml", "loaded");
            tracing::error!(err = %io::Error::other("boom"), "redis: failed");
        });
        assert_eq!(lines.len(), 2, "{lines:?}");
        let (time, rest) = lines[0].split_once(' ').unwrap();
        assert!(
            time.starts_with("time=\"") && time.ends_with("Z\""),
            "{time}"
        );
        assert_eq!(
            rest,
            r#"level=debug msg=loaded key="a b" n=7 path=/srv/x.yaml"#
        );
        assert!(
            lines[1].ends_with(r#" level=error msg="redis: failed" err=boom"#),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn other_crates_log_at_warn_at_most() {
        let lines = capture(true, "debug", || {
            tracing::debug!(target: "h2::codec", "frame");
            tracing::warn!(target: "hyper", "trouble");
            tracing::debug!(target: "redis_ratelimit_client::fallback", "breaker");
        });
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("trouble") && lines[1].contains("breaker"));
        // And with LOG_LEVEL=error, their warnings go too.
        let lines = capture(true, "error", || {
            tracing::warn!(target: "hyper", "trouble");
        });
        assert!(lines.is_empty(), "{lines:?}");
    }
}
