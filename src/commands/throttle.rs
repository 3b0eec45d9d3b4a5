//! `CL.THROTTLE key max_burst count period [quantity]`, redis-cell's
//! command, answered as redis-cell answers it, and `RL.THROTTLE`, the same
//! under the name proposed for Valkey's core (valkey-io/valkey#4081).
//!
//! The key holds what redis-cell stores, so that a server swaps one module's
//! `.so` for the other and keeps every limiter: a string, the theoretical
//! arrival time in Unix nanoseconds, expiring at that instant rounded up to
//! the millisecond. The arithmetic is the core crate's (`limiter::cell`).
//!
//! Not a row of the table of algorithms: it has no native type, no spec (a
//! policy or `RL.ALL` takes `TOKENBUCKET`, the same algorithm with the RL
//! reply) and no RL option; its reply is redis-cell's. What it shares with
//! the limiters is kept: the server's clock, `INFO` counters (`throttle_`),
//! the deny log, keyspace events and OOM refusal of a new key.
//!
//! Replication: an admitted call propagates the state it wrote, `SET key
//! <tat> PXAT <ms>`, so replicas and the AOF hold the master's very string
//! and expiry (redis-cell replays the call on the replica's clock). A
//! denial or a peek (`quantity 0`) writes and propagates nothing.

use std::ffi::CStr;

use super::host::{Host, Origin, Store};
use crate::args::parse_int;
use crate::deny_log;
use crate::error::Error;
use crate::limiter::{cell, Throttle, ThrottleParams, MAX_PARAM};
use crate::stats;

/// One name of the command.
pub struct Name {
    command: &'static CStr,
    /// Its keyspace event: the name in lower case.
    event: &'static CStr,
    /// redis-cell's reply to a wrong number of arguments, word for word.
    usage: &'static str,
}

/// redis-cell's name.
pub const CELL: Name = Name {
    command: c"CL.THROTTLE",
    event: c"cl.throttle",
    usage: "Cell error: Store error: Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]",
};

/// The name proposed for Valkey's core.
pub const RL: Name = Name {
    command: c"RL.THROTTLE",
    event: c"rl.throttle",
    usage: "Cell error: Store error: Usage: rl.throttle <key> <max_burst> <count per period> <period> [<quantity>]",
};

/// `CL.THROTTLE`.
pub fn cell<H: Host>(host: &H) -> Result<(), Error> {
    step(host, &CELL)
}

/// `RL.THROTTLE`.
pub fn rl<H: Host>(host: &H) -> Result<(), Error> {
    step(host, &RL)
}

#[inline(always)]
fn step<H: Host>(host: &H, name: &Name) -> Result<(), Error> {
    // Registered with any arity, as redis-cell is: it checks its own.
    if !(5..=6).contains(&host.argc()) {
        return Err(Error::Usage(name.usage));
    }
    let args = host.words::<6>()?;
    let max_burst = parse_int(args[2], "max_burst", 0, MAX_PARAM)?;
    let count = parse_int(args[3], "count", 1, MAX_PARAM)?;
    let period = parse_int(args[4], "period", 1, MAX_PARAM)?;
    let quantity = match args.get(5) {
        Some(word) => parse_int(word, "quantity", 0, MAX_PARAM)?,
        None => 1,
    };
    let params = ThrottleParams::new(max_burst, count, period)?;
    let now = host.now();
    // Before the key is opened (opening an expired key deletes it).
    if !params.fits_at(now) {
        return Err(Error::ClockOutOfRange);
    }
    let mut key = host.open_key(1);
    let tat = match key.with_string(|bytes| parse_int(bytes, "tat", 0, u64::MAX).ok())? {
        None => None,
        Some(Some(tat)) => Some(tat),
        Some(None) => return Err(Error::NotATime(Error::quote(args[1]))),
    };
    let t = cell::throttle(tat, &params, quantity, now).map_err(|_| Error::ClockOutOfRange)?;
    if let Some(new_tat) = t.new_tat_ns {
        if tat.is_none() && host.origin() == Origin::Client && host.out_of_memory() {
            return Err(Error::OutOfMemory);
        }
        let mut digits = [0u8; 20];
        key.set_string(decimal(new_tat, &mut digits))?;
        let expire_at = Throttle::expire_at_ms(new_tat);
        let expiry_written = key.expires_at() != Some(expire_at);
        if expiry_written {
            key.expire_at(expire_at);
        }
        host.propagate_string_set(1, new_tat, expire_at);
        key.written(name.event, expiry_written);
    }
    drop(key);
    stats::THROTTLE.record_outcome(!t.limited, quantity);
    if t.limited && quantity > 0 {
        deny_log::record(
            now.as_ms_floor(),
            args[1],
            &[name.command.to_bytes()],
            quantity,
            t.retry_after_ms,
        );
    }
    host.reply_integers(&[
        t.limited as i64,
        t.limit as i64,
        t.remaining as i64,
        t.retry_after_s,
        // At most 100 years of seconds.
        t.reset_after_s as i64,
    ]);
    Ok(())
}

/// `value` in decimal, in `buf` (no allocation).
fn decimal(mut value: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            return &buf[start..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::memory::Memory;
    use crate::limiter::Micros;

    const T0_US: u64 = 1_780_000_000_000_000;

    fn space() -> Memory {
        Memory::new(Micros::from_us(T0_US))
    }

    #[test]
    fn decimal_writes_every_digit() {
        let mut buf = [0u8; 20];
        assert_eq!(decimal(0, &mut buf), b"0");
        assert_eq!(
            decimal(1_780_000_000_123_456_789, &mut buf),
            b"1780000000123456789"
        );
        assert_eq!(decimal(u64::MAX, &mut buf), b"18446744073709551615");
    }

    #[test]
    fn an_admitted_call_stores_the_tat_and_propagates_it_as_set_pxat() {
        let m = space();
        let called = m.run(Origin::Client, "CL.THROTTLE user123 15 30 60");
        assert_eq!(called.integers(), Some(vec![0, 16, 15, -1, 2]));
        let tat = T0_US * 1000 + 2_000_000_000;
        let expire = tat / 1_000_000;
        let words: Vec<String> = called.effects.propagated[0]
            .iter()
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect();
        assert_eq!(
            words,
            [
                "SET",
                "user123",
                &tat.to_string(),
                "PXAT",
                &expire.to_string()
            ]
        );
        assert_eq!(
            called.effects.events,
            [
                (b"user123".to_vec(), "cl.throttle".to_string()),
                (b"user123".to_vec(), "expire".to_string())
            ]
        );
        assert_eq!(m.expiry(b"user123"), Some(expire));
        // A replica replaying it holds the same key.
        let replica = space();
        replica.replay(&called.effects.propagated);
        assert_eq!(replica.snapshot(), m.snapshot());
    }

    #[test]
    fn denials_and_peeks_write_and_propagate_nothing() {
        let m = space();
        m.run(Origin::Client, "RL.THROTTLE k 0 1 10");
        let before = m.snapshot();
        for call in [
            "RL.THROTTLE k 0 1 10",
            "RL.THROTTLE k 0 1 10 0",
            "CL.THROTTLE new 0 1 10 0",
        ] {
            let called = m.run(Origin::Client, call);
            assert_eq!(called.result, Ok(()), "{call}");
            assert!(called.effects.propagated.is_empty(), "{call}");
            assert!(called.effects.events.is_empty(), "{call}");
        }
        assert_eq!(m.snapshot(), before);
    }

    #[test]
    fn a_key_redis_cell_wrote_is_continued() {
        let m = space();
        // redis-cell's state: 3 units of 5 taken (1 per second) at T0.
        let tat = T0_US * 1000 + 3_000_000_000;
        m.set_other(b"k", tat.to_string().as_bytes());
        let called = m.run(Origin::Client, "CL.THROTTLE k 4 1 1");
        assert_eq!(called.integers(), Some(vec![0, 5, 1, -1, 4]));
    }

    #[test]
    fn errors_name_the_argument_or_the_key_and_change_nothing() {
        let m = space();
        m.set_other(b"text", b"hello");
        m.set_other(b"empty", b"");
        let cases = [
            ("CL.THROTTLE k 1 1", CELL.usage.to_string()),
            ("RL.THROTTLE k 1 1 1 1 1", RL.usage.to_string()),
            ("CL.THROTTLE", CELL.usage.to_string()),
            (
                "CL.THROTTLE k x 1 1",
                "ERR max_burst must be an integer from 0 to 1099511627776".into(),
            ),
            (
                "CL.THROTTLE k -1 1 1",
                "ERR max_burst must be an integer from 0 to 1099511627776".into(),
            ),
            (
                "CL.THROTTLE k 1 0 1",
                "ERR count must be an integer from 1 to 1099511627776".into(),
            ),
            (
                "CL.THROTTLE k 1 1 0",
                "ERR period must be an integer from 1 to 1099511627776".into(),
            ),
            (
                "CL.THROTTLE k 1 1 1 -1",
                "ERR quantity must be an integer from 0 to 1099511627776".into(),
            ),
            (
                "CL.THROTTLE k 1 2000000000 1",
                "ERR period / count (the time one unit takes to come back) must be at least 1 ns (the state counts nanoseconds)".into(),
            ),
            (
                "CL.THROTTLE k 1000000 1 86400",
                "ERR (max_burst + 1) * period / count (the time to fill the bucket) must be at most 100 years (3155760000 s)".into(),
            ),
            (
                "CL.THROTTLE text 1 1 1",
                "ERR key 'text' holds a string that is not a CL.THROTTLE state (a time in Unix nanoseconds)".into(),
            ),
            (
                "CL.THROTTLE empty 1 1 1 0",
                "ERR key 'empty' holds a string that is not a CL.THROTTLE state (a time in Unix nanoseconds)".into(),
            ),
        ];
        let before = m.snapshot();
        for (call, message) in cases {
            let called = m.run(Origin::Client, call);
            assert_eq!(
                called.result.map_err(|e| e.message()),
                Err(message),
                "{call}"
            );
            assert!(called.effects.propagated.is_empty(), "{call}");
        }
        m.run(Origin::Client, "RL.TOKENBUCKET tb 5 1 1000");
        let called = m.run(Origin::Client, "CL.THROTTLE tb 1 1 1");
        assert_eq!(called.result, Err(Error::WrongType));
        assert_eq!(m.snapshot().len(), before.len() + 1);
    }

    #[test]
    fn a_new_key_is_refused_when_out_of_memory_but_an_existing_one_goes_on() {
        let m = space();
        m.run(Origin::Client, "CL.THROTTLE old 9 1 1");
        m.set_out_of_memory(true);
        assert_eq!(
            m.run(Origin::Client, "CL.THROTTLE new 9 1 1").result,
            Err(Error::OutOfMemory)
        );
        assert_eq!(
            m.run(Origin::Client, "CL.THROTTLE new 9 1 1 0").result,
            Ok(())
        );
        let called = m.run(Origin::Client, "CL.THROTTLE old 9 1 1");
        assert_eq!(called.integers(), Some(vec![0, 10, 8, -1, 2]));
    }
}
