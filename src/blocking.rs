//! Blocked requests (`BLOCK timeout_ms`): who waits on which key, in the
//! order they came, and the timers that wake them.
//!
//! A blocked request is a client blocked on its keys (`crate::ffi`'s
//! `block_on_keys`): the server retries it whenever one of its keys is
//! signalled ready. This registry decides who may go:
//!
//! - Every single-key request that blocks (a limiter command, `RL.HIT`)
//!   joins its key's queue. Only the queue's head may be admitted; a request
//!   behind it, or a new call that does not block, takes nothing that the
//!   queue waits for, so a flood of other calls cannot starve a waiter. The
//!   server retries its blocked clients in the order they blocked, so when
//!   the head is admitted the next one is tried in the same pass.
//! - An `RL.ALL` request that blocks joins no queue (the order promise is
//!   per key): it is admitted when all its limiters admit at once, with no
//!   queue ahead of it on any of its keys.
//! - Each waiter has at most one timer: when the limiter will admit it (the
//!   head's `wait_ms`, `RL.ALL`'s longest), or its deadline, whichever comes
//!   first. A timer signals the waiter's key, and the retry decides.
//! - A waiter the server lets go of (served, timed out, disconnected,
//!   redirected by a slot move) is forgotten with its timer; if it was a
//!   queue's head, the queue is kicked so the next one is decided at once.
//!
//! Everything here runs on the server's main thread.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::ffi::{self, BlockedClient, TimerId};
use crate::limiter::{Micros, Request};
use crate::stats::Counter;

/// Most requests blocked at once (`ratelimit.max-blocked`); above it a call
/// answers at once, as without `BLOCK`.
pub static MAX_BLOCKED: AtomicU64 = AtomicU64::new(10_000);

/// Requests that blocked, in total.
pub static TOTAL: Counter = Counter::new();
/// Blocked requests admitted after waiting.
pub static ADMITTED: Counter = Counter::new();
/// Blocked requests whose timeout passed first (answered the denial).
pub static TIMED_OUT: Counter = Counter::new();

/// Requests blocked now (a copy of the registry's count, read without the
/// lock on every call).
static NOW: AtomicUsize = AtomicUsize::new(0);

/// A key: its database and name.
type KeyName = (i32, Box<[u8]>);

/// One request in a key's queue.
#[derive(Clone, Copy, Debug)]
struct Queued {
    waiter: u64,
    /// What it asks for (`UPTO n` takes what fits once its first unit does).
    request: Request,
    deadline: Option<Micros>,
}

/// A blocked request.
struct Waiter {
    db: i32,
    /// Its keys; the first is the one its queue (if any) and timers name.
    keys: Vec<Box<[u8]>>,
    /// In its first key's queue (a single-key request).
    queued: bool,
    /// At the head of that queue: the one whose limiter decides.
    head: bool,
    deadline: Option<Micros>,
    /// Its pending timer and when it fires.
    timer: Option<(TimerId, Micros)>,
    /// The server's handle of the blocked client.
    client: Option<BlockedClient>,
}

#[derive(Default)]
struct Registry {
    queues: HashMap<KeyName, VecDeque<Queued>>,
    waiters: HashMap<u64, Waiter>,
    /// Pending kicks: timer token to key.
    kicks: HashMap<u64, KeyName>,
    next: u64,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn registry() -> MutexGuard<'static, Option<Registry>> {
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut guard = registry();
    f(guard.get_or_insert_with(Registry::default))
}

/// Timer tokens of kicks have this bit; a waiter's timer token is its id.
const KICK: u64 = 1 << 63;

/// Whether any request is blocked now (one load: the hot path asks it).
#[inline(always)]
pub fn any() -> bool {
    NOW.load(Ordering::Relaxed) != 0
}

/// Requests blocked now.
pub fn now_blocked() -> u64 {
    NOW.load(Ordering::Relaxed) as u64
}

/// Whether one more request may block (`ratelimit.max-blocked`).
pub fn room() -> bool {
    (NOW.load(Ordering::Relaxed) as u64) < MAX_BLOCKED.load(Ordering::Relaxed)
}

/// Where a call stands in the queue of a key.
#[derive(Debug, PartialEq, Eq)]
pub enum Place {
    /// No queue: the limiter decides alone.
    Free,
    /// The call is the head of the queue: the limiter decides.
    Head,
    /// The call is in the queue, behind others: it waits.
    Queued,
    /// The call is not in the queue, which holds these requests (request and
    /// deadline, in order): it takes nothing they wait for.
    Behind(Vec<(Request, Option<Micros>)>),
}

/// Where the call of `waiter` (`None`: a new call) stands on key `key` of
/// database `db`.
pub fn place(db: i32, key: &[u8], waiter: Option<u64>) -> Place {
    if !any() {
        return Place::Free;
    }
    with(|r| {
        let Some(queue) = r.queues.get(&(db, Box::from(key))) else {
            return Place::Free;
        };
        if let Some(me) = waiter {
            if queue.front().is_some_and(|q| q.waiter == me) {
                return Place::Head;
            }
            if queue.iter().any(|q| q.waiter == me) {
                return Place::Queued;
            }
        }
        if queue.is_empty() {
            return Place::Free;
        }
        Place::Behind(queue.iter().map(|q| (q.request, q.deadline)).collect())
    })
}

/// Whether `waiter` waits behind the head of its key's queue, its deadline
/// still ahead: a retry of it has nothing to decide (O(1), before anything
/// else: the server retries every client blocked on a key when it is
/// signalled).
pub fn waits_behind(waiter: u64, now: Micros) -> bool {
    with(|r| {
        r.waiters.get(&waiter).is_some_and(|w| {
            w.queued && !w.head && w.deadline.is_none_or(|deadline| now < deadline)
        })
    })
}

/// Whether the deadline of `waiter` has passed at `now`.
pub fn expired(waiter: u64, now: Micros) -> bool {
    with(|r| {
        r.waiters
            .get(&waiter)
            .and_then(|w| w.deadline)
            .is_some_and(|deadline| now >= deadline)
    })
}

/// Registers a request that blocks now on `keys` of database `db`: in the
/// queue of its first key with its request when `queued`, with a deadline
/// `timeout_ms` after `now` (0: none), and a retry at `retry_at` (unless
/// others are ahead of it in the queue). Returns
/// its waiter number, for the server to hand back.
pub fn enqueue(
    db: i32,
    keys: Vec<Box<[u8]>>,
    queued: Option<Request>,
    timeout_ms: u64,
    retry_at: Option<Micros>,
    now: Micros,
) -> u64 {
    let deadline = (timeout_ms > 0).then(|| now.saturating_add_ms(timeout_ms));
    let mut retry_at = retry_at;
    let id = with(|r| {
        r.next += 1;
        let id = r.next;
        let mut head = false;
        if let Some(request) = queued {
            let queue = r.queues.entry((db, keys[0].clone())).or_default();
            head = queue.is_empty();
            if !head {
                // Behind others: tried when it is the head, in the pass that
                // admits the one ahead of it (or the kick after it left).
                retry_at = None;
            }
            queue.push_back(Queued {
                waiter: id,
                request,
                deadline,
            });
        }
        r.waiters.insert(
            id,
            Waiter {
                db,
                keys,
                queued: queued.is_some(),
                head,
                deadline,
                timer: None,
                client: None,
            },
        );
        NOW.store(r.waiters.len(), Ordering::Relaxed);
        id
    });
    TOTAL.bump();
    keep(id, retry_at, now);
    id
}

/// The server's handle of the blocked client of `waiter`.
pub fn set_client(waiter: u64, client: BlockedClient) {
    with(|r| {
        if let Some(w) = r.waiters.get_mut(&waiter) {
            w.client = Some(client);
        }
    });
}

/// Whether this node still serves every key of `waiter` (in a cluster, a
/// slot may have moved away while it waited: the server redirects it
/// then, and until it does, the waiter must not re-create a key that moved).
pub fn served_here(waiter: u64) -> bool {
    let Some((db, keys)) = with(|r| r.waiters.get(&waiter).map(|w| (w.db, w.keys.clone()))) else {
        return true;
    };
    keys.iter().all(|key| ffi::key_served_here(db, key))
}

/// Keeps `waiter` blocked, to be retried at `retry_at` (or on a signal of
/// its keys) and answered at its deadline at the latest: its one timer
/// fires at the earlier of the two.
pub fn keep(waiter: u64, retry_at: Option<Micros>, now: Micros) {
    let stop = with(|r| {
        let w = r.waiters.get_mut(&waiter)?;
        let at = match (retry_at, w.deadline) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        if w.timer.is_some_and(|(_, pending)| pending <= at) {
            // It fires first; the retry then arms the next.
            return None;
        }
        let ms = at.as_us().saturating_sub(now.as_us()).div_ceil(1000);
        let id = ffi::create_timer(ms, waiter, on_timer);
        w.timer.replace((id, at)).map(|(old, _)| old)
    });
    if let Some(old) = stop {
        ffi::stop_timer(old);
    }
}

/// A blocked request was answered (`admitted`, or its timeout passed): it
/// leaves its queue now. Answered in a pass of the server over its key
/// (`in_pass`), the next one is tried in the same pass; otherwise (the
/// server's own timeout) the key is kicked.
pub fn done(waiter: u64, admitted: bool, in_pass: bool) {
    if admitted {
        ADMITTED.bump();
    } else {
        TIMED_OUT.bump();
    }
    remove(waiter, !in_pass);
}

/// The server let go of a blocked request (its private data is freed):
/// whatever is left of it goes (a client that disconnected or was
/// redirected), and if it was a queue's head the next one is decided.
pub fn forget(waiter: u64) {
    remove(waiter, true);
}

/// The requests ahead of `waiter` in the queue of key `key` (request and
/// deadline, in order).
pub fn ahead_of(db: i32, key: &[u8], waiter: u64) -> Vec<(Request, Option<Micros>)> {
    with(|r| {
        r.queues
            .get(&(db, Box::from(key)))
            .map(|queue| {
                queue
                    .iter()
                    .take_while(|q| q.waiter != waiter)
                    .map(|q| (q.request, q.deadline))
                    .collect()
            })
            .unwrap_or_default()
    })
}

fn remove(waiter: u64, may_kick: bool) {
    let (timer, kick) = with(|r| {
        let Some(w) = r.waiters.remove(&waiter) else {
            return (None, None);
        };
        NOW.store(r.waiters.len(), Ordering::Relaxed);
        let mut kick = None;
        if w.queued {
            let name: KeyName = (w.db, w.keys[0].clone());
            if let Some(queue) = r.queues.get_mut(&name) {
                let was_head = queue.front().is_some_and(|q| q.waiter == waiter);
                queue.retain(|q| q.waiter != waiter);
                match queue.front().map(|q| q.waiter) {
                    None => {
                        r.queues.remove(&name);
                    }
                    Some(next) if was_head => {
                        if let Some(next) = r.waiters.get_mut(&next) {
                            next.head = true;
                        }
                        if may_kick {
                            kick = Some(name);
                        }
                    }
                    Some(_) => {}
                }
            }
        }
        (w.timer.map(|(id, _)| id), kick)
    });
    if let Some(id) = timer {
        ffi::stop_timer(id);
    }
    if let Some((db, key)) = kick {
        // The next one is decided at once, after the current event: the
        // server may be letting go of the waiter outside a pass over its key.
        self::kick(db, key);
    }
}

/// Has the head of the queue of `key` decided again, after the current
/// command or event (a timer of no delay).
fn kick(db: i32, key: Box<[u8]>) {
    with(|r| {
        r.next += 1;
        let token = KICK | r.next;
        r.kicks.insert(token, (db, key));
        ffi::create_timer(0, token, on_timer);
    });
}

/// Signals key `key` of database `db` ready, if anything is blocked: after
/// a write that may let a waiter in (a release, a refund, new parameters).
#[inline]
pub fn signal(db: i32, key: &[u8]) {
    if !any() {
        return;
    }
    if ffi::wakes_missing_keys() {
        return ffi::signal_ready(db, key);
    }
    // Before Redis 7.2 the key may be gone when the server looks (a release
    // of the last lease expires it): its queue's head is decided by `wake`.
    let name: KeyName = (db, Box::from(key));
    if with(|r| r.queues.contains_key(&name)) {
        kick(name.0, name.1);
    }
}

/// A timer fired: the waiter it belongs to, or the head of the queue it
/// kicks, is decided again.
fn on_timer(token: u64) {
    let target = with(|r| {
        if token & KICK != 0 {
            let (db, key) = r.kicks.remove(&token)?;
            let head = r.queues.get(&(db, key.clone()))?.front()?.waiter;
            let w = r.waiters.get(&head)?;
            return Some((head, db, vec![key], w.client));
        }
        let w = r.waiters.get_mut(&token)?;
        w.timer = None;
        Some((token, w.db, w.keys.clone(), w.client))
    });
    if let Some((waiter, db, keys, client)) = target {
        wake(waiter, db, &keys, client);
    }
}

/// Has the server retry `waiter`, blocked on `keys` of database `db`.
///
/// A signal of a key does it, where the server retries clients blocked on
/// missing keys too. Before Redis 7.2 it does not: a signal of a key that
/// does not exist (deleted, or expired while the waiter waited) wakes
/// nobody. There a key of the waiter's that exists is signalled (with a
/// second look just after its expiry, in case it expires before the server
/// looks at it); if none does, every limiter of the waiter is idle, and the
/// server is told to end
/// the wait now, which runs the waiter's timeout callback: a step that
/// admits it (or, past its deadline or behind others, denies it).
fn wake(waiter: u64, db: i32, keys: &[Box<[u8]>], client: Option<BlockedClient>) {
    if ffi::wakes_missing_keys() {
        return ffi::signal_ready(db, &keys[0]);
    }
    let found = keys
        .iter()
        .find_map(|key| ffi::key_ttl_ms(db, key).map(|ttl| (key, ttl)));
    if let Some((key, ttl)) = found {
        ffi::signal_ready(db, key);
        if let Some(ms) = ttl {
            // The key may expire before the server looks at it (a busy
            // machine can pass its last milliseconds between this timer and
            // the server's pass over ready keys), and then nobody is
            // retried: the waiter is looked at again just after the key's
            // expiry, when it finds it gone, unless this signal served it
            // (which stops the timer) or it waits for an earlier instant.
            let now = crate::clock::now();
            keep(waiter, Some(now.saturating_add_ms(ms + 1)), now);
        }
        return;
    }
    if !keys.iter().all(|key| ffi::key_served_here(db, key)) {
        // Its slot moved away: the server redirects it soon; until then it
        // is looked at again now and then.
        let now = crate::clock::now();
        return keep(waiter, Some(now.saturating_add_ms(100)), now);
    }
    if let Some(client) = client {
        ffi::unblock(client, waiter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The queue's order, without timers: waiters with no deadline and no
    // retry arm none.
    #[test]
    fn a_queue_keeps_arrival_order_and_a_new_call_sees_it_all() {
        let now = Micros::from_ms(1_000);
        let key: Box<[u8]> = Box::from(&b"blocking-test-queue"[..]);
        assert_eq!(place(77, &key, None), Place::Free);
        let a = enqueue(77, vec![key.clone()], Some(Request::Cost(2)), 0, None, now);
        let b = enqueue(77, vec![key.clone()], Some(Request::UpTo(3)), 0, None, now);
        assert_eq!(place(77, &key, Some(a)), Place::Head);
        assert_eq!(place(77, &key, Some(b)), Place::Queued);
        assert_eq!(
            place(77, &key, None),
            Place::Behind(vec![(Request::Cost(2), None), (Request::UpTo(3), None)])
        );
        assert_eq!(place(78, &key, None), Place::Free, "another database");
        assert!(!expired(a, now));
        assert!(!waits_behind(a, now) && waits_behind(b, now));
        assert_eq!(ahead_of(77, &key, b), vec![(Request::Cost(2), None)]);
        done(a, true, true);
        assert_eq!(place(77, &key, Some(b)), Place::Head);
        assert!(!waits_behind(b, now));
        forget(b);
        forget(b);
        assert_eq!(place(77, &key, None), Place::Free);
    }
}
