//! [`Sink`]: where the deny events' batches go. Each send runs on the
//! flusher, within its timeout; a blocking write or callback runs on
//! tokio's blocking pool, so a slow one never holds a runtime thread.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;

use super::events::DenyEvent;
use crate::Error;

/// The `_bulk` sink's index by default (the contract's `bulk_index`).
pub const DEFAULT_BULK_INDEX: &str = "ratelimit-deny";

/// The largest `_bulk` reply read (a reply to 1,000 events is well under a
/// megabyte): past it, the batch is refused without holding the rest.
pub const MAX_BULK_REPLY: usize = 16 << 20;

type Callback = dyn Fn(&[DenyEvent]) -> Result<(), String> + Send + Sync;

/// Where [`crate::DenyEvents`] ships its batches.
#[derive(Clone)]
pub struct Sink {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    File(PathBuf, Blocking),
    Bulk(Arc<Bulk>),
    Callback(Arc<Callback>, Blocking),
}

/// A sink that runs on tokio's blocking pool: at most one batch in it at a
/// time. A batch that times out leaves its thread running (a blocking call
/// cannot be cancelled); the batches that come while it still runs are
/// refused at once instead of taking one more thread each.
#[derive(Clone, Default)]
struct Blocking {
    busy: Arc<AtomicBool>,
}

/// Clears [`Blocking::busy`] when the blocking call ends, or panics, or is
/// never run.
struct Idle(Arc<AtomicBool>);

impl Drop for Idle {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Blocking {
    async fn run<F>(&self, what: &str, f: F) -> Result<(), String>
    where
        F: FnOnce() -> Result<(), String> + Send + 'static,
    {
        if self.busy.swap(true, Ordering::AcqRel) {
            return Err(format!(
                "{what}: the previous batch is still running (it timed out)"
            ));
        }
        let idle = Idle(self.busy.clone());
        tokio::task::spawn_blocking(move || {
            let _idle = idle;
            f()
        })
        .await
        .map_err(|e| format!("{what}: {e}"))?
    }
}

struct Bulk {
    url: http::Uri,
    index: String,
    client: HttpClient<HttpConnector, Full<Bytes>>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::File(path, _) => write!(f, "Sink::file({path:?})"),
            Kind::Bulk(b) => write!(f, "Sink::bulk({}, index {})", b.url, b.index),
            Kind::Callback(..) => write!(f, "Sink::callback"),
        }
    }
}

impl Sink {
    /// Appends each batch to the file at `path` as JSON lines (created if
    /// missing).
    pub fn file(path: impl Into<PathBuf>) -> Sink {
        Sink {
            kind: Kind::File(path.into(), Blocking::default()),
        }
    }

    /// Posts each batch to `<url>/_bulk` in Elasticsearch's format (per
    /// event an action line `{"index":{"_index":"ratelimit-deny"}}`, then
    /// the event), `Content-Type: application/x-ndjson`; accepted on a 2xx
    /// whose JSON body has `"errors": false`. `url` is `http://host:port`
    /// with an optional path (no TLS: ship through a local agent or proxy,
    /// or use [`Sink::callback`]). A bad URL is an error naming `url`.
    pub fn bulk(url: &str) -> Result<Sink, Error> {
        Sink::bulk_into(url, DEFAULT_BULK_INDEX)
    }

    /// [`Sink::bulk`] into the index `index`.
    pub fn bulk_into(url: &str, index: &str) -> Result<Sink, Error> {
        let bad = |arg: &str, reason: String| Error::BadArgument {
            rule: "Sink::bulk".to_string(),
            arg: arg.to_string(),
            reason,
        };
        let base = url.trim_end_matches('/');
        let uri: http::Uri = format!("{base}/_bulk")
            .parse()
            .map_err(|e| bad("url", format!("{url:?} is not a URL: {e}")))?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err(bad(
                "url",
                format!("{url:?} must be http://host[:port][/path] (no TLS)"),
            ));
        }
        if base.contains(['?', '#']) || uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(bad(
                "url",
                format!(
                    "{url:?} must be http://host[:port][/path]: no query, fragment or \
                     credentials (they would not be sent)"
                ),
            ));
        }
        if index.is_empty() || index.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
            return Err(bad(
                "index",
                format!("{index:?} must be a non-empty index name"),
            ));
        }
        Ok(Sink {
            kind: Kind::Bulk(Arc::new(Bulk {
                url: uri,
                index: index.to_string(),
                client: HttpClient::builder(TokioExecutor::new()).build_http(),
            })),
        })
    }

    /// Gives each batch to `f`, on the flusher (never on a request); an
    /// `Err` counts as a failed flush.
    pub fn callback<F>(f: F) -> Sink
    where
        F: Fn(&[DenyEvent]) -> Result<(), String> + Send + Sync + 'static,
    {
        Sink {
            kind: Kind::Callback(Arc::new(f), Blocking::default()),
        }
    }

    /// Sends one batch; the caller bounds it with the timeout.
    pub(crate) async fn send(&self, batch: Vec<DenyEvent>) -> Result<(), String> {
        match &self.kind {
            Kind::File(path, blocking) => {
                let path = path.clone();
                let mut lines = Vec::with_capacity(batch.len() * 256);
                for e in &batch {
                    e.write_json(&mut lines);
                    lines.push(b'\n');
                }
                blocking
                    .run("file sink", move || {
                        let mut file = std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(&path)
                            .map_err(|e| format!("{}: {e}", path.display()))?;
                        // One write of the whole batch: lines of two batches never interleave.
                        file.write_all(&lines)
                            .map_err(|e| format!("{}: {e}", path.display()))
                    })
                    .await
            }
            Kind::Callback(f, blocking) => {
                let f = f.clone();
                blocking.run("callback sink", move || f(&batch)).await
            }
            Kind::Bulk(bulk) => {
                let Bulk { url, index, client } = &**bulk;
                let action = format!("{{\"index\":{{\"_index\":\"{index}\"}}}}\n");
                let mut body = Vec::with_capacity(batch.len() * (action.len() + 256));
                for e in &batch {
                    body.extend_from_slice(action.as_bytes());
                    e.write_json(&mut body);
                    body.push(b'\n');
                }
                let request = http::Request::post(url.clone())
                    .header(http::header::CONTENT_TYPE, "application/x-ndjson")
                    .body(Full::new(Bytes::from(body)))
                    .map_err(|e| e.to_string())?;
                let response = client
                    .request(request)
                    .await
                    .map_err(|e| format!("POST {url}: {e}"))?;
                let status = response.status();
                let body = http_body_util::Limited::new(response.into_body(), MAX_BULK_REPLY)
                    .collect()
                    .await
                    .map_err(|e| format!("POST {url}: status {status}, reading the reply: {e}"))?
                    .to_bytes();
                if !status.is_success() {
                    return Err(format!("POST {url}: status {status}"));
                }
                let reply: serde_json::Value = serde_json::from_slice(&body)
                    .map_err(|e| format!("POST {url}: the reply is not JSON: {e}"))?;
                match reply.get("errors") {
                    Some(serde_json::Value::Bool(false)) => Ok(()),
                    _ => Err(format!("POST {url}: the reply has errors")),
                }
            }
        }
    }
}
