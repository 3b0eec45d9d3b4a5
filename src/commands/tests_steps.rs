//! The command steps on an in-memory key space: what each call writes,
//! expires, propagates and replies, without a server (the black-box tests in
//! `tests/integration/` check the same against real servers).
//!
//! Policies and the deny log are the module's global state, shared by the
//! tests of this binary: each test uses its own key and policy names.

use proptest::prelude::*;

use super::host::Origin::{self, Client, Replicated};
use super::memory::{Memory, Reply};
use crate::error::Error;
use crate::limiter::{FixedWindow, Micros, SlidingLog, TokenBucket};

/// November 2023, on a millisecond and a bit.
const T0_US: u64 = 1_700_000_000_123_456;

fn space() -> Memory {
    Memory::new(Micros::from_us(T0_US))
}

fn words(called: &[Vec<u8>]) -> String {
    called
        .iter()
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn an_admission_creates_the_key_with_its_expiry_and_propagates_the_pinned_call() {
    let m = space();
    let called = m.run(Client, "RL.TOKENBUCKET seam:tb 5 1 1000");
    assert_eq!(called.result, Ok(()));
    assert_eq!(called.integers(), Some(vec![1, 5, 4, 0, 1000]));
    let propagated: Vec<String> = called.effects.propagated.iter().map(|c| words(c)).collect();
    assert_eq!(
        propagated,
        [format!("RL.TOKENBUCKET seam:tb 5 1 1000 COST 1 AT {T0_US}")]
    );
    assert_eq!(
        called.effects.events,
        [
            (b"seam:tb".to_vec(), "rl.tokenbucket".to_string()),
            (b"seam:tb".to_vec(), "expire".to_string()),
        ]
    );
    // Idle again once the token is back: 1 s after now, rounded up to the ms.
    assert_eq!(m.expiry(b"seam:tb"), Some(T0_US / 1000 + 1001));
    assert!(m.state::<TokenBucket>(b"seam:tb").is_some());
}

#[test]
fn a_denial_or_a_peek_writes_propagates_and_signals_nothing() {
    let m = space();
    assert_eq!(
        m.run(Client, "RL.FIXEDWINDOW seam:fw 1 1000").result,
        Ok(())
    );
    let before = m.snapshot();
    for call in [
        "RL.FIXEDWINDOW seam:fw 1 1000",
        "RL.FIXEDWINDOW seam:fw 1 1000 COST 0",
        "RL.FIXEDWINDOW seam:other 1 1000 COST 0",
    ] {
        let called = m.run(Client, call);
        assert_eq!(called.result, Ok(()), "{call}");
        assert!(called.effects.propagated.is_empty(), "{call}");
        assert!(called.effects.events.is_empty(), "{call}");
        assert_eq!(m.snapshot(), before, "{call}");
    }
    let denied = m.run(Client, "RL.FIXEDWINDOW seam:fw 1 1000");
    assert_eq!(denied.integers().map(|r| r[0]), Some(0));
}

#[test]
fn an_error_writes_nothing_in_any_key() {
    let m = space();
    m.run(Client, "RL.TOKENBUCKET seam:e1 5 1 1000");
    m.set_other(b"seam:str", b"hello");
    let before = m.snapshot();
    for (call, error) in [
        ("RL.TOKENBUCKET seam:e1 0 1 1000", "capacity"),
        ("RL.TOKENBUCKET seam:e2 5 1 1000 COST x", "COST"),
        ("RL.TOKENBUCKET seam:e2 5 1 1000 AT 5", "AT"),
        ("RL.SLIDING seam:str 5 1000", "WRONGTYPE"),
        // The second limiter is the wrong type: the first keeps its tokens.
        (
            "RL.ALL 2 seam:e1 seam:str TOKENBUCKET 5 1 1000 FIXEDWINDOW 5 1000",
            "WRONGTYPE",
        ),
        // A spec the call cannot parse, after one that would admit.
        (
            "RL.ALL 2 seam:e1 seam:e3 TOKENBUCKET 5 1 1000 SLIDING 5",
            "spec 2",
        ),
        ("RL.SETSTATE seam:e1 TOKENBUCKET 1 5 0 0", "RL.SETSTATE"),
        ("RL.TOKENBUCKET seam:e1 5 1", "arguments"),
    ] {
        let called = m.run(Client, call);
        let message = called.result.expect_err(call).message();
        assert!(message.contains(error), "{call}: {message}");
        assert!(called.effects.propagated.is_empty(), "{call}");
        assert!(called.effects.reply.is_empty(), "{call}");
        assert_eq!(m.snapshot(), before, "{call}");
    }
}

#[test]
fn out_of_memory_refuses_a_new_key_but_serves_existing_ones() {
    let m = space();
    m.run(Client, "RL.TOKENBUCKET seam:oom1 5 1 1000");
    m.set_out_of_memory(true);
    let before = m.snapshot();
    let new = m.run(Client, "RL.TOKENBUCKET seam:oom2 5 1 1000");
    assert_eq!(new.result, Err(Error::OutOfMemory));
    assert_eq!(m.snapshot(), before);
    // A peek at a missing key creates nothing: no OOM.
    let peek = m.run(Client, "RL.TOKENBUCKET seam:oom2 5 1 1000 COST 0");
    assert_eq!(peek.integers(), Some(vec![1, 5, 5, 0, 0]));
    // An existing key takes its units.
    let existing = m.run(Client, "RL.TOKENBUCKET seam:oom1 5 1 1000");
    assert_eq!(existing.integers().map(|r| r[2]), Some(3));
    // The master accepted a replicated call: it is applied.
    let replicated = m.run(
        Replicated,
        &format!("RL.TOKENBUCKET seam:oom3 5 1 1000 COST 1 AT {T0_US}"),
    );
    assert_eq!(replicated.result, Ok(()));
    assert!(m.state::<TokenBucket>(b"seam:oom3").is_some());
}

#[test]
fn rl_all_that_would_create_a_key_fails_whole_out_of_memory() {
    // The defect of issue 10: the existing key was written before the new
    // one failed.
    let m = space();
    m.run(Client, "RL.TOKENBUCKET seam:all-old 10 1 1000");
    m.set_out_of_memory(true);
    let before = m.snapshot();
    for call in [
        "RL.ALL 2 seam:all-old seam:all-new TOKENBUCKET 10 1 1000 TOKENBUCKET 10 1 1000",
        "RL.ALL 2 seam:all-old seam:all-new TOKENBUCKET 10 1 1000 TOKENBUCKET 10 1 1000 COST 2 FORCE",
    ] {
        let called = m.run(Client, call);
        assert_eq!(called.result, Err(Error::OutOfMemory), "{call}");
        assert!(called.effects.propagated.is_empty());
        assert_eq!(m.snapshot(), before, "{call}");
    }
    m.set_out_of_memory(false);
    let called = m.run(
        Client,
        "RL.ALL 2 seam:all-old seam:all-new TOKENBUCKET 10 1 1000 TOKENBUCKET 10 1 1000",
    );
    assert_eq!(called.integers().map(|r| r[2]), Some(8), "9 left before");
}

#[test]
fn rl_all_denied_anywhere_changes_nothing_anywhere() {
    let m = space();
    m.run(Client, "RL.FIXEDWINDOW seam:g 1 1000");
    let before = m.snapshot();
    let called = m.run(
        Client,
        "RL.ALL 2 seam:u seam:g TOKENBUCKET 5 1 1000 FIXEDWINDOW 1 1000",
    );
    assert_eq!(called.result, Ok(()));
    let reply = called.integers().expect("six integers");
    assert_eq!((reply[0], reply[5]), (0, 2), "denied by the second");
    assert!(called.effects.propagated.is_empty());
    assert_eq!(m.snapshot(), before, "the user keeps their tokens");
    // Admitted: each limiter goes out as its own pinned call.
    m.set_now(Micros::from_us(T0_US + 1_000_000));
    let called = m.run(
        Client,
        "RL.ALL 2 seam:u seam:g TOKENBUCKET 5 1 1000 FIXEDWINDOW 1 1000",
    );
    let at = T0_US + 1_000_000;
    let propagated: Vec<String> = called.effects.propagated.iter().map(|c| words(c)).collect();
    assert_eq!(
        propagated,
        [
            // The global window's key expired with its window.
            "DEL seam:g".to_string(),
            format!("RL.TOKENBUCKET seam:u 5 1 1000 COST 1 AT {at}"),
            format!("RL.FIXEDWINDOW seam:g 1 1000 COST 1 AT {at}"),
        ]
    );
}

#[test]
fn setstate_is_for_the_master_and_the_aof_and_sets_no_expiry() {
    let m = space();
    m.run(Client, "RL.FIXEDWINDOW seam:src 5 1000");
    let (_, _, encoded, _) = m.snapshot().remove(0);
    let encoded: Vec<String> = encoded.iter().map(u64::to_string).collect();
    let fields = format!("RL.SETSTATE seam:set FIXEDWINDOW 1 {}", encoded.join(" "));
    let fields = fields.as_str();
    let refused = m.run(Client, fields);
    assert_eq!(
        refused.result,
        Err(Error::ReservedForReplication("RL.SETSTATE"))
    );
    let set = m.run(Replicated, fields);
    assert_eq!(set.result, Ok(()));
    assert_eq!(set.effects.reply, [Reply::Simple("OK")]);
    assert_eq!(set.effects.propagated.len(), 1, "verbatim");
    assert_eq!(
        m.state::<FixedWindow>(b"seam:set"),
        m.state::<FixedWindow>(b"seam:src")
    );
    assert_eq!(m.expiry(b"seam:set"), None);
    // A state that does not validate sets nothing.
    let bad = m.run(Replicated, "RL.SETSTATE seam:bad FIXEDWINDOW 1 1 2 3 4 5 6");
    assert_eq!(bad.result, Err(Error::BadState));
    assert_eq!(m.snapshot().len(), 2);
}

#[test]
fn a_policy_call_propagates_the_policy_s_limiter_with_its_parameters() {
    let m = space();
    let set = m.run(Client, "RL.POLICY SET seam-policy SLIDING 2 1000");
    assert_eq!(set.effects.reply, [Reply::Simple("OK")]);
    let called = m.run(Client, "RL.HIT seam-policy seam:hit");
    // The entry counts from its millisecond (1000.544 ms from now), reset_ms
    // from the request: the window.
    assert_eq!(called.integers(), Some(vec![1, 2, 1, 0, 1000]));
    assert_eq!(
        called
            .effects
            .propagated
            .iter()
            .map(|c| words(c))
            .collect::<Vec<_>>(),
        [format!("RL.SLIDING seam:hit 2 1000 COST 1 AT {T0_US}")]
    );
    assert_eq!(called.effects.events[0].1, "rl.hit");
    assert!(m.state::<SlidingLog>(b"seam:hit").is_some());
    assert_eq!(
        m.run(Client, "RL.POLICY DEL seam-policy").effects.reply,
        [Reply::Integer(1)]
    );
    let gone = m.run(Client, "RL.HIT seam-policy seam:hit");
    assert!(gone.result.unwrap_err().message().contains("seam-policy"));
}

/// One call of a replication test: a command template and how far the
/// clock moves before it.
fn calls() -> impl Strategy<Value = Vec<(usize, u64, u64)>> {
    proptest::collection::vec((0..CALLS.len(), 0u64..1500, 0u64..4), 1..40)
}

/// Calls over a few keys, `{c}` a cost, `{u}` an `UPTO` (one more):
/// every algorithm, several limiters, a policy, FORCE, REFUND and UPTO.
const CALLS: [&str; 13] = [
    "RL.TOKENBUCKET r:{k} 3 1 400 UPTO {u}",
    "RL.ALL 2 r:sl r:g SLIDING 4 1000 FIXEDWINDOW 6 1000 UPTO {u}",
    "RL.HIT seam-replay r:p UPTO {u}",
    "RL.TOKENBUCKET r:{k} 3 1 400 COST {c}",
    "RL.FIXEDWINDOW r:{k} 3 500 COST {c}",
    "RL.LEAKYBUCKET r:lb 3 1 300 COST {c}",
    "RL.SLIDING r:sl 4 1000 COST {c}",
    "RL.HASHWINDOW r:hw 4 1000 250 COST {c}",
    "RL.ALL 2 r:sl r:g SLIDING 4 1000 FIXEDWINDOW 6 1000 COST {c}",
    "RL.ALL 2 r:hw r:p HASHWINDOW 4 1000 250 POLICY seam-replay",
    "RL.HIT seam-replay r:p COST {c}",
    "RL.TOKENBUCKET r:{k} 3 1 400 COST {c} FORCE",
    "RL.SLIDING r:sl 4 1000 REFUND {c}",
];

proptest! {
    /// What a master propagates brings a replica to the master's key space
    /// exactly, whatever the replica's own clock reads.
    #[test]
    fn what_the_master_propagates_brings_a_replica_to_the_same_keys(script in calls()) {
        let master = space();
        master.run(Client, "RL.POLICY SET seam-replay TOKENBUCKET 2 1 700");
        let replica = Memory::new(Micros::from_us(T0_US - 5_000_000));
        let mut now = T0_US;
        for (i, (call, advance_ms, cost)) in script.into_iter().enumerate() {
            now += advance_ms * 1000 + 17;
            master.set_now(Micros::from_us(now));
            let text = CALLS[call]
                .replace("{c}", &cost.to_string())
                .replace("{u}", &(cost + 1).to_string())
                .replace("{k}", &(i % 2).to_string());
            let called = master.run(Client, &text);
            // A refund of more than was taken is fine; only a wrong-type key
            // (the two FIXEDWINDOW/TOKENBUCKET keys share names) may fail.
            if let Err(error) = &called.result {
                prop_assert_eq!(error, &Error::WrongType, "{}", text);
            }
            // The replica's clock lags and jumps: nothing it replays reads it.
            replica.set_now(Micros::from_us(now - 5_000_000 + (i as u64 % 3) * 1_000_000));
            let again = replica.replay(&called.effects.propagated);
            // Pinned calls replayed propagate themselves, unchanged (a
            // replica's replicas and its AOF).
            prop_assert_eq!(&again, &called.effects.propagated);
            replica.set_now(Micros::from_us(now));
            prop_assert_eq!(replica.snapshot(), master.snapshot(), "after {}", text);
        }
    }
}

#[test]
fn a_limiter_key_of_another_algorithm_is_the_wrong_type() {
    let m = space();
    let state = m.run(Client, "RL.SLIDING seam:sl-src 5 1000");
    assert_eq!(state.result, Ok(()));
    let held = m.state::<SlidingLog>(b"seam:sl-src").expect("a state");
    m.insert::<SlidingLog>(b"seam:sl", held);
    let called = m.run(Client, "RL.TOKENBUCKET seam:sl 5 1 1000");
    assert_eq!(called.result, Err(Error::WrongType));
    let same = m.run(Client, "RL.SLIDING seam:sl 5 1000");
    assert_eq!(same.integers().map(|r| r[2]), Some(3));
}

#[test]
fn a_key_found_expired_is_deleted_and_the_deletion_propagated_first() {
    let m = space();
    m.run(Client, "RL.FIXEDWINDOW seam:exp 5 1000");
    m.set_now(Micros::from_us(T0_US + 2_000_000));
    let called = m.run(Client, "RL.FIXEDWINDOW seam:exp 5 1000");
    let propagated: Vec<String> = called.effects.propagated.iter().map(|c| words(c)).collect();
    assert_eq!(
        propagated,
        [
            "DEL seam:exp".to_string(),
            format!(
                "RL.FIXEDWINDOW seam:exp 5 1000 COST 1 AT {}",
                T0_US + 2_000_000
            ),
        ]
    );
    assert_eq!(called.integers().map(|r| r[2]), Some(4), "a new window");
}

#[test]
fn a_step_reads_the_host_s_origin() {
    // `AT` pins the time only for replicated calls.
    let m = space();
    let call = "RL.TOKENBUCKET seam:at 5 1 1000 COST 1 AT 1700000000000000";
    for (origin, ok) in [(Origin::Client, false), (Origin::Replicated, true)] {
        assert_eq!(m.run(origin, call).result.is_ok(), ok, "{origin:?}");
    }
}

/// `RL.CONCURRENCY`: the reply carries the lease, which `RL.RELEASE` ends
/// once; both propagate pinned, and a replica replaying them reaches the
/// same key with the same lease ids.
#[test]
fn a_lease_is_granted_released_once_and_replicated_with_its_id() {
    use crate::limiter::Concurrency;
    let (m, replica) = (space(), space());
    let granted = m.run(Client, "RL.CONCURRENCY seam:cc 2 1000 COST 2");
    assert_eq!(
        granted.integers(),
        Some(vec![1, 2, 0, 0, 1000, T0_US as i64])
    );
    assert_eq!(
        words(&granted.effects.propagated[0]),
        format!("RL.CONCURRENCY seam:cc 2 1000 COST 2 AT {T0_US}")
    );
    replica.replay(&granted.effects.propagated);
    let denied = m.run(Client, "RL.CONCURRENCY seam:cc 2 1000");
    assert_eq!(denied.integers(), Some(vec![0, 2, 0, 1000, 1000, 0]));
    assert!(denied.effects.propagated.is_empty());
    let before = m.snapshot();
    for (call, reply) in [
        ("RL.RELEASE seam:cc 12345", 0),
        ("RL.RELEASE seam:missing 1", 0),
        ("RL.RENEW seam:cc 0 100", 0),
    ] {
        let called = m.run(Client, call);
        assert_eq!(called.effects.reply, [Reply::Integer(reply)], "{call}");
        assert!(called.effects.propagated.is_empty(), "{call}");
        assert!(called.effects.events.is_empty(), "{call}");
    }
    assert_eq!(m.snapshot(), before);
    m.set_now(Micros::from_us(T0_US + 500_000));
    let renewed = m.run(Client, &format!("RL.RENEW seam:cc {T0_US} 2000"));
    assert_eq!(renewed.effects.reply, [Reply::Integer(1)]);
    assert_eq!(
        words(&renewed.effects.propagated[0]),
        format!("RL.RENEW seam:cc {T0_US} 2000 AT {}", T0_US + 500_000)
    );
    assert_eq!(
        m.expiry(b"seam:cc"),
        Some((T0_US + 2_500_000).div_ceil(1000))
    );
    replica.replay(&renewed.effects.propagated);
    assert_eq!(
        m.state::<Concurrency>(b"seam:cc"),
        replica.state::<Concurrency>(b"seam:cc")
    );
    assert_eq!(m.expiry(b"seam:cc"), replica.expiry(b"seam:cc"));
    let released = m.run(Client, &format!("RL.RELEASE seam:cc {T0_US}"));
    assert_eq!(released.effects.reply, [Reply::Integer(1)]);
    assert_eq!(
        released.effects.events,
        [
            (b"seam:cc".to_vec(), "rl.release".to_string()),
            (b"seam:cc".to_vec(), "expire".to_string()),
        ]
    );
    replica.replay(&released.effects.propagated);
    assert_eq!(
        m.run(Client, &format!("RL.RELEASE seam:cc {T0_US}"))
            .effects
            .reply,
        [Reply::Integer(0)],
        "a lease ends once"
    );
    // The last lease released: the key was idle and is gone.
    assert_eq!(m.state::<Concurrency>(b"seam:cc"), None);
}

/// Bad input names the argument and writes nothing; `AT` is the master's.
#[test]
fn lease_commands_refuse_bad_input_and_write_nothing() {
    let m = space();
    m.run(Client, "RL.CONCURRENCY seam:cce 2 1000");
    m.set_other(b"seam:cce-str", b"x");
    let before = m.snapshot();
    for (call, error) in [
        (
            "RL.RELEASE seam:cce x",
            "ERR lease must be an integer from 0 to 9223372036854775807",
        ),
        (
            "RL.RELEASE seam:cce -1",
            "ERR lease must be an integer from 0 to 9223372036854775807",
        ),
        (
            "RL.RENEW seam:cce 1 0",
            "ERR lease_ms must be an integer from 1 to 1099511627776",
        ),
        (
            "RL.RENEW seam:cce 1 1099511627777",
            "ERR lease_ms must be an integer from 1 to 1099511627776",
        ),
        (
            "RL.RELEASE seam:cce 1 FOO",
            "ERR unknown option 'FOO' (this command takes no options)",
        ),
        (
            "RL.RELEASE seam:cce 1 AT 5",
            "ERR AT is reserved for replication and AOF loading",
        ),
        (
            "RL.RELEASE seam:cce-str 1",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
        (
            "RL.CONCURRENCY seam:cce 0 1000",
            "ERR limit must be an integer from 1 to 16777215",
        ),
        (
            "RL.CONCURRENCY seam:cce 2 0",
            "ERR lease_ms must be an integer from 1 to 1099511627776",
        ),
        (
            "RL.ALL 1 seam:cce CONCURRENCY 2 1000",
            "ERR spec 1: CONCURRENCY cannot be used here",
        ),
        (
            "RL.TOKENBUCKET seam:cce 5 1 1000",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
    ] {
        let called = m.run(Client, call);
        assert_eq!(
            called.result.map_err(|e| e.message()),
            Err(error.to_string()),
            "{call}"
        );
        assert!(called.effects.propagated.is_empty(), "{call}");
    }
    assert_eq!(m.snapshot(), before);
    assert_eq!(
        m.run(Client, "RL.RELEASE seam:cce").result,
        Err(Error::Arity)
    );
    assert_eq!(
        m.run(Client, "RL.RENEW seam:cce 1").result,
        Err(Error::Arity)
    );
}

/// A policy of `CONCURRENCY` answers with the lease; `RL.ALL` refuses it.
#[test]
fn a_concurrency_policy_grants_leases_and_rl_all_refuses_it() {
    let m = space();
    m.run(Client, "RL.POLICY SET seam-cc CONCURRENCY 1 1000");
    let hit = m.run(Client, "RL.HIT seam-cc seam:ccp");
    assert_eq!(hit.integers(), Some(vec![1, 1, 0, 0, 1000, T0_US as i64]));
    assert_eq!(
        words(&hit.effects.propagated[0]),
        format!("RL.CONCURRENCY seam:ccp 1 1000 COST 1 AT {T0_US}")
    );
    let all = m.run(Client, "RL.ALL 1 seam:ccq POLICY seam-cc");
    assert_eq!(
        all.result.map_err(|e| e.message()),
        Err("ERR spec 1: policy 'seam-cc' is CONCURRENCY, which cannot be used here".to_string())
    );
}

/// `RL.QUOTA` through its step at chosen instants: the calendar of each
/// zone, the end the master propagates, and replicas that never read a
/// time-zone database.
mod quota {
    use super::*;
    use crate::limiter::Quota;

    fn us(text: &str) -> u64 {
        let ts: jiff::Timestamp = text.parse().expect("a timestamp");
        ts.as_microsecond() as u64
    }
    fn at(text: &str) -> Memory {
        Memory::new(Micros::from_us(us(text)))
    }
    /// The reply's `reset_ms` after one admission at `now` in `zone`.
    fn reset_ms(now: &str, call: &str) -> i64 {
        let m = at(now);
        let called = m.run(Client, call);
        assert_eq!(called.result, Ok(()), "{call}");
        called.integers().expect("integers")[4]
    }
    const HOUR: i64 = 3_600_000;

    #[test]
    fn days_end_at_midnight_of_their_zone_with_23_and_25_hour_days() {
        let call = |zone: &str| format!("RL.QUOTA seam:q 5 DAY TZ {zone}");
        // 2026-03-08 12:00 UTC.
        assert_eq!(reset_ms("2026-03-08T12:00:00Z", &call("UTC")), 12 * HOUR);
        assert_eq!(
            reset_ms("2026-03-08T12:00:00Z", "RL.QUOTA seam:q 5 DAY"),
            12 * HOUR
        );
        // +05:30: the day ends at 18:30 UTC.
        assert_eq!(
            reset_ms("2026-03-08T12:00:00Z", &call("+05:30")),
            6 * HOUR + HOUR / 2
        );
        // New York's 2026-03-08 (23 hours) started at 05:00 UTC.
        assert_eq!(
            reset_ms("2026-03-08T05:00:00Z", &call("America/New_York")),
            23 * HOUR
        );
        // 2026-11-01 (25 hours) started at 04:00 UTC.
        assert_eq!(
            reset_ms("2026-11-01T04:00:00Z", &call("America/New_York")),
            25 * HOUR
        );
    }

    #[test]
    fn months_leap_days_and_iso_weeks_across_a_year_end() {
        assert_eq!(
            reset_ms("2028-02-29T00:00:00Z", "RL.QUOTA seam:q 5 MONTH"),
            24 * HOUR
        );
        assert_eq!(
            reset_ms("2028-02-01T00:00:00Z", "RL.QUOTA seam:q 5 MONTH"),
            29 * 24 * HOUR
        );
        // Thursday 2026-12-31: its ISO week ends on Monday 2027-01-04.
        assert_eq!(
            reset_ms("2026-12-31T00:00:00Z", "RL.QUOTA seam:q 5 WEEK"),
            4 * 24 * HOUR
        );
        assert_eq!(
            reset_ms("2026-12-31T23:00:00Z", "RL.QUOTA seam:q 5 YEAR"),
            HOUR
        );
    }

    #[test]
    fn the_master_propagates_the_end_and_a_replica_never_reads_a_zone() {
        let m = at("2026-11-01T12:00:00Z");
        let called = m.run(Client, "RL.QUOTA seam:qr 2 DAY TZ America/New_York COST 2");
        assert_eq!(called.integers(), Some(vec![1, 2, 0, 0, 17 * HOUR]));
        let end = us("2026-11-02T05:00:00Z");
        let propagated: Vec<String> = called.effects.propagated.iter().map(|c| words(c)).collect();
        assert_eq!(
            propagated,
            [format!(
                "RL.QUOTA seam:qr 2 DAY COST 2 AT {} END {end}",
                us("2026-11-01T12:00:00Z")
            )]
        );
        // The replica gets no zone: the end alone makes the same state.
        let replica = Memory::new(Micros::from_us(0));
        replica.replay(&called.effects.propagated);
        assert_eq!(
            replica.state::<Quota>(b"seam:qr"),
            m.state::<Quota>(b"seam:qr")
        );
        assert_eq!(replica.expiry(b"seam:qr"), m.expiry(b"seam:qr"));
        assert_eq!(m.expiry(b"seam:qr"), Some(end / 1000));
        // A client may not say where a period ends.
        assert_eq!(
            m.run(Client, "RL.QUOTA seam:qr 2 DAY END 5").result,
            Err(Error::ReservedForReplication("END"))
        );
    }

    #[test]
    fn a_denial_waits_until_the_next_period_and_a_new_zone_keeps_the_count() {
        let m = at("2026-03-08T20:00:00Z");
        assert_eq!(
            m.run(Client, "RL.QUOTA seam:qz 1 DAY").integers().unwrap()[0],
            1
        );
        let denied = m.run(Client, "RL.QUOTA seam:qz 1 DAY TZ America/New_York");
        // Still counting in the UTC day, which ends in 4 hours.
        assert_eq!(denied.integers(), Some(vec![0, 1, 0, 4 * HOUR, 4 * HOUR]));
        assert!(denied.effects.propagated.is_empty());
        // Bad zones and periods name their argument.
        for (call, error) in [
            ("RL.QUOTA seam:qz 1 FORTNIGHT", "period must be one of DAY, WEEK, MONTH, YEAR, not 'FORTNIGHT'"),
            ("RL.QUOTA seam:qz 1 DAY TZ Mars/Olympus", "TZ must be UTC, a fixed offset such as +05:30, or a time zone name such as America/New_York, not 'Mars/Olympus'"),
        ] {
            let result = m.run(Client, call).result;
            assert_eq!(result.map_err(|e| e.message()), Err(format!("ERR {error}")), "{call}");
        }
        assert_eq!(
            m.run(Client, "RL.TOKENBUCKET seam:qt 1 1 1 TZ UTC")
                .result
                .map_err(|e| e.message()),
            Err(
                "ERR unknown option 'TZ' (expected COST, FORCE, REFUND, UPTO or BLOCK)".to_string()
            )
        );
    }
}

/// The contract lets a key expire up to `min(reset_ms, 1 s)` after it is
/// idle: a busy key keeps its expiry while it lies in that slack, and when it
/// must move it is set at the slack's far end, so that the next calls keep it.
#[test]
fn a_busy_key_keeps_its_expiry_within_the_slack() {
    let m = space();
    let call = "RL.SLIDING seam:slack 100 60000";
    let expires = |m: &Memory| m.expiry(b"seam:slack").expect("an expiry") as i64;
    let now_ms = |m: &Memory| m.now().as_ms_floor() as i64;
    let first = m.run(Client, call);
    // A new key expires when it is idle, to the millisecond.
    let reset = first.integers().unwrap()[4];
    assert!((expires(&m) - (now_ms(&m) + reset)).abs() <= 1);
    let e0 = expires(&m);
    // 10 ms later the idle instant moved past it: written at the far end.
    m.set_now(m.now().saturating_add_ms(10));
    let second = m.run(Client, call);
    let reset = second.integers().unwrap()[4];
    let e1 = expires(&m);
    assert!(
        e1 >= now_ms(&m) + reset && e1 <= now_ms(&m) + reset + 1001,
        "{e1}"
    );
    assert!(e1 >= e0 + 1000);
    assert!(second.effects.events.iter().any(|(_, e)| e == "expire"));
    // Another 10 ms: still within the slack, so the expiry stays, unwritten.
    m.set_now(m.now().saturating_add_ms(10));
    let third = m.run(Client, call);
    assert_eq!(third.integers().unwrap()[0], 1);
    assert_eq!(expires(&m), e1);
    assert!(!third.effects.events.iter().any(|(_, e)| e == "expire"));
    // A replica replaying the pinned calls keeps the same expiry.
    let replica = Memory::new(Micros::from_us(0));
    for called in [&first, &second, &third] {
        replica.replay(&called.effects.propagated);
    }
    assert_eq!(replica.expiry(b"seam:slack"), m.expiry(b"seam:slack"));
}

// ---------------------------------------------------------------------------
// The protection loop

/// A `STATS` (or `RL.OUTCOME`) reply's value of `name` at the top level, or
/// in `current` / `last` (`within`).
fn stat(reply: &[Reply], within: Option<&str>, name: &str) -> i64 {
    let start = match within {
        Some(list) => {
            reply
                .iter()
                .position(|r| *r == Reply::Bulk(list.as_bytes().to_vec()))
                .expect("the window's list")
                + 1
        }
        None => 0,
    };
    let at = reply[start..]
        .iter()
        .position(|r| *r == Reply::Bulk(name.as_bytes().to_vec()))
        .unwrap_or_else(|| panic!("{name} in {reply:?}"));
    match reply[start + at + 1] {
        Reply::Integer(v) => v,
        ref other => panic!("{name}: {other:?}"),
    }
}

fn propagated(called: &super::memory::Called) -> Vec<String> {
    called.effects.propagated.iter().map(|c| words(c)).collect()
}

/// The scale and the stage `RL.POLICY STATS` shows.
fn scale_stage(m: &Memory, name: &str) -> (i64, i64) {
    let s = m.run(Client, &format!("RL.POLICY STATS {name}"));
    assert_eq!(s.result, Ok(()));
    (
        stat(&s.effects.reply, None, "scale"),
        stat(&s.effects.reply, None, "stage"),
    )
}

#[test]
fn rl_hit_propagates_the_loop_state_exactly_when_a_window_changes_it() {
    let m = space();
    let ms = |n: u64| Micros::from_us(T0_US + n * 1000);
    let set = m.run(
        Client,
        "RL.POLICY SET seam-loop TOKENBUCKET 100 100 1000000 ADAPT ERRORS 5 MINCALLS 10 STAGES 30 50 WINDOW 1000",
    );
    assert_eq!(set.result, Ok(()));
    // The first window: 123 ms in, it ends 877 ms from now.
    let first = m.run(Client, "RL.HIT seam-loop seam:loop");
    assert_eq!(
        propagated(&first),
        [format!(
            "RL.TOKENBUCKET seam:loop 100 100 1000000 COST 1 AT {T0_US}"
        )]
    );
    // 10% errors reported: counted, nothing propagated.
    let out = m.run(Client, "RL.OUTCOME seam-loop 90 10");
    assert_eq!(out.result, Ok(()));
    assert!(out.effects.propagated.is_empty());
    assert_eq!(stat(&out.effects.reply, Some("current"), "ok"), 90);
    assert_eq!(stat(&out.effects.reply, Some("current"), "errors"), 10);
    assert_eq!(stat(&out.effects.reply, Some("current"), "calls"), 1);
    // Still in the window: no evaluation.
    m.set_now(ms(876));
    let still = m.run(Client, "RL.HIT seam-loop seam:loop");
    assert_eq!(propagated(&still).len(), 1, "{:?}", propagated(&still));
    // The first call after its end: the window's result, then the call at
    // the new scale.
    m.set_now(ms(877));
    let next = m.run(Client, "RL.HIT seam-loop seam:loop");
    let at = T0_US + 877_000;
    assert_eq!(
        propagated(&next),
        [
            "RL.LOOPSTATE seam-loop 80 0".to_string(),
            format!("RL.TOKENBUCKET seam:loop 80 80 1000000 COST 1 AT {at}"),
        ]
    );
    assert_eq!(next.integers().unwrap()[1], 80);
    assert_eq!(scale_stage(&m, "seam-loop"), (80, 0));
    // A window that changes nothing (no outcomes, no denials): no state.
    m.set_now(ms(1877));
    let same = m.run(Client, "RL.HIT seam-loop seam:loop");
    assert_eq!(propagated(&same).len(), 1, "{:?}", propagated(&same));
    // Denials above 50% of the window's calls: stage 2, propagated by the
    // call that meets the end, be it an RL.OUTCOME.
    for _ in 0..3 {
        let denied = m.run(Client, "RL.HIT seam-loop seam:loop COST 1000");
        assert_eq!(denied.integers().unwrap()[0], 0);
        assert!(denied.effects.propagated.is_empty());
    }
    m.set_now(ms(2877));
    let ended = m.run(Client, "RL.OUTCOME seam-loop 0 0");
    assert_eq!(propagated(&ended), ["RL.LOOPSTATE seam-loop 80 2"]);
    assert_eq!(stat(&ended.effects.reply, Some("last"), "denied"), 3);
    assert_eq!(
        stat(&ended.effects.reply, Some("last"), "deny_permille"),
        750
    );
    // Three empty windows at once: the stage steps down twice (to 0), once
    // propagated; the scale stays (no outcomes).
    m.set_now(ms(5877));
    let down = m.run(Client, "RL.HIT seam-loop seam:loop COST 0");
    assert_eq!(propagated(&down), ["RL.LOOPSTATE seam-loop 80 0"]);
    // What was propagated sets a replica (here the same policy) as it is.
    let replayed = m.run(Replicated, "RL.LOOPSTATE seam-loop 64 1");
    assert_eq!(replayed.result, Ok(()));
    assert_eq!(propagated(&replayed), ["RL.LOOPSTATE seam-loop 64 1"]);
    assert_eq!(scale_stage(&m, "seam-loop"), (64, 1));
    // A policy the node does not hold is skipped.
    assert_eq!(
        m.run(Replicated, "RL.LOOPSTATE seam-none 64 1").result,
        Ok(())
    );
    assert_eq!(m.run(Client, "RL.POLICY DEL seam-loop").result, Ok(()));
}

#[test]
fn rl_outcome_counts_into_the_current_window_only_for_a_policy_with_a_loop() {
    let m = space();
    m.run(
        Client,
        "RL.POLICY SET seam-out FIXEDWINDOW 10 1000 ADAPT ERRORS 50 WINDOW 1000",
    );
    m.run(Client, "RL.POLICY SET seam-plain FIXEDWINDOW 10 1000");
    for (ok, errors, total_ok, total_errors) in [(3, 1, 3, 1), (0, 0, 3, 1), (7, 2, 10, 3)] {
        let out = m.run(Client, &format!("RL.OUTCOME seam-out {ok} {errors}"));
        assert_eq!(out.result, Ok(()));
        assert!(out.effects.propagated.is_empty());
        assert_eq!(stat(&out.effects.reply, Some("current"), "ok"), total_ok);
        assert_eq!(
            stat(&out.effects.reply, Some("current"), "errors"),
            total_errors
        );
    }
    let out = m.run(Client, "RL.OUTCOME seam-out 0 0");
    assert_eq!(
        stat(&out.effects.reply, Some("current"), "error_permille"),
        230
    );
    assert_eq!(stat(&out.effects.reply, None, "adapting"), 1);
    // A policy without a loop takes the report and counts nothing.
    let plain = m.run(Client, "RL.OUTCOME seam-plain 5 5");
    assert_eq!(plain.result, Ok(()));
    assert!(plain.effects.propagated.is_empty());
    assert_eq!(stat(&plain.effects.reply, Some("current"), "ok"), 0);
    assert_eq!(stat(&plain.effects.reply, None, "adapting"), 0);
    // Reports at the largest count add up.
    let max = crate::limiter::MAX_PARAM;
    for _ in 0..3 {
        m.run(Client, &format!("RL.OUTCOME seam-out {max} 0"));
    }
    let big = m.run(Client, "RL.OUTCOME seam-out 0 0");
    assert_eq!(
        stat(&big.effects.reply, Some("current"), "ok"),
        (3 * max + 10) as i64
    );
    for name in ["seam-out", "seam-plain"] {
        m.run(Client, &format!("RL.POLICY DEL {name}"));
    }
}

#[test]
fn policy_scale_propagates_verbatim_and_keeps_the_stage() {
    let m = space();
    m.run(Client, "RL.POLICY SET seam-scale TOKENBUCKET 10 4 1000");
    m.run(Replicated, "RL.LOOPSTATE seam-scale 100 1");
    let scaled = m.run(Client, "RL.POLICY SCALE seam-scale 50");
    assert_eq!(scaled.result, Ok(()));
    assert_eq!(scaled.effects.reply, [Reply::Simple("OK")]);
    assert_eq!(propagated(&scaled), ["RL.POLICY SCALE seam-scale 50"]);
    assert_eq!(scale_stage(&m, "seam-scale"), (50, 1));
    // Size and rate at half: capacity 5, refill 2 per period.
    let hit = m.run(Client, "RL.HIT seam-scale seam:scale");
    assert_eq!(
        propagated(&hit),
        [format!(
            "RL.TOKENBUCKET seam:scale 5 2 1000 COST 1 AT {T0_US}"
        )]
    );
    // The replica (or the AOF) replays it as it is.
    assert_eq!(
        m.replay(&scaled.effects.propagated),
        scaled.effects.propagated
    );
    m.run(Client, "RL.POLICY DEL seam-scale");
}

#[test]
fn bad_loop_input_is_refused_and_writes_nothing() {
    let m = space();
    m.run(
        Client,
        "RL.POLICY SET seam-bad TOKENBUCKET 10 10 1000 ADAPT ERRORS 5 STAGES 30 50 WINDOW 1000",
    );
    m.run(Client, "RL.HIT seam-bad seam:bad");
    m.run(Client, "RL.OUTCOME seam-bad 4 1");
    let state = |m: &Memory| {
        let get = m.run(Client, "RL.POLICY GET seam-bad").effects.reply;
        let stats = m.run(Client, "RL.POLICY STATS seam-bad").effects.reply;
        (get, stats, m.snapshot())
    };
    let before = state(&m);
    let max = crate::limiter::MAX_PARAM;
    for (call, error) in [
        (
            "RL.POLICY SET seam-bad TOKENBUCKET 10 10 1000 ADAPT ERRORS 101".to_string(),
            "ERR ERRORS must be an integer from 0 to 100",
        ),
        (
            "RL.POLICY SET seam-bad TOKENBUCKET 10 10 1000 ADAPT ERRORS 5 MIN 0".into(),
            "ERR MIN must be an integer from 1 to 100",
        ),
        (
            "RL.POLICY SET seam-bad TOKENBUCKET 10 10 1000 ADAPT ERRORS 5 MIN 101".into(),
            "ERR MIN must be an integer from 1 to 100",
        ),
        (
            "RL.POLICY SET seam-bad TOKENBUCKET 10 10 1000 ADAPT ERRORS 5 FACTOR 0".into(),
            "ERR FACTOR must be an integer from 1 to 100",
        ),
        (
            "RL.POLICY SET seam-bad TOKENBUCKET 10 10 1000 WINDOW 0".into(),
            "ERR WINDOW must be an integer from 1 to 86400000",
        ),
        (
            "RL.POLICY SET seam-bad TOKENBUCKET 10 10 1000 STAGES 50 30".into(),
            "ERR break_pct must be an integer from 50 to 100",
        ),
        (
            "RL.POLICY SET seam-bad TOKENBUCKET 10 10 1000 ADAPT ERRORS 5 ADAPT OFF".into(),
            "ERR ADAPT given more than once",
        ),
        (
            "RL.POLICY SCALE seam-bad 0".into(),
            "ERR pct must be an integer from 1 to 100",
        ),
        (
            "RL.POLICY SCALE seam-bad 101".into(),
            "ERR pct must be an integer from 1 to 100",
        ),
        (
            "RL.POLICY SCALE seam-missing 50".into(),
            "ERR unknown policy 'seam-missing'",
        ),
        (
            "RL.OUTCOME seam-missing 1 1".into(),
            "ERR unknown policy 'seam-missing'",
        ),
        (
            "RL.OUTCOME seam-bad -1 0".into(),
            &*format!("ERR ok must be an integer from 0 to {max}").leak(),
        ),
        (
            "RL.OUTCOME seam-bad 0 -1".into(),
            &*format!("ERR errors must be an integer from 0 to {max}").leak(),
        ),
        (
            format!("RL.OUTCOME seam-bad 0 {}", max + 1),
            &*format!("ERR errors must be an integer from 0 to {max}").leak(),
        ),
        (
            "RL.LOOPSTATE seam-bad 50 1".into(),
            "ERR RL.LOOPSTATE is reserved for replication and AOF loading",
        ),
    ] {
        let called = m.run(Client, &call);
        let got = called.result.clone().map_err(|e| e.message());
        assert_eq!(got, Err(error.to_string()), "{call}");
        assert!(called.effects.propagated.is_empty(), "{call}");
        assert!(called.effects.reply.is_empty(), "{call}");
        assert_eq!(state(&m), before, "{call}");
    }
    // From the master, a state out of range is refused too.
    for call in ["RL.LOOPSTATE seam-bad 0 1", "RL.LOOPSTATE seam-bad 50 3"] {
        let called = m.run(Replicated, call);
        assert!(called.result.is_err(), "{call}");
        assert!(called.effects.propagated.is_empty(), "{call}");
        assert_eq!(state(&m), before, "{call}");
    }
    m.run(Client, "RL.POLICY DEL seam-bad");
}

#[test]
fn upto_takes_what_fits_and_propagates_the_admission_it_was() {
    let m = space();
    m.run(Client, "RL.TOKENBUCKET up:tb 10 1 1000 COST 7");
    let part = m.run(Client, "RL.TOKENBUCKET up:tb 10 1 1000 UPTO 5");
    assert_eq!(part.integers(), Some(vec![1, 10, 0, 0, 10000, 3]));
    assert_eq!(
        propagated(&part),
        [format!("RL.TOKENBUCKET up:tb 10 1 1000 COST 3 AT {T0_US}")]
    );
    assert_eq!(part.effects.events[0].1, "rl.tokenbucket");
    // Nothing fits: the denial COST 1 gets, granted 0, nothing written.
    let before = m.snapshot();
    let none = m.run(Client, "RL.TOKENBUCKET up:tb 10 1 1000 UPTO 5");
    let one = m.run(Client, "RL.TOKENBUCKET up:tb 10 1 1000 COST 1");
    assert_eq!(
        none.integers().map(|r| r[..5].to_vec()),
        one.integers(),
        "the denial of one unit"
    );
    assert_eq!(none.integers().map(|r| r[5]), Some(0));
    assert!(none.effects.propagated.is_empty() && none.effects.events.is_empty());
    assert_eq!(m.snapshot(), before);
    // All of it when it fits; without UPTO the reply keeps five fields.
    let all = m.run(Client, "RL.FIXEDWINDOW up:fw 10 60000 UPTO 4");
    assert_eq!(
        all.integers().map(|r| (r.len(), r[2], r[5])),
        Some((6, 6, 4))
    );
    let plain = m.run(Client, "RL.FIXEDWINDOW up:fw 10 60000");
    assert_eq!(plain.integers().map(|r| r.len()), Some(5));
}

#[test]
fn upto_errors_name_upto_and_write_nothing() {
    let m = space();
    m.run(Client, "RL.POLICY SET up-leaky LEAKYBUCKET 5 1 1000");
    let before = m.snapshot();
    for (call, message) in [
        (
            "RL.TOKENBUCKET up:e 5 1 1000 UPTO 0",
            "ERR UPTO must be an integer from 1 to 1099511627776",
        ),
        (
            "RL.TOKENBUCKET up:e 5 1 1000 UPTO 2 COST 1",
            "ERR UPTO cannot be given with COST",
        ),
        (
            "RL.TOKENBUCKET up:e 5 1 1000 FORCE UPTO 2",
            "ERR UPTO cannot be given with FORCE",
        ),
        (
            "RL.TOKENBUCKET up:e 5 1 1000 REFUND 1 UPTO 2",
            "ERR UPTO cannot be given with REFUND",
        ),
        (
            "RL.TOKENBUCKET up:e 5 1 1000 UPTO 2 UPTO 2",
            "ERR UPTO given more than once",
        ),
        (
            "RL.TOKENBUCKET up:e 5 1 1000 UPTO",
            "ERR UPTO needs a value",
        ),
        (
            "RL.LEAKYBUCKET up:e 5 1 1000 UPTO 2",
            "ERR UPTO is not an option of RL.LEAKYBUCKET",
        ),
        (
            "RL.CONCURRENCY up:e 5 1000 UPTO 2",
            "ERR UPTO is not an option of RL.CONCURRENCY",
        ),
        (
            "RL.HIT up-leaky up:e UPTO 2",
            "ERR UPTO is not an option of RL.HIT on a LEAKYBUCKET policy",
        ),
        (
            "RL.ALL 2 up:a up:b FIXEDWINDOW 5 1000 LEAKYBUCKET 5 1 1000 UPTO 2",
            "ERR UPTO is not an option of RL.ALL with a LEAKYBUCKET limiter (spec 2)",
        ),
    ] {
        let called = m.run(Client, call);
        assert_eq!(
            called.result.map_err(|e| e.message()),
            Err(message.to_string()),
            "{call}"
        );
        assert!(called.effects.propagated.is_empty(), "{call}");
    }
    assert_eq!(m.snapshot(), before);
}

#[test]
fn rl_all_upto_takes_what_every_limiter_admits_at_once() {
    let m = space();
    m.run(Client, "RL.SLIDING up:s 10 60000 COST 8");
    let called = m.run(
        Client,
        "RL.ALL 2 up:s up:f SLIDING 10 60000 FIXEDWINDOW 5 60000 UPTO 4",
    );
    // The sliding log has 2 left, the window 5: both take 2.
    assert_eq!(called.integers(), Some(vec![1, 10, 0, 0, 60000, 0, 2]));
    assert_eq!(
        propagated(&called),
        [
            format!("RL.SLIDING up:s 10 60000 COST 2 AT {T0_US}"),
            format!("RL.FIXEDWINDOW up:f 5 60000 COST 2 AT {T0_US}"),
        ]
    );
    let denied = m.run(
        Client,
        "RL.ALL 2 up:s up:f SLIDING 10 60000 FIXEDWINDOW 5 60000 UPTO 4",
    );
    assert_eq!(
        denied.integers().map(|r| (r[0], r[5], r[6])),
        Some((0, 1, 0))
    );
    assert!(denied.effects.propagated.is_empty());
}

#[test]
fn upto_through_a_policy_that_is_off_grants_all_and_takes_nothing() {
    let m = space();
    m.run(Client, "RL.POLICY SET up-off FIXEDWINDOW 3 1000 MODE OFF");
    let called = m.run(Client, "RL.HIT up-off up:off UPTO 7");
    assert_eq!(called.integers().map(|r| (r[0], r[5])), Some((1, 7)));
    assert!(called.effects.propagated.is_empty());
    m.run(Client, "RL.POLICY SET up-on FIXEDWINDOW 3 1000");
    let called = m.run(Client, "RL.HIT up-on up:on UPTO 7");
    // (The window is aligned on the epoch: reset_ms is what is left of it.)
    assert_eq!(
        called.integers().map(|r| (r[0], r[1], r[2], r[5])),
        Some((1, 3, 0, 3))
    );
    assert_eq!(
        propagated(&called),
        [format!("RL.FIXEDWINDOW up:on 3 1000 COST 3 AT {T0_US}")]
    );
}

#[test]
fn upto_on_a_leaky_policy_with_a_loop_is_refused_before_the_loop_moves() {
    let m = space();
    m.run(
        Client,
        "RL.POLICY SET up-lbloop LEAKYBUCKET 10 1 1000 ADAPT ERRORS 5 MINCALLS 1 WINDOW 1000",
    );
    m.run(Client, "RL.HIT up-lbloop up:lbloop");
    m.run(Client, "RL.OUTCOME up-lbloop 0 50");
    // The window ended: the next call that counts would lower the scale.
    m.set_now(Micros::from_us(T0_US + 2_000_000));
    let state = |m: &Memory| {
        let get = m.run(Client, "RL.POLICY GET up-lbloop").effects.reply;
        let stats = m.run(Client, "RL.POLICY STATS up-lbloop").effects.reply;
        (get, stats, m.snapshot())
    };
    let before = state(&m);
    let called = m.run(Client, "RL.HIT up-lbloop up:lbloop UPTO 2");
    assert_eq!(
        called.result.clone().map_err(|e| e.message()),
        Err("ERR UPTO is not an option of RL.HIT on a LEAKYBUCKET policy".to_string())
    );
    assert!(
        called.effects.propagated.is_empty(),
        "{:?}",
        propagated(&called)
    );
    assert_eq!(state(&m), before);
    // The next plain call is the one that ends the window.
    let plain = m.run(Client, "RL.HIT up-lbloop up:lbloop");
    assert!(propagated(&plain)[0].starts_with("RL.LOOPSTATE up-lbloop 80"));
    m.run(Client, "RL.POLICY DEL up-lbloop");
}

#[test]
fn rl_all_upto_asks_a_shadowed_limiter_for_what_it_would_grant() {
    let m = space();
    m.run(
        Client,
        "RL.POLICY SET up-sh FIXEDWINDOW 3 60000 MODE SHADOW",
    );
    m.run(Client, "RL.HIT up-sh up:sh1 COST 2");
    m.run(Client, "RL.HIT up-sh up:sh2 COST 2");
    // The policy's shadow denials (`shadow_denied` in RL.POLICY GET).
    let shadow_denied = |m: &Memory| {
        let reply = m.run(Client, "RL.POLICY GET up-sh").effects.reply;
        let at = reply
            .iter()
            .position(|r| *r == Reply::Bulk(b"shadow_denied".to_vec()))
            .expect("shadow_denied");
        reply[at + 1].clone()
    };
    let none = shadow_denied(&m);
    // Alone through RL.HIT: the one unit left is taken, no shadow denial.
    let hit = m.run(Client, "RL.HIT up-sh up:sh1 UPTO 5");
    assert_eq!(hit.integers().map(|r| (r[0], r[5])), Some((1, 1)));
    // Beside an enforced limiter with room for 5: the call takes 5 there;
    // the shadowed one would have granted its 1 unit, so it takes that
    // 1 and denies nothing.
    let all = m.run(
        Client,
        "RL.ALL 2 up:en up:sh2 FIXEDWINDOW 10 60000 POLICY up-sh UPTO 5",
    );
    assert_eq!(all.integers().map(|r| (r[0], r[6])), Some((1, 5)));
    assert_eq!(
        propagated(&all),
        [
            format!("RL.FIXEDWINDOW up:en 10 60000 COST 5 AT {T0_US}"),
            format!("RL.FIXEDWINDOW up:sh2 3 60000 COST 1 AT {T0_US}"),
        ]
    );
    let sh2 = m.run(Client, "RL.HIT up-sh up:sh2 COST 0");
    assert_eq!(sh2.integers().map(|r| r[2]), Some(0));
    assert_eq!(shadow_denied(&m), none);
    m.run(Client, "RL.POLICY DEL up-sh");
}

/// The reply of `RL.ALL ... EACH`: the call's `head` integers, then five
/// per limiter.
fn each_fields(reply: &[i64], head: usize) -> Vec<Vec<i64>> {
    assert_eq!((reply.len() - head) % 5, 0, "{reply:?}");
    reply[head..].chunks(5).map(<[i64]>::to_vec).collect()
}

#[test]
fn rl_all_each_answers_what_each_limiter_alone_answers_and_changes_nothing_else() {
    let call = "RL.ALL 2 each:u each:g TOKENBUCKET 5 1 60000 FIXEDWINDOW 3 1000";
    // The same calls on three spaces: plain, with EACH, and each limiter
    // alone.
    let (plain, each, alone) = (space(), space(), space());
    for round in 0..4 {
        let without = plain.run(Client, call);
        let with = each.run(Client, &format!("{call} EACH"));
        assert_eq!(with.result, Ok(()));
        assert_eq!(
            propagated(&with),
            propagated(&without),
            "round {round}: EACH changes nothing propagated"
        );
        assert_eq!(each.snapshot(), plain.snapshot(), "round {round}");
        let (without, with) = (without.integers().unwrap(), with.integers().unwrap());
        assert_eq!(with.len(), 6 + 2 * 5, "round {round}: {with:?}");
        assert_eq!(with[..6], without[..], "round {round}: the call's six");
        // Each limiter's own answer: admitted (rounds 0 to 2), as it answers
        // alone taking the unit; denied (round 3: the window is spent), as
        // it would answer alone, nothing taken (the bucket admits, the
        // window denies).
        let u = alone.run(Client, "RL.TOKENBUCKET each:u 5 1 60000");
        let g = alone.run(Client, "RL.FIXEDWINDOW each:g 3 1000");
        let fields = each_fields(&with, 6);
        assert_eq!(fields[0], u.integers().unwrap(), "round {round}");
        assert_eq!(fields[1], g.integers().unwrap(), "round {round}");
        if round == 3 {
            assert_eq!((with[0], with[5]), (0, 2), "denied by the window");
            assert_eq!(fields[0][..3], [1, 5, 1], "the bucket would admit");
            assert_eq!(fields[1][..3], [0, 3, 0], "the window denies");
            // The call took nothing from the bucket.
            let peek = each.run(Client, "RL.TOKENBUCKET each:u 5 1 60000 COST 0");
            assert_eq!(peek.integers().map(|r| r[2]), Some(2));
        }
    }
}

#[test]
fn rl_all_each_is_a_flag_of_rl_all_only_in_any_case_and_place_at_most_once() {
    let m = space();
    let tb = "RL.ALL 1 each:p TOKENBUCKET 5 1 60000";
    for call in [
        format!("{tb} each COST 2"),
        format!("{tb} COST 2 Each"),
        format!("{tb} COST 2 EACH FORCE"),
        format!("{tb} COST 2 FORCE EACH BLOCK 10"),
    ] {
        let called = m.run(Client, &call);
        assert_eq!(called.result, Ok(()), "{call}");
        assert_eq!(called.integers().map(|r| r.len()), Some(11), "{call}");
    }
    let before = m.snapshot();
    for (call, error) in [
        (format!("{tb} EACH EACH"), Error::DuplicateOption("EACH")),
        (
            format!("{tb} EACH COST 1 each"),
            Error::DuplicateOption("EACH"),
        ),
        // A value is its option's, even when it reads EACH.
        (
            format!("{tb} COST EACH"),
            Error::Range {
                arg: "COST",
                min: 0,
                max: crate::limiter::MAX_PARAM,
            },
        ),
        (
            format!("{tb} EACH SOON"),
            Error::UnknownOption("SOON".into()),
        ),
        (
            format!("{tb} EACH REFUND 1"),
            Error::Syntax(
                "REFUND is not an option of RL.ALL: refund each limiter with its own command"
                    .into(),
            ),
        ),
        // Not an option of the other commands: their error is unchanged.
        (
            "RL.TOKENBUCKET each:p 5 1 60000 EACH".to_string(),
            Error::UnknownOption("EACH".into()),
        ),
    ] {
        assert_eq!(m.run(Client, &call).result, Err(error), "{call}");
    }
    assert_eq!(m.snapshot(), before, "errors write nothing");
}

#[test]
fn rl_all_each_with_upto_adds_granted_before_the_limiters() {
    let m = space();
    m.run(Client, "RL.FIXEDWINDOW each:uf 5 60000 COST 3");
    let called = m.run(
        Client,
        "RL.ALL 2 each:us each:uf SLIDING 10 60000 FIXEDWINDOW 5 60000 EACH UPTO 4",
    );
    let reply = called.integers().expect("integers");
    assert_eq!(reply.len(), 7 + 2 * 5, "{reply:?}");
    assert_eq!((reply[0], reply[6]), (1, 2), "2 fit in the window");
    let fields = each_fields(&reply, 7);
    assert_eq!(fields[0][..3], [1, 10, 8]);
    assert_eq!(fields[1][..3], [1, 5, 0]);
    assert_eq!(
        m.run(Client, "RL.SLIDING each:us 10 60000 COST 0")
            .integers()
            .map(|r| r[2]),
        Some(8)
    );
}

#[test]
fn rl_all_each_gives_a_shadowed_and_an_off_policy_s_own_answer() {
    let m = space();
    m.run(
        Client,
        "RL.POLICY SET each-sh FIXEDWINDOW 1 60000 MODE SHADOW",
    );
    m.run(
        Client,
        "RL.POLICY SET each-off TOKENBUCKET 7 1 1000 MODE OFF",
    );
    m.run(Client, "RL.HIT each-sh each:sh");
    let called = m.run(
        Client,
        "RL.ALL 3 each:en each:sh each:off FIXEDWINDOW 10 60000 POLICY each-sh POLICY each-off EACH",
    );
    let reply = called.integers().expect("integers");
    assert_eq!(reply.len(), 6 + 3 * 5, "{reply:?}");
    assert_eq!((reply[0], reply[5]), (1, 0), "a shadow never denies");
    let fields = each_fields(&reply, 6);
    assert_eq!(fields[0][..4], [1, 10, 9, 0]);
    // The shadowed limiter would deny: answered allowed, no wait, nothing
    // left; the off one answers its limit, untouched.
    assert_eq!(fields[1][..4], [1, 1, 0, 0]);
    assert_eq!(fields[2], [1, 7, 7, 0, 0]);
    assert!(m.snapshot().iter().all(|k| k.0 != b"each:off"));
    m.run(Client, "RL.POLICY DEL each-sh");
    m.run(Client, "RL.POLICY DEL each-off");
}
