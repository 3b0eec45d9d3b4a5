//! [`DenyEvents`]: every denial as a JSON line, through a bounded ring
//! buffer that a background task flushes to a [`Sink`] every flush interval
//! or as soon as a batch's worth waits, whichever comes first.
//!
//! A request only appends to the buffer under a short lock (and wakes the
//! flusher when a batch is ready): it never waits for a sink. A full buffer
//! drops its oldest event; a batch the sink refuses, or does not take within
//! the timeout, is dropped whole and never retried. Both are counted.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use super::sink::Sink;
use crate::Error;

/// The buffer's capacity by default (the contract's `buffer_events`).
pub const DEFAULT_CAPACITY: usize = 10_000;
/// How often the buffer is flushed by default (`flush_interval_ms`).
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_millis(5000);
/// How many waiting events flush at once by default (`flush_events`): also
/// the largest batch a sink is given.
pub const DEFAULT_FLUSH_EVENTS: usize = 1000;
/// How long a sink may take with one batch by default (`sink_timeout_ms`).
pub const DEFAULT_SINK_TIMEOUT: Duration = Duration::from_millis(2000);

/// Whether the request was denied, or went on while a shadow rule would
/// have denied it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Denied.
    Denied,
    /// A shadow policy (or one outside its roll-out) would have denied; the
    /// request went on.
    ShadowDenied,
}

impl Outcome {
    /// `denied` or `shadow_denied`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Denied => "denied",
            Outcome::ShadowDenied => "shadow_denied",
        }
    }
}

/// One denial, with the contract's fields (`observability.deny_events`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DenyEvent {
    /// When it was denied.
    pub timestamp: SystemTime,
    /// The limiter key.
    pub key: String,
    /// The rule's name (a policy rule: the policy's name).
    pub rule: Arc<str>,
    /// The level that denied: `local`, `redis`, `deny_cache`, `fallback`.
    pub level: &'static str,
    /// Denied, or shadow-denied.
    pub outcome: Outcome,
    /// The decision's limit.
    pub limit: u64,
    /// The decision's remaining units.
    pub remaining: u64,
    /// The decision's `wait_ms`: -1 when the request can never pass.
    pub retry_after_ms: i64,
    /// The HTTP client's address, when the request came through the layer
    /// and it is known.
    pub client_ip: Option<String>,
    /// The HTTP request's `User-Agent`, when known.
    pub user_agent: Option<String>,
}

impl DenyEvent {
    /// The event as one JSON object, its fields in the contract's order,
    /// an unknown optional field left out (no line end).
    pub fn to_json(&self) -> String {
        let mut line = Vec::with_capacity(256);
        self.write_json(&mut line);
        String::from_utf8(line).expect("JSON of UTF-8 strings is UTF-8")
    }

    /// [`DenyEvent::to_json`] appended to `out` (how the sinks write a
    /// batch: one buffer, no string per field or per event).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"timestamp\":\"");
        write_rfc3339_millis(out, self.timestamp);
        out.extend_from_slice(b"\",\"key\":");
        json_string(out, &self.key);
        out.extend_from_slice(b",\"rule\":");
        json_string(out, &self.rule);
        out.extend_from_slice(b",\"level\":\"");
        out.extend_from_slice(self.level.as_bytes());
        out.extend_from_slice(b"\",\"outcome\":\"");
        out.extend_from_slice(self.outcome.as_str().as_bytes());
        out.extend_from_slice(b"\",\"limit\":");
        digits(out, self.limit, 1);
        out.extend_from_slice(b",\"remaining\":");
        digits(out, self.remaining, 1);
        out.extend_from_slice(b",\"retry_after_ms\":");
        if self.retry_after_ms < 0 {
            out.push(b'-');
        }
        digits(out, self.retry_after_ms.unsigned_abs(), 1);
        if let Some(ip) = &self.client_ip {
            out.extend_from_slice(b",\"client_ip\":");
            json_string(out, ip);
        }
        if let Some(ua) = &self.user_agent {
            out.extend_from_slice(b",\"user_agent\":");
            json_string(out, ua);
        }
        out.push(b'}');
    }
}

/// `s` as a JSON string, as serde_json writes it: copied as is when no
/// byte needs escaping (the usual key, rule, address and user agent).
fn json_string(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Writing into a Vec never fails.
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

/// `n` in decimal, zero-padded to at least `width` digits.
fn digits(out: &mut Vec<u8>, mut n: u64, width: usize) {
    let mut buf = [b'0'; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let start = i.min(buf.len() - width.min(buf.len()));
    out.extend_from_slice(&buf[start..]);
}

/// RFC 3339 in UTC with milliseconds: `2026-12-02T10:00:00.123Z`.
#[cfg(test)]
pub(crate) fn rfc3339_millis(t: SystemTime) -> String {
    let mut out = Vec::new();
    write_rfc3339_millis(&mut out, t);
    String::from_utf8(out).expect("ASCII")
}

/// [`rfc3339_millis`] appended to `out`.
fn write_rfc3339_millis(out: &mut Vec<u8>, t: SystemTime) {
    let ms = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let (days, ms_of_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Civil from days (H. Hinnant's algorithm), proleptic Gregorian.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let s = (ms_of_day / 1000) as u64;
    let part = |out: &mut Vec<u8>, n: i64, width: usize, then: u8| {
        digits(out, n.max(0) as u64, width);
        out.push(then);
    };
    part(out, year, 4, b'-');
    part(out, month, 2, b'-');
    part(out, day, 2, b'T');
    digits(out, s / 3600, 2);
    out.push(b':');
    digits(out, s / 60 % 60, 2);
    out.push(b':');
    digits(out, s % 60, 2);
    out.push(b'.');
    digits(out, (ms_of_day % 1000) as u64, 3);
    out.push(b'Z');
}

/// What an HTTP request adds to its denials.
#[derive(Clone, Debug, Default)]
pub(crate) struct Origin {
    pub(crate) client_ip: Option<String>,
    pub(crate) user_agent: Option<http::HeaderValue>,
}

/// The most bytes of a request's `client_ip` or `user_agent` an event
/// keeps: a full buffer of events with huge headers would hold gigabytes.
pub const MAX_ORIGIN_BYTES: usize = 512;

impl Origin {
    /// `s` cut to [`MAX_ORIGIN_BYTES`], at a character boundary.
    pub(crate) fn cut(s: &str) -> String {
        let mut end = s.len().min(MAX_ORIGIN_BYTES);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s[..end].to_string()
    }

    /// The `User-Agent`, cut (none if it is not visible ASCII).
    pub(crate) fn user_agent(&self) -> Option<String> {
        let ua = self.user_agent.as_ref()?.to_str().ok()?;
        Some(Origin::cut(ua))
    }
}

/// A reading of a shipper's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DenyEventsStats {
    /// Events recorded.
    pub recorded: u64,
    /// Events a sink accepted (`ratelimit_deny_events_shipped_total`).
    pub shipped: u64,
    /// Events lost: the oldest dropped from a full buffer, and every event
    /// of a batch its sink refused (`ratelimit_deny_events_dropped_total`).
    pub dropped: u64,
    /// Flushes a sink refused or failed
    /// (`ratelimit_deny_events_sink_errors_total`).
    pub sink_errors: u64,
    /// Batches a sink accepted.
    pub batches: u64,
    /// Events waiting in the buffer now.
    pub pending: u64,
}

/// What the request path and the flusher share.
pub(crate) struct Shipper {
    buffer: Mutex<VecDeque<DenyEvent>>,
    capacity: usize,
    flush_events: usize,
    flush_interval: Duration,
    timeout: Duration,
    sink: Sink,
    wake: Notify,
    recorded: AtomicU64,
    /// What the metrics read at each scrape: held by them too, so a
    /// counter never goes back when its shipper is dropped.
    totals: Arc<Totals>,
    batches: AtomicU64,
}

/// A shipper's counters that the metrics serve.
#[derive(Default)]
pub(crate) struct Totals {
    pub(crate) shipped: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) sink_errors: AtomicU64,
}

/// A batch on its way to the sink: counted as dropped, with a sink error,
/// unless it was settled; so a ship abandoned midway (a flush future
/// dropped, the flusher aborted by close()) loses no event from the
/// counters and counts none twice.
struct InFlight<'a> {
    shipper: &'a Shipper,
    events: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.events > 0 {
            self.shipper
                .totals
                .dropped
                .fetch_add(self.events, Ordering::Relaxed);
            self.shipper
                .totals
                .sink_errors
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Shipper {
    pub(crate) fn stats(&self) -> DenyEventsStats {
        let pending = self.lock().len() as u64;
        DenyEventsStats {
            recorded: self.recorded.load(Ordering::Relaxed),
            shipped: self.totals.shipped.load(Ordering::Relaxed),
            dropped: self.totals.dropped.load(Ordering::Relaxed),
            sink_errors: self.totals.sink_errors.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            pending,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<DenyEvent>> {
        self.buffer.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, event: DenyEvent) {
        self.recorded.fetch_add(1, Ordering::Relaxed);
        let (waiting, _oldest) = {
            let mut buffer = self.lock();
            let oldest = if buffer.len() >= self.capacity {
                self.totals.dropped.fetch_add(1, Ordering::Relaxed);
                buffer.pop_front()
            } else {
                None
            };
            buffer.push_back(event);
            (buffer.len(), oldest)
        };
        // (the oldest, if dropped, is freed here, after the lock is let go)
        if waiting == self.flush_events {
            self.wake.notify_one();
        }
    }

    /// The next batch: at most `flush_events` of the oldest events.
    fn take(&self) -> Vec<DenyEvent> {
        let mut buffer = self.lock();
        let n = buffer.len().min(self.flush_events);
        buffer.drain(..n).collect()
    }

    /// Ships one batch within the timeout, and counts what became of it.
    async fn ship(&self, batch: Vec<DenyEvent>) {
        let n = batch.len() as u64;
        let mut in_flight = InFlight {
            shipper: self,
            events: n,
        };
        let outcome = tokio::time::timeout(self.timeout, self.sink.send(batch)).await;
        in_flight.events = 0;
        let failure = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(format!("no answer within {:?}", self.timeout)),
        };
        match failure {
            None => {
                self.totals.shipped.fetch_add(n, Ordering::Relaxed);
                self.batches.fetch_add(1, Ordering::Relaxed);
            }
            Some(e) => {
                self.totals.dropped.fetch_add(n, Ordering::Relaxed);
                self.totals.sink_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(events = n, error = %e, "redis-ratelimit: deny events dropped, the sink failed");
            }
        }
    }

    /// Ships everything waiting now, batch after batch.
    async fn flush(&self) {
        loop {
            let batch = self.take();
            if batch.is_empty() {
                return;
            }
            self.ship(batch).await;
        }
    }

    /// Drops what waits, counted (what a close could not ship in time).
    fn abandon(&self) {
        let n = {
            let mut buffer = self.lock();
            let n = buffer.len();
            buffer.clear();
            n
        };
        self.totals.dropped.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Builds [`DenyEvents`]; every setting has the contract's default.
pub struct DenyEventsBuilder {
    sink: Sink,
    capacity: usize,
    flush_interval: Duration,
    /// `None`: the default, at most the capacity.
    flush_events: Option<usize>,
    timeout: Duration,
    background: bool,
}

impl DenyEventsBuilder {
    /// The most events the buffer holds (10,000 by default); when full, the
    /// oldest is dropped and counted.
    pub fn capacity(mut self, events: usize) -> Self {
        self.capacity = events;
        self
    }
    /// How often the buffer is flushed (5 s by default).
    pub fn flush_interval(mut self, every: Duration) -> Self {
        self.flush_interval = every;
        self
    }
    /// How many waiting events start a flush at once, and the largest batch
    /// a sink is given (1,000 by default, or the capacity if smaller); at
    /// most the capacity.
    pub fn flush_events(mut self, events: usize) -> Self {
        self.flush_events = Some(events);
        self
    }
    /// How long the sink may take with one batch (2 s by default); a batch
    /// not taken by then is dropped and counted, never retried.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
    /// Whether a background task flushes the buffer (yes by default). Without
    /// one, the application flushes with [`DenyEvents::flush`].
    pub fn background(mut self, on: bool) -> Self {
        self.background = on;
        self
    }

    #[cfg(test)]
    pub(crate) fn settings(&self) -> (usize, Duration, usize, Duration) {
        (
            self.capacity,
            self.flush_interval,
            self.flush_events.unwrap_or(DEFAULT_FLUSH_EVENTS),
            self.timeout,
        )
    }

    /// The shipper, its flusher started on the current tokio runtime (when
    /// [`DenyEventsBuilder::background`] is on). A setting out of range is
    /// an error naming it.
    pub fn start(self) -> Result<DenyEvents, Error> {
        let bad = |arg: &str, reason: &str| Error::BadArgument {
            rule: "DenyEvents".to_string(),
            arg: arg.to_string(),
            reason: reason.to_string(),
        };
        if self.capacity == 0 {
            return Err(bad("capacity", "must be at least 1 event"));
        }
        let flush_events = self
            .flush_events
            .unwrap_or(DEFAULT_FLUSH_EVENTS.min(self.capacity));
        if flush_events == 0 {
            return Err(bad("flush_events", "must be at least 1 event"));
        }
        if flush_events > self.capacity {
            return Err(bad(
                "flush_events",
                "must not be above capacity (the buffer would never hold a batch)",
            ));
        }
        if self.flush_interval.is_zero() {
            return Err(bad("flush_interval", "must be longer than zero"));
        }
        if self.timeout.is_zero() {
            return Err(bad("timeout", "must be longer than zero"));
        }
        let shipper = Arc::new(Shipper {
            buffer: Mutex::new(VecDeque::with_capacity(self.capacity.min(DEFAULT_CAPACITY))),
            capacity: self.capacity,
            flush_events,
            flush_interval: self.flush_interval,
            timeout: self.timeout,
            sink: self.sink,
            wake: Notify::new(),
            recorded: AtomicU64::new(0),
            totals: Arc::default(),
            batches: AtomicU64::new(0),
        });
        let (stop, stopped) = watch::channel(false);
        let handle = if self.background {
            let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
                bad(
                    "background",
                    "the flusher needs a tokio runtime: start() inside one, or \
                     background(false) and flush() by hand",
                )
            })?;
            Some(runtime.spawn(flusher(shipper.clone(), stopped)))
        } else {
            None
        };
        Ok(DenyEvents {
            shipper: shipper.clone(),
            task: Arc::new(Task {
                stop,
                handle: Mutex::new(handle),
            }),
        })
    }
}

/// Stops the flusher when the last [`DenyEvents`] clone goes.
struct Task {
    stop: watch::Sender<bool>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Task {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.lock().unwrap_or_else(|e| e.into_inner()).take() {
            handle.abort();
        }
    }
}

/// Ships denials as JSON lines to a [`Sink`], in batches, through a
/// bounded ring buffer (contract `observability.deny_events`). Give it to
/// [`crate::LimiterBuilder::deny_events`]: every denial of the limiter, at
/// every level, is recorded, and through the layer with the request's
/// client address and `User-Agent`. Cheap to clone: clones share the
/// buffer. Needs a tokio runtime; call [`DenyEvents::close`] at shutdown to
/// ship what is left.
#[derive(Clone)]
pub struct DenyEvents {
    shipper: Arc<Shipper>,
    task: Arc<Task>,
}

impl std::fmt::Debug for DenyEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenyEvents")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl DenyEvents {
    /// A builder shipping to `sink`, with the contract's defaults: a buffer
    /// of 10,000 events, flushed every 5 s or as soon as 1,000 wait, each
    /// batch within 2 s.
    pub fn builder(sink: Sink) -> DenyEventsBuilder {
        DenyEventsBuilder {
            sink,
            capacity: DEFAULT_CAPACITY,
            flush_interval: DEFAULT_FLUSH_INTERVAL,
            flush_events: None,
            timeout: DEFAULT_SINK_TIMEOUT,
            background: true,
        }
    }

    /// Appends `event` to the buffer (dropping the oldest when it is full)
    /// and wakes the flusher when a batch is ready. Never waits for the sink.
    pub fn record(&self, event: DenyEvent) {
        self.shipper.push(event);
    }

    /// A reading of the counters.
    pub fn stats(&self) -> DenyEventsStats {
        self.shipper.stats()
    }

    /// Ships everything waiting now, in batches, each within the timeout.
    pub async fn flush(&self) {
        self.shipper.flush().await;
    }

    /// Stops the flusher and ships what is left, within one timeout in all;
    /// what it could not ship by then is dropped and counted. Other clones
    /// can still record, and flush by hand.
    pub async fn close(&self) {
        let shipper = &self.shipper;
        let deadline = tokio::time::Instant::now() + shipper.timeout;
        let _ = self.task.stop.send(true);
        let handle = self
            .task
            .handle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut handle) = handle {
            if tokio::time::timeout_at(deadline, &mut handle)
                .await
                .is_err()
            {
                // The batch it was shipping is counted dropped as the
                // aborted task drops it.
                handle.abort();
                let _ = handle.await;
            }
        }
        if tokio::time::timeout_at(deadline, shipper.flush())
            .await
            .is_err()
        {
            shipper.abandon();
        }
    }

    pub(crate) fn totals(&self) -> Arc<Totals> {
        self.shipper.totals.clone()
    }
}

async fn flusher(shipper: Arc<Shipper>, mut stopped: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(shipper.flush_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => shipper.flush().await,
            _ = shipper.wake.notified() => {
                // A batch is ready: ship full batches while they wait; the
                // rest waits for the interval.
                while shipper.lock().len() >= shipper.flush_events {
                    let batch = shipper.take();
                    shipper.ship(batch).await;
                }
            }
            _ = stopped.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc_with_milliseconds() {
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(rfc3339_millis(at(0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339_millis(at(951_782_400_123)),
            "2000-02-29T00:00:00.123Z"
        );
        // The contract's example instant.
        assert_eq!(
            rfc3339_millis(at(1_796_205_600_123)),
            "2026-12-02T10:00:00.123Z"
        );
        assert_eq!(
            rfc3339_millis(at(4_102_444_799_999)),
            "2099-12-31T23:59:59.999Z"
        );
    }

    #[test]
    fn an_event_is_one_json_object_with_its_fields_in_order_and_unknown_ones_left_out() {
        let mut e = DenyEvent {
            timestamp: UNIX_EPOCH + Duration::from_millis(1_796_205_600_123),
            key: "rl:user:\"bob\"".into(),
            rule: Arc::from("per-user"),
            level: "redis",
            outcome: Outcome::Denied,
            limit: 5,
            remaining: 0,
            retry_after_ms: -1,
            client_ip: None,
            user_agent: Some("curl/8".into()),
        };
        assert_eq!(
            e.to_json(),
            r#"{"timestamp":"2026-12-02T10:00:00.123Z","key":"rl:user:\"bob\"","rule":"per-user","level":"redis","outcome":"denied","limit":5,"remaining":0,"retry_after_ms":-1,"user_agent":"curl/8"}"#
        );
        e.client_ip = Some("10.0.0.1".into());
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["client_ip"], "10.0.0.1");
        // Every string as serde_json writes it; the integers' extremes.
        for key in [
            "",
            "plain",
            "tab\there",
            "nl\n\u{1}\u{7f}",
            "é \\ \"q\"",
            "\u{1F600}",
        ] {
            e.key = key.to_string();
            e.limit = u64::MAX;
            e.remaining = 0;
            e.retry_after_ms = i64::MIN;
            let line = e.to_json();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(v["key"], key);
            assert!(line.contains(&format!("\"key\":{}", serde_json::Value::from(key))));
            assert_eq!(v["limit"], u64::MAX);
            assert_eq!(v["retry_after_ms"], i64::MIN);
        }
    }
}
