//! What the module propagates to replicas and the AOF, and in which form.
//!
//! A limiter call reads the master's clock, so it is never propagated as the
//! client sent it: it goes out with the master's time pinned,
//! `<command> key <params...> COST n [FORCE] AT <unix_us>` (or `REFUND n AT
//! <unix_us>`), like Redis turns
//! `SET ... EX` into `PXAT`. The algorithms are pure functions of
//! `(state, params, cost, now)`, so replaying the pinned call reaches the
//! master's state bit for bit, live on a replica or hours later from an AOF.
//! Calls that changed nothing are not propagated at all.
//!
//! Building the pinned call costs more than the limiter itself (Redis looks
//! the command up by name and allocates every argument). Redis drops
//! propagated commands when nothing can consume them: no AOF, no replica and
//! no replication backlog. The module skips building them in exactly that
//! case, and only while it is sure of it: it starts in the pinned mode unless,
//! at load, the server is a master without AOF, replicas or backlog; and it
//! switches to the pinned mode for good on the first sign that a consumer may
//! appear, each of which Redis announces before any later command runs:
//!
//! - a fork (every full sync and every AOF rewrite, including turning AOF on,
//!   starts with one, and the stream a replica or a new AOF reads starts at
//!   that fork);
//! - a replica connecting or a change of replication role;
//! - data loaded from disk (a master restarted from its RDB may recreate its
//!   backlog without a fork, so that replicas can resume).
//!
//! In the fast mode the call is still reported with `ReplicateVerbatim`,
//! which Redis drops at once for lack of a consumer, but which counts the
//! write for `save` points and `rdb_changes_since_last_save`.

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::args::ParamList;
use crate::ffi::{Context, Head, Level, Load, RString, SharedString, Word};
use crate::limiter::{Micros, Request};

/// Whether a replica, an AOF or a replication backlog may consume the stream.
static PINNED: AtomicBool = AtomicBool::new(true);

/// Words every pinned call uses, made once at load.
static COST: SharedString = SharedString::new(c"COST");
static AT: SharedString = SharedString::new(c"AT");
static ONE: SharedString = SharedString::new(c"1");
static FORCE: SharedString = SharedString::new(c"FORCE");
static REFUND: SharedString = SharedString::new(c"REFUND");
static UPTO: SharedString = SharedString::new(c"UPTO");
static END: SharedString = SharedString::new(c"END");
static PXAT: SharedString = SharedString::new(c"PXAT");

/// Whether admitted calls are currently propagated in their pinned form.
pub fn pinned() -> bool {
    PINNED.load(Ordering::Relaxed)
}

/// Sets up propagation at module load: the shared words and the initial
/// mode. `subscribed` says whether the server took the subscriptions to the
/// events that switch to the pinned mode (the module's server event
/// handler calls [`consumer_may_appear`]); without them, the module pins
/// from the start.
pub fn init(load: &Load, subscribed: bool) {
    for word in [&COST, &AT, &ONE, &FORCE, &REFUND, &END, &PXAT] {
        load.make_shared(word);
    }
    let quiet = subscribed && nothing_consumes_the_stream(load.context());
    PINNED.store(!quiet, Ordering::Relaxed);
}

/// At load: a master without AOF, replicas or replication backlog.
fn nothing_consumes_the_stream(ctx: &Context) -> bool {
    let flags = ctx.flags();
    if flags.aof() || flags.replica() {
        return false;
    }
    let fields = [c"repl_backlog_active", c"connected_slaves"];
    ctx.server_info(c"replication", fields) == Some([Some(0), Some(0)])
}

/// Any of the events that may bring a consumer: from now on, pin.
pub fn consumer_may_appear(ctx: &Context) {
    if !PINNED.swap(true, Ordering::Relaxed) {
        ctx.log(
            Level::Notice,
            "a fork, replica, role change or data load was seen: admitted calls are now propagated with the master's time pinned",
        );
    }
}

/// Counts a write that nothing consumes (not [`pinned`]): Redis drops the
/// propagated call at once, but counts it for `save` points and
/// `rdb_changes_since_last_save`.
#[inline]
pub fn count_write(ctx: &Context) {
    ctx.replicate_verbatim();
}

/// Propagates a limiter call that changed the state as
/// `<command> key <params...> COST <n> [FORCE] AT <now_us>` or
/// `<command> key <params...> REFUND <n> AT <now_us>`.
///
/// `key_and_params` are the client's own (validated) strings, passed on
/// without copying.
pub fn limiter_call(
    ctx: &Context,
    command: &CStr,
    key_and_params: &[&RString],
    request: Request,
    now: Micros,
    end: Option<Micros>,
) {
    if !pinned() {
        return count_write(ctx);
    }
    pin(
        ctx,
        command,
        Head::Strings(key_and_params),
        request,
        now,
        end,
    );
}

/// Propagates a call made through a policy: like [`limiter_call`], with the
/// parameters given as numbers (read only when the call is pinned), whose
/// strings the module keeps from call to call, so the hot path allocates
/// nothing.
pub fn limiter_call_with_params(
    ctx: &Context,
    command: &CStr,
    key: &RString,
    params: impl FnOnce() -> ParamList,
    request: Request,
    now: Micros,
    end: Option<Micros>,
) {
    if !pinned() {
        return count_write(ctx);
    }
    let params = params();
    pin(
        ctx,
        command,
        Head::KeyAndNumbers(key, params.as_slice()),
        request,
        now,
        end,
    );
}

/// Propagates a call that reads the clock but takes no request
/// (`RL.RELEASE key lease`, `RL.RENEW key lease lease_ms`) as
/// `<command> <args...> AT <now_us>`: the call's own strings, then the
/// master's time.
pub fn pinned_call(ctx: &Context, command: &CStr, args: &[&RString], now: Micros) {
    if !pinned() {
        return count_write(ctx);
    }
    let (tail, len) = at_tail(now);
    ctx.replicate(command, Head::Strings(args), &tail[..len]);
}

/// Propagates the new value of a string key and its expiry as `SET key
/// <value> PXAT <unix_ms>` (`CL.THROTTLE`, whose state is redis-cell's
/// string): what the master computed, so replicas and the AOF hold the very
/// same string and expiry, whatever their clock, and with no need of the
/// module.
pub fn string_set(ctx: &Context, key: &RString, value: u64, expire_at_ms: u64) {
    if !pinned() {
        return count_write(ctx);
    }
    let (tail, len) = set_tail(value, expire_at_ms);
    ctx.replicate(c"SET", Head::Strings(&[key]), &tail[..len]);
}

/// Propagates a policy's scale and stage as `RL.LOOPSTATE name scale
/// stage`: the result of a window the master ended, never recomputed by a
/// replica or the AOF.
pub fn loop_state(ctx: &Context, name: &RString, scale: u64, stage: u8) {
    if !pinned() {
        return count_write(ctx);
    }
    let tail = [Word::Int(scale as i64), Word::Int(i64::from(stage))];
    ctx.replicate(c"RL.LOOPSTATE", Head::Strings(&[name]), &tail);
}

/// `<value> PXAT <unix_ms>`, the words of [`string_set`] after the key.
#[inline]
pub fn set_tail(value: u64, expire_at_ms: u64) -> ([Word; 3], usize) {
    // Both at most i64::MAX: the core crate bounds a TAT there.
    (
        [
            Word::Int(value as i64),
            Word::Shared(&PXAT),
            Word::Int(expire_at_ms as i64),
        ],
        3,
    )
}

/// `AT <now_us>`, as [`tail`] gives it.
#[inline]
pub fn at_tail(now: Micros) -> ([Word; 2], usize) {
    ([Word::Shared(&AT), Word::Int(now.as_us() as i64)], 2)
}

/// Propagates `command head...` with the request and the master's time.
#[inline]
fn pin(
    ctx: &Context,
    command: &CStr,
    head: Head,
    request: Request,
    now: Micros,
    end: Option<Micros>,
) {
    let (tail, len) = tail(request, now, end);
    ctx.replicate(command, head, &tail[..len]);
}

/// The words of a pinned call after its key and parameters: `COST n AT t`,
/// `COST n FORCE AT t` or `REFUND n AT t` (`COST 1` from a shared word),
/// then `END e` for a calendar quota's period, as an array and its length
/// (no allocation).
#[inline]
pub fn tail(request: Request, now: Micros, end: Option<Micros>) -> ([Word; 7], usize) {
    let (words, len) = request_tail(request, now);
    let mut out = [words[0]; 7];
    out[..5].copy_from_slice(&words);
    match end {
        None => (out, len),
        Some(end) => {
            out[len] = Word::Shared(&END);
            out[len + 1] = Word::Int(end.as_us() as i64);
            (out, len + 2)
        }
    }
}

#[inline]
fn request_tail(request: Request, now: Micros) -> ([Word; 5], usize) {
    let at = Word::Int(now.as_us() as i64);
    let (cost, force, refund, at_word) = (
        Word::Shared(&COST),
        Word::Shared(&FORCE),
        Word::Shared(&REFUND),
        Word::Shared(&AT),
    );
    match request {
        Request::Cost(1) => ([cost, Word::Shared(&ONE), at_word, at, at], 4),
        Request::Cost(n) => ([cost, Word::Int(n as i64), at_word, at, at], 4),
        Request::Force(n) => ([cost, Word::Int(n as i64), force, at_word, at], 5),
        Request::Refund(n) => ([refund, Word::Int(n as i64), at_word, at, at], 4),
        // The steps send what `UPTO` took as `COST granted`
        // (`Request::as_applied`); were one to come here, the same state at
        // the same pinned instant grants the same units on a replica.
        Request::UpTo(n) => (
            [Word::Shared(&UPTO), Word::Int(n as i64), at_word, at, at],
            4,
        ),
    }
}
