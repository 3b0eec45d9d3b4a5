//! An in-memory key space as a [`Host`]: the steps of the commands, run
//! without a server (unit tests and the fuzz targets).
//!
//! It keeps what the server would: the keys with their values and expiries,
//! a clock set by the test, and an out-of-memory switch (`maxmemory`
//! reached under `noeviction`). Keys expire as in Redis: a client's call
//! finds a key gone once the clock is past its expiry, and the deletion is
//! propagated as a `DEL` before the call's own writes; calls from the
//! master or the AOF never expire a key (the master's `DEL` does). Each call returns what it replied, propagated and
//! signalled, so a test can check a step's effects one by one, and replay
//! what it propagated on a second key space, as a replica or an AOF would.
//!
//! What it does not keep: the policies, the deny log and the `INFO`
//! counters are the module's own (global) state, on the live server and
//! here alike.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ffi::CStr;
use std::fmt::Debug;
use std::ops::Range;

use super::host::{Host, Origin, Store};
use crate::algorithms::Listed;
use crate::args::ParamList;
use crate::datatype::{Encoder, NativeState};
use crate::error::Error;
use crate::ffi::{Repr, Stored, Words};
use crate::limiter::{Micros, Request};
use crate::replicate;

/// A key space in memory.
pub struct Memory {
    keys: RefCell<BTreeMap<Vec<u8>, Entry>>,
    now: Cell<Micros>,
    out_of_memory: Cell<bool>,
}

struct Entry {
    value: Value,
    /// Unix milliseconds.
    expires_at: Option<u64>,
}

enum Value {
    /// A limiter's state.
    Limiter(Box<dyn Held>),
    /// A string (`CL.THROTTLE`'s state, or any other): `WRONGTYPE` for
    /// every limiter of a native type.
    Other(Vec<u8>),
}

/// A limiter state as the key space holds it: behind its value pointer,
/// packed as the server's keys pack it ([`Stored`]).
trait Held: Any + Debug {
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn as_any(&self) -> &dyn Any;
    /// The state's type and its encoded fields (what RDB holds).
    fn fields(&self) -> (&'static str, Vec<u64>);
}

impl<S: NativeState + Debug, R: Repr<S>> Held for Stored<S, R> {
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn fields(&self) -> (&'static str, Vec<u64>) {
        struct Fields(Vec<u64>);
        impl Encoder for Fields {
            fn put(&mut self, value: u64) {
                self.0.push(value);
            }
        }
        let mut fields = Fields(Vec::new());
        self.with_ref(|state| state.encode(&mut fields));
        (std::any::type_name::<S>(), fields.0)
    }
}

/// One reply, as the server would write it: arrays are a header, then their
/// elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Integer(i64),
    Array(usize),
    Bulk(Vec<u8>),
    Simple(&'static str),
    Null,
}

/// What one call did besides changing keys.
#[derive(Debug, Default)]
pub struct Effects {
    /// What it replied (nothing on an error: the server replies the error).
    pub reply: Vec<Reply>,
    /// The calls it propagated, each as its words (a verbatim one as the
    /// call's own words).
    pub propagated: Vec<Vec<Vec<u8>>>,
    /// The keyspace events it raised: (key, event).
    pub events: Vec<(Vec<u8>, String)>,
}

/// One call: its result and its effects.
#[derive(Debug)]
pub struct Called {
    pub result: Result<(), Error>,
    pub effects: Effects,
}

impl Called {
    /// The reply's integers (a limiter's five, `RL.ALL`'s six), if it is an
    /// array of integers.
    pub fn integers(&self) -> Option<Vec<i64>> {
        let (Reply::Array(len), rest) = self.effects.reply.split_first()? else {
            return None;
        };
        let ints: Vec<i64> = rest
            .iter()
            .map_while(|r| match r {
                Reply::Integer(i) => Some(*i),
                _ => None,
            })
            .collect();
        (ints.len() == *len && rest.len() == *len).then_some(ints)
    }
}

/// A key as a snapshot shows it: its name, its value's type and encoded
/// fields (or other bytes), its expiry.
pub type KeySnapshot = (Vec<u8>, &'static str, Vec<u64>, Option<u64>);

impl Memory {
    /// An empty key space whose clock reads `now`.
    pub fn new(now: Micros) -> Self {
        Memory {
            keys: RefCell::new(BTreeMap::new()),
            now: Cell::new(now),
            out_of_memory: Cell::new(false),
        }
    }

    pub fn now(&self) -> Micros {
        self.now.get()
    }

    pub fn set_now(&self, now: Micros) {
        self.now.set(now);
    }

    pub fn out_of_memory(&self) -> bool {
        self.out_of_memory.get()
    }

    /// Used memory above `maxmemory` under `noeviction` (or not).
    pub fn set_out_of_memory(&self, full: bool) {
        self.out_of_memory.set(full);
    }

    /// Runs one command, as the server dispatches it (`DEL` too, which a
    /// master propagates for keys it found expired, and `SET key value PXAT
    /// ms`, which `CL.THROTTLE` propagates).
    pub fn call(&self, origin: Origin, words: &[&[u8]]) -> Called {
        if let [set, key, value, pxat, at] = words {
            if set.eq_ignore_ascii_case(b"SET") && pxat.eq_ignore_ascii_case(b"PXAT") {
                let expires_at = std::str::from_utf8(at).ok().and_then(|at| at.parse().ok());
                self.keys.borrow_mut().insert(
                    key.to_vec(),
                    Entry {
                        value: Value::Other(value.to_vec()),
                        expires_at,
                    },
                );
                let effects = Effects {
                    reply: vec![Reply::Simple("OK")],
                    propagated: vec![words.iter().map(|w| w.to_vec()).collect()],
                    events: Vec::new(),
                };
                return Called {
                    result: Ok(()),
                    effects,
                };
            }
        }
        if words
            .first()
            .is_some_and(|w| w.eq_ignore_ascii_case(b"DEL"))
        {
            let mut keys = self.keys.borrow_mut();
            let deleted = words[1..]
                .iter()
                .filter(|k| keys.remove(**k).is_some())
                .count();
            let effects = Effects {
                reply: vec![Reply::Integer(deleted as i64)],
                propagated: vec![words.iter().map(|w| w.to_vec()).collect()],
                events: Vec::new(),
            };
            return Called {
                result: Ok(()),
                effects,
            };
        }
        let call = Call {
            space: self,
            words,
            origin,
            effects: RefCell::new(Effects::default()),
        };
        let result = super::dispatch(&call);
        let mut effects = call.effects.into_inner();
        if result.is_err() {
            effects.reply.clear();
        }
        Called { result, effects }
    }

    /// [`Memory::call`] of a command given as text, split on spaces.
    pub fn run(&self, origin: Origin, text: &str) -> Called {
        let words: Vec<&[u8]> = text.split(' ').map(str::as_bytes).collect();
        self.call(origin, &words)
    }

    /// Replays calls as the master link would (`Origin::Replicated`); each
    /// must succeed. Returns what they propagated in turn (a replica's own
    /// stream).
    pub fn replay(&self, calls: &[Vec<Vec<u8>>]) -> Vec<Vec<Vec<u8>>> {
        let mut again = Vec::new();
        for words in calls {
            let words: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
            let called = self.call(Origin::Replicated, &words);
            assert_eq!(
                called.result,
                Ok(()),
                "a propagated call failed: {:?}",
                words
                    .iter()
                    .map(|w| String::from_utf8_lossy(w))
                    .collect::<Vec<_>>()
            );
            again.extend(called.effects.propagated);
        }
        again
    }

    /// Stores a value of another type (a string) in `key`.
    pub fn set_other(&self, key: &[u8], value: &[u8]) {
        self.keys.borrow_mut().insert(
            key.to_vec(),
            Entry {
                value: Value::Other(value.to_vec()),
                expires_at: None,
            },
        );
    }

    /// Stores a limiter state in `key`, without expiry.
    pub fn insert<L: Listed>(&self, key: &[u8], state: L::State) {
        self.keys.borrow_mut().insert(
            key.to_vec(),
            Entry {
                value: Value::Limiter(Box::new(Stored::<_, L::Repr>::new(state))),
                expires_at: None,
            },
        );
    }

    /// The state of `L` in `key`, if it holds one (and has not expired).
    pub fn state<L: Listed>(&self, key: &[u8]) -> Option<L::State> {
        match &self.live(key)?.value {
            Value::Limiter(held) => held
                .as_any()
                .downcast_ref::<Stored<L::State, L::Repr>>()
                .map(|stored| stored.with_ref(L::State::clone)),
            Value::Other(_) => None,
        }
    }

    /// The expiry of `key` in Unix milliseconds.
    pub fn expiry(&self, key: &[u8]) -> Option<u64> {
        self.live(key)?.expires_at
    }

    /// `key`'s entry, unless it has expired.
    fn live(&self, key: &[u8]) -> Option<std::cell::Ref<'_, Entry>> {
        let now_ms = self.now.get().as_ms_floor();
        std::cell::Ref::filter_map(self.keys.borrow(), |keys| {
            keys.get(key)
                .filter(|e| e.expires_at.is_none_or(|at| now_ms <= at))
        })
        .ok()
    }

    /// Every key that has not expired, in order.
    pub fn snapshot(&self) -> Vec<KeySnapshot> {
        let now_ms = self.now.get().as_ms_floor();
        self.keys
            .borrow()
            .iter()
            .filter(|(_, e)| e.expires_at.is_none_or(|at| now_ms <= at))
            .map(|(name, e)| {
                let (kind, fields) = match &e.value {
                    Value::Limiter(held) => held.fields(),
                    Value::Other(bytes) => ("other", bytes.iter().map(|&b| u64::from(b)).collect()),
                };
                (name.clone(), kind, fields, e.expires_at)
            })
            .collect()
    }

    /// Deletes `key` if its expiry has passed (Redis: the clock is past it);
    /// whether it did.
    fn expire(&self, key: &[u8]) -> bool {
        let now_ms = self.now.get().as_ms_floor();
        let mut keys = self.keys.borrow_mut();
        let expired = keys
            .get(key)
            .and_then(|e| e.expires_at)
            .is_some_and(|at| now_ms > at);
        if expired {
            keys.remove(key);
        }
        expired
    }
}

/// One call on a [`Memory`].
struct Call<'m> {
    space: &'m Memory,
    words: &'m [&'m [u8]],
    origin: Origin,
    effects: RefCell<Effects>,
}

impl Call<'_> {
    fn propagate(
        &self,
        command: &CStr,
        head: Vec<Vec<u8>>,
        request: Request,
        now: Micros,
        end: Option<Micros>,
    ) {
        let mut words = vec![command.to_bytes().to_vec()];
        words.extend(head);
        let (tail, len) = replicate::tail(request, now, end);
        words.extend(tail[..len].iter().map(|w| w.text()));
        self.effects.borrow_mut().propagated.push(words);
    }

    fn reply(&self, reply: Reply) {
        self.effects.borrow_mut().reply.push(reply);
    }
}

impl Host for Call<'_> {
    type Key<'h>
        = MemoryKey<'h>
    where
        Self: 'h;

    fn argc(&self) -> usize {
        self.words.len()
    }

    fn words<const N: usize>(&self) -> Result<Words<'_, N>, Error> {
        Words::from_slices(self.words)
    }

    fn all_words(&self) -> Vec<&[u8]> {
        self.words.to_vec()
    }

    fn origin(&self) -> Origin {
        self.origin
    }

    fn out_of_memory(&self) -> bool {
        self.space.out_of_memory.get()
    }

    fn now(&self) -> Micros {
        self.space.now.get()
    }

    fn open_key(&self, arg: usize) -> MemoryKey<'_> {
        let name = self.words[arg];
        if self.origin == Origin::Client && self.space.expire(name) {
            self.effects
                .borrow_mut()
                .propagated
                .push(vec![b"DEL".to_vec(), name.to_vec()]);
        }
        MemoryKey { call: self, name }
    }

    fn propagate_limiter(
        &self,
        command: &'static CStr,
        key: usize,
        params: Range<usize>,
        request: Request,
        now: Micros,
        end: Option<Micros>,
    ) {
        let head = std::iter::once(key)
            .chain(params)
            .map(|i| self.words[i].to_vec())
            .collect();
        self.propagate(command, head, request, now, end);
    }

    fn propagate_limiter_with(
        &self,
        command: &'static CStr,
        key: usize,
        params: impl FnOnce() -> ParamList,
        request: Request,
        now: Micros,
        end: Option<Micros>,
    ) {
        let mut head = vec![self.words[key].to_vec()];
        head.extend(
            params()
                .as_slice()
                .iter()
                .map(|v| v.to_string().into_bytes()),
        );
        self.propagate(command, head, request, now, end);
    }

    fn propagate_loop(&self, name: usize, scale: u64, stage: u8) {
        let words = vec![
            b"RL.LOOPSTATE".to_vec(),
            self.words[name].to_vec(),
            scale.to_string().into_bytes(),
            stage.to_string().into_bytes(),
        ];
        self.effects.borrow_mut().propagated.push(words);
    }

    fn propagate_pinned(&self, command: &'static CStr, args: Range<usize>, now: Micros) {
        let mut words = vec![command.to_bytes().to_vec()];
        words.extend(args.map(|i| self.words[i].to_vec()));
        let (tail, len) = replicate::at_tail(now);
        words.extend(tail[..len].iter().map(|w| w.text()));
        self.effects.borrow_mut().propagated.push(words);
    }

    fn propagate_string_set(&self, key: usize, value: u64, expire_at_ms: u64) {
        let mut words = vec![b"SET".to_vec(), self.words[key].to_vec()];
        let (tail, len) = replicate::set_tail(value, expire_at_ms);
        words.extend(tail[..len].iter().map(|w| w.text()));
        self.effects.borrow_mut().propagated.push(words);
    }

    fn propagate_verbatim(&self) {
        let words = self.words.iter().map(|w| w.to_vec()).collect();
        self.effects.borrow_mut().propagated.push(words);
    }

    fn reply_integer(&self, value: i64) {
        self.reply(Reply::Integer(value));
    }

    fn reply_array(&self, len: usize) {
        self.reply(Reply::Array(len));
    }

    fn reply_bulk(&self, bytes: &[u8]) {
        self.reply(Reply::Bulk(bytes.to_vec()));
    }

    fn reply_simple(&self, status: &'static CStr) {
        self.reply(Reply::Simple(status.to_str().unwrap_or("?")));
    }

    fn reply_null(&self) {
        self.reply(Reply::Null);
    }
}

/// An open key of a [`Memory`].
pub struct MemoryKey<'h> {
    call: &'h Call<'h>,
    name: &'h [u8],
}

impl Store for MemoryKey<'_> {
    fn with_state<L: Listed, R>(
        &mut self,
        f: impl FnOnce(&mut L::State) -> R,
    ) -> Result<Option<R>, Error> {
        let mut keys = self.call.space.keys.borrow_mut();
        match keys.get_mut(self.name).map(|e| &mut e.value) {
            None => Ok(None),
            Some(Value::Limiter(held)) => {
                match held
                    .as_any_mut()
                    .downcast_mut::<Stored<L::State, L::Repr>>()
                {
                    Some(stored) => Ok(Some(stored.with_mut(f))),
                    None => Err(Error::WrongType),
                }
            }
            Some(Value::Other(_)) => Err(Error::WrongType),
        }
    }

    fn set_state<L: Listed>(&mut self, state: L::State) {
        // As `RedisModule_ModuleTypeSetValue`: a new value, without expiry.
        self.call.space.keys.borrow_mut().insert(
            self.name.to_vec(),
            Entry {
                value: Value::Limiter(Box::new(Stored::<_, L::Repr>::new(state))),
                expires_at: None,
            },
        );
    }

    fn with_string<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, Error> {
        match self
            .call
            .space
            .keys
            .borrow()
            .get(self.name)
            .map(|e| &e.value)
        {
            None => Ok(None),
            Some(Value::Other(bytes)) => Ok(Some(f(bytes))),
            Some(Value::Limiter(_)) => Err(Error::WrongType),
        }
    }

    fn set_string(&mut self, bytes: &[u8]) -> Result<(), Error> {
        let mut keys = self.call.space.keys.borrow_mut();
        let expires_at = keys.get(self.name).and_then(|e| e.expires_at);
        keys.insert(
            self.name.to_vec(),
            Entry {
                value: Value::Other(bytes.to_vec()),
                expires_at,
            },
        );
        Ok(())
    }

    fn expires_at(&self) -> Option<u64> {
        self.call.space.keys.borrow().get(self.name)?.expires_at
    }

    fn expire_at(&mut self, unix_ms: u64) {
        if let Some(entry) = self.call.space.keys.borrow_mut().get_mut(self.name) {
            entry.expires_at = Some(unix_ms);
        }
    }

    fn written(&mut self, event: &'static CStr, expiry_written: bool) {
        let mut effects = self.call.effects.borrow_mut();
        let event = event.to_str().unwrap_or("?").to_string();
        effects.events.push((self.name.to_vec(), event));
        if expiry_written {
            effects
                .events
                .push((self.name.to_vec(), "expire".to_string()));
        }
    }
}
