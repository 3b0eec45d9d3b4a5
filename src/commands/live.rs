//! The running server as a [`Host`]: the thin runner of every step.
//!
//! Each command the module registers is `live(step)`: the FFI entry point
//! (`crate::ffi::command`) hands over the call's context and arguments, and
//! the step runs against them. Nothing here decides anything; every method
//! is one call of a safe wrapper of `crate::ffi`.

use std::cell::Cell;
use std::ffi::CStr;
use std::ops::Range;

use super::host::{Host, Origin, Store, Turn};
use crate::algorithms::Listed;
use crate::args::ParamList;
use crate::clock;
use crate::error::Error;
use crate::ffi::{Argv, Context, Key, Slot, Words};
use crate::limiter::{Micros, Request};
use crate::replicate;

/// One call of a command on the server.
pub struct Live<'a> {
    ctx: &'a Context,
    argv: &'a Argv<'a>,
    turn: Turn,
    /// A retried call stays blocked.
    waiting: Cell<bool>,
}

impl<'a> Live<'a> {
    #[inline(always)]
    pub fn new(ctx: &'a Context, argv: &'a Argv<'a>) -> Self {
        Live::with_turn(ctx, argv, Turn::Call)
    }

    /// A blocked call, run again by the server.
    #[inline(always)]
    pub fn with_turn(ctx: &'a Context, argv: &'a Argv<'a>, turn: Turn) -> Self {
        Live {
            ctx,
            argv,
            turn,
            waiting: Cell::new(false),
        }
    }

    /// Whether the step kept the call blocked.
    pub fn kept_waiting(&self) -> bool {
        self.waiting.get()
    }
}

impl Host for Live<'_> {
    type Key<'h>
        = Key<'h>
    where
        Self: 'h;

    #[inline(always)]
    fn argc(&self) -> usize {
        self.argv.len()
    }

    #[inline(always)]
    fn words<const N: usize>(&self) -> Result<Words<'_, N>, Error> {
        self.argv.words::<N>()
    }

    fn all_words(&self) -> Vec<&[u8]> {
        self.argv.all_words()
    }

    #[inline(always)]
    fn origin(&self) -> Origin {
        if self.ctx.replicated_or_loading() {
            Origin::Replicated
        } else {
            Origin::Client
        }
    }

    #[inline]
    fn out_of_memory(&self) -> bool {
        // `maxmemory-policy` is asked only when over the limit.
        self.ctx.flags().out_of_memory()
            && !self
                .ctx
                .config_get(c"maxmemory-policy", |policy| policy != b"noeviction")
                .unwrap_or(false)
    }

    #[inline(always)]
    fn now(&self) -> Micros {
        clock::now()
    }

    #[inline(always)]
    fn turn(&self) -> Turn {
        self.turn
    }

    fn db(&self) -> i32 {
        self.ctx.selected_db()
    }

    fn may_block(&self) -> bool {
        crate::blocking::room() && self.ctx.may_block()
    }

    fn block(&self, keys: &[usize], waiter: u64, timeout_ms: u64) {
        let strings: Vec<&crate::ffi::RString> =
            keys.iter().map(|&i| self.argv.string(i)).collect();
        // The server's own timeout is a backstop: the waiter's timer answers
        // at the deadline itself (the server checks timeouts only as often
        // as `hz`).
        let backstop = if timeout_ms == 0 {
            0
        } else {
            timeout_ms.saturating_add(1000)
        };
        let client = self.ctx.block_on_keys(
            &strings,
            backstop,
            waiter,
            retry,
            timeout,
            crate::blocking::forget,
        );
        crate::blocking::set_client(waiter, client);
    }

    fn keep_waiting(&self) {
        self.waiting.set(true);
    }

    #[inline(always)]
    fn signal_ready(&self, arg: usize) {
        if crate::blocking::any() {
            crate::blocking::signal(self.ctx.selected_db(), self.argv.string(arg).as_bytes());
        }
    }

    #[inline(always)]
    fn open_key(&self, arg: usize) -> Key<'_> {
        self.ctx.open_key(self.argv.string(arg))
    }

    #[inline(always)]
    fn propagate_limiter(
        &self,
        command: &'static CStr,
        key: usize,
        params: Range<usize>,
        request: Request,
        now: Micros,
        end: Option<Micros>,
    ) {
        if !replicate::pinned() {
            // Nothing consumes the stream: the strings are not needed.
            return replicate::count_write(self.ctx);
        }
        // The client's own strings, passed on as they are.
        let key = self.argv.string(key);
        let mut strings = [key; 1 + crate::ffi::MAX_NUMBERS];
        let len = 1 + params.len();
        for (string, i) in strings[1..len].iter_mut().zip(params) {
            *string = self.argv.string(i);
        }
        replicate::limiter_call(self.ctx, command, &strings[..len], request, now, end);
    }

    #[inline(always)]
    fn propagate_limiter_with(
        &self,
        command: &'static CStr,
        key: usize,
        params: impl FnOnce() -> ParamList,
        request: Request,
        now: Micros,
        end: Option<Micros>,
    ) {
        let key = self.argv.string(key);
        replicate::limiter_call_with_params(self.ctx, command, key, params, request, now, end);
    }

    fn propagate_pinned(&self, command: &'static CStr, args: Range<usize>, now: Micros) {
        if !replicate::pinned() {
            return replicate::count_write(self.ctx);
        }
        let first = self.argv.string(args.start);
        let mut strings = [first; crate::ffi::MAX_NUMBERS];
        let len = args.len().min(strings.len());
        for (string, i) in strings[..len].iter_mut().zip(args) {
            *string = self.argv.string(i);
        }
        replicate::pinned_call(self.ctx, command, &strings[..len], now);
    }

    #[inline(always)]
    fn propagate_string_set(&self, key: usize, value: u64, expire_at_ms: u64) {
        replicate::string_set(self.ctx, self.argv.string(key), value, expire_at_ms);
    }

    #[inline(always)]
    fn propagate_verbatim(&self) {
        self.ctx.replicate_verbatim();
    }

    fn propagate_loop(&self, name: usize, scale: u64, stage: u8) {
        replicate::loop_state(self.ctx, self.argv.string(name), scale, stage);
    }

    #[inline(always)]
    fn reply_integer(&self, value: i64) {
        self.ctx.reply_integer(value);
    }

    #[inline(always)]
    fn reply_array(&self, len: usize) {
        self.ctx.reply_array(len);
    }

    #[inline(always)]
    fn reply_integers(&self, values: &[i64]) {
        self.ctx.reply_integers(values);
    }

    #[inline(always)]
    fn reply_bulk(&self, bytes: &[u8]) {
        self.ctx.reply_bulk(bytes);
    }

    #[inline(always)]
    fn reply_simple(&self, status: &'static CStr) {
        self.ctx.reply_simple(status);
    }

    #[inline(always)]
    fn reply_null(&self) {
        self.ctx.reply_null();
    }
}

impl Store for Key<'_> {
    #[inline(always)]
    fn with_state<L: Listed, R>(
        &mut self,
        f: impl FnOnce(&mut L::State) -> R,
    ) -> Result<Option<R>, Error> {
        self.with_value(L::data_type(), |slot| match slot {
            Slot::Ours(state) => Some(f(state)),
            Slot::Empty => None,
        })
    }

    #[inline(always)]
    fn set_state<L: Listed>(&mut self, state: L::State) {
        self.set_value(L::data_type(), state);
    }

    #[inline(always)]
    fn with_string<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, Error> {
        Key::with_string(self, f)
    }

    #[inline(always)]
    fn set_string(&mut self, bytes: &[u8]) -> Result<(), Error> {
        if Key::set_string(self, bytes) {
            Ok(())
        } else {
            Err(Error::WrongType)
        }
    }

    #[inline(always)]
    fn expires_at(&self) -> Option<u64> {
        Key::expires_at(self)
    }

    #[inline(always)]
    fn expire_at(&mut self, unix_ms: u64) {
        Key::expire_at(self, unix_ms);
    }

    #[inline(always)]
    fn written(&mut self, event: &'static CStr, expiry_written: bool) {
        Key::written(self, event, expiry_written);
    }
}

/// The entry point of step `S` (a function item generic over the host),
/// for `crate::ffi::command`: `command(live!(step))`.
macro_rules! live {
    ($($step:tt)+) => {
        |ctx: &$crate::ffi::Context, argv: &$crate::ffi::Argv| {
            $($step)+(&$crate::commands::live::Live::new(ctx, argv))
        }
    };
}
pub(crate) use live;

/// The server retries blocked call `waiter`: whether it replied. The call
/// runs again through the one dispatcher, as its first turn did.
fn retry(ctx: &Context, argv: &Argv, waiter: u64) -> Result<bool, Error> {
    if crate::blocking::waits_behind(waiter, crate::clock::now()) {
        return Ok(false);
    }
    if !crate::blocking::served_here(waiter) {
        // The key moved to another node (a slot migration deleted it here):
        // the server redirects the client; nothing is decided here.
        let now = crate::clock::now();
        crate::blocking::keep(waiter, Some(now.saturating_add_ms(100)), now);
        return Ok(false);
    }
    let live = Live::with_turn(ctx, argv, Turn::Retry(waiter));
    super::dispatch(&live)?;
    Ok(!live.kept_waiting())
}

/// The server's own timeout of blocked call `waiter` (a backstop: its timer
/// answers at the deadline first).
fn timeout(ctx: &Context, argv: &Argv, waiter: u64) -> Result<(), Error> {
    if !crate::blocking::served_here(waiter) {
        return Err(Error::KeyMoved);
    }
    let live = Live::with_turn(ctx, argv, Turn::Timeout(waiter));
    super::dispatch(&live)
}
