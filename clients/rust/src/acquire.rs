//! The connections of blocking calls (`BLOCK timeout_ms`): each call
//! checks out a connection of its own, made from the client's connection
//! settings, so that a request the server holds back stalls nothing else.
//! The shared connection is multiplexed: one blocked reply on it would hold
//! every command queued behind it.
//!
//! A connection goes back to the pool only after a reply. One whose call
//! timed out, failed or was cancelled (its future dropped) is dropped, which
//! closes it: the server forgets a client that disconnects while blocked,
//! and consumes nothing for it.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, Value};
use redis_ratelimit_core::MAX_PARAM;

use crate::Error;

/// The most idle connections kept per server; more acquires at once open
/// more connections, closed after their reply.
const IDLE_PER_SERVER: usize = 8;

/// How long opening an acquire connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What the `BLOCK` argument and the deadline of a blocking call are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    /// `BLOCK`'s argument: `None` sends no `BLOCK` (a zero timeout), 0 waits
    /// without a limit.
    pub(crate) timeout_ms: Option<u64>,
    /// The client's deadline: the timeout plus max(1 s, 10 %); `None` for a
    /// wait without a limit.
    pub(crate) deadline: Option<Duration>,
}

impl Block {
    /// A wait of at most `timeout`, rounded up to whole milliseconds.
    /// `Duration::ZERO` does not wait; a timeout above 2^40 ms (about 35
    /// years, `Duration::MAX` included) waits without a limit (`BLOCK 0`).
    pub(crate) fn new(timeout: Duration) -> Block {
        let ms = timeout.as_nanos().div_ceil(1_000_000);
        if ms == 0 {
            return Block {
                timeout_ms: None,
                deadline: Some(Duration::from_secs(1)),
            };
        }
        if ms > u128::from(MAX_PARAM) {
            return Block {
                timeout_ms: Some(0),
                deadline: None,
            };
        }
        let ms = ms as u64;
        let margin = (ms / 10).max(1000);
        Block {
            timeout_ms: Some(ms),
            deadline: Some(Duration::from_millis(ms + margin)),
        }
    }

    pub(crate) fn args(&self, cmd: &mut Cmd) {
        if let Some(ms) = self.timeout_ms {
            cmd.arg("BLOCK").arg(ms);
        }
    }
}

/// Where acquire connections go.
enum Target {
    /// One server (standalone, or Sentinel's current master).
    Single(redis::Client),
    /// A cluster: the key's master, from `CLUSTER SLOTS`, with these
    /// settings (password, TLS, protocol) and its address.
    Cluster(ConnectionInfo),
}

/// `CLUSTER SLOTS`: the master of each slot range.
type SlotTable = Vec<(u16, u16, String, u16)>;

pub(crate) struct AcquirePool {
    target: RwLock<Target>,
    slots: Mutex<Option<SlotTable>>,
    idle: Mutex<HashMap<String, Vec<MultiplexedConnection>>>,
}

/// A connection checked out for one call.
pub(crate) struct Checkout {
    server: String,
    conn: MultiplexedConnection,
}

impl AcquirePool {
    pub(crate) fn single(client: redis::Client) -> AcquirePool {
        AcquirePool::new(Target::Single(client))
    }

    pub(crate) fn cluster(info: ConnectionInfo) -> AcquirePool {
        AcquirePool::new(Target::Cluster(info))
    }

    fn new(target: Target) -> AcquirePool {
        AcquirePool {
            target: RwLock::new(target),
            slots: Mutex::new(None),
            idle: Mutex::new(HashMap::new()),
        }
    }

    /// Sentinel named another master: new calls go there, idle
    /// connections to the old one are closed.
    pub(crate) fn retarget(&self, client: redis::Client) {
        *self.target.write().unwrap_or_else(|e| e.into_inner()) = Target::Single(client);
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    pub(crate) fn needs_slots(&self) -> bool {
        matches!(
            *self.target.read().unwrap_or_else(|e| e.into_inner()),
            Target::Cluster(_)
        ) && self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    /// Takes a `CLUSTER SLOTS` reply as the slot table.
    pub(crate) fn set_slots(&self, reply: &Value) -> Result<(), Error> {
        let Value::Array(ranges) = reply else {
            return Err(Error::Protocol(format!("CLUSTER SLOTS: {reply:?}")));
        };
        let int = |v: &Value| match v {
            Value::Int(i) => u16::try_from(*i).ok(),
            _ => None,
        };
        let mut table = Vec::new();
        for range in ranges {
            let Value::Array(f) = range else { continue };
            let (Some(lo), Some(hi), Some(Value::Array(master))) =
                (f.first().and_then(int), f.get(1).and_then(int), f.get(2))
            else {
                continue;
            };
            let host = match master.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                _ => continue,
            };
            let Some(port) = master.get(1).and_then(int) else {
                continue;
            };
            table.push((lo, hi, host, port));
        }
        *self.slots.lock().unwrap_or_else(|e| e.into_inner()) = Some(table);
        Ok(())
    }

    /// Forgets the slot table (a call failed: the slots may have moved).
    fn forget_slots(&self) {
        *self.slots.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn client_for(&self, key: &str) -> Result<redis::Client, Error> {
        match &*self.target.read().unwrap_or_else(|e| e.into_inner()) {
            Target::Single(client) => Ok(client.clone()),
            Target::Cluster(info) => {
                let slot = key_slot(key.as_bytes());
                let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
                let (host, port) = slots
                    .as_ref()
                    .and_then(|t| {
                        t.iter()
                            .find(|(lo, hi, _, _)| (*lo..=*hi).contains(&slot))
                            .map(|(_, _, h, p)| (h.clone(), *p))
                    })
                    .ok_or_else(|| Error::Connection(format!("no master known for slot {slot}")))?;
                let addr = match info.addr() {
                    ConnectionAddr::TcpTls {
                        insecure,
                        tls_params,
                        ..
                    } => ConnectionAddr::TcpTls {
                        host,
                        port,
                        insecure: *insecure,
                        tls_params: tls_params.clone(),
                    },
                    _ => ConnectionAddr::Tcp(host, port),
                };
                redis::Client::open(info.clone().set_addr(addr)).map_err(Error::from)
            }
        }
    }

    /// An idle connection to `key`'s server, or a new one.
    pub(crate) async fn checkout(&self, key: &str) -> Result<Checkout, Error> {
        let client = self.client_for(key)?;
        let server = client.get_connection_info().addr().to_string();
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&server)
            .and_then(Vec::pop);
        let conn = match idle {
            Some(conn) => conn,
            None => {
                // The deadline is the call's own (tokio::time::timeout), not
                // the connection's: a blocked reply may come much later.
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(None);
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map_err(|e| {
                        self.forget_slots();
                        Error::from(e)
                    })?
            }
        };
        Ok(Checkout { server, conn })
    }

    /// Sends `cmd` on a connection of its own, within `deadline` (none:
    /// without a limit). Never retried.
    pub(crate) async fn send(
        &self,
        cmd: Cmd,
        key: &str,
        deadline: Option<Duration>,
    ) -> Result<Value, Error> {
        let Checkout { server, mut conn } = self.checkout(key).await?;
        let call = cmd.query_async::<Value>(&mut conn);
        let result = match deadline {
            Some(d) => match tokio::time::timeout(d, call).await {
                Ok(r) => r,
                Err(_) => return Err(Error::Timeout(d)),
            },
            None => call.await,
        };
        match result {
            Ok(Value::ServerError(e)) => {
                self.forget_slots();
                Err(crate::error::server_error(&e))
            }
            Ok(v) => {
                let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
                let list = idle.entry(server).or_default();
                if list.len() < IDLE_PER_SERVER {
                    list.push(conn);
                }
                Ok(v)
            }
            Err(e) => {
                self.forget_slots();
                Err(match Error::from(e) {
                    Error::Timeout(_) => Error::Timeout(deadline.unwrap_or_default()),
                    other => other,
                })
            }
        }
    }
}

/// The cluster slot of a key: CRC16 (XMODEM) of its hash tag, or of the
/// whole key, modulo 16384.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&len| len > 0)
                .map(|len| &rest[..len])
        })
        .unwrap_or(key);
    crate::grants::crc16(tagged) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_of_a_key_is_redis_own() {
        // CLUSTER KEYSLOT's answers.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"123456789"), 0x31c3, "CRC16/XMODEM's check value");
    }

    #[test]
    fn the_deadline_is_the_timeout_plus_a_second_or_a_tenth() {
        let b = Block::new(Duration::from_millis(500));
        assert_eq!(b.timeout_ms, Some(500));
        assert_eq!(b.deadline, Some(Duration::from_millis(1500)));
        let b = Block::new(Duration::from_secs(60));
        assert_eq!(b.deadline, Some(Duration::from_secs(66)));
        let b = Block::new(Duration::from_micros(1));
        assert_eq!(b.timeout_ms, Some(1), "rounded up, never BLOCK 0");
        let b = Block::new(Duration::ZERO);
        assert_eq!(b.timeout_ms, None, "no wait: no BLOCK");
        let b = Block::new(Duration::MAX);
        assert_eq!((b.timeout_ms, b.deadline), (Some(0), None), "BLOCK 0");
    }
}
