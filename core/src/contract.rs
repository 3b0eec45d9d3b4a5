//! The contract every [`Algorithm`] keeps, as executable checks: what the
//! fuzz targets of the module run on every limiter call they can build, and
//! what a new algorithm must pass.
//!
//! [`run_steps`] runs requests at given instants (the clock may go
//! backwards) and asserts, at every one:
//!
//! - `decide` predicts `apply`/`run`; a denial or `COST 0` changes nothing;
//!   an admission with a cost changes the state;
//! - `remaining <= limit`; `wait_ms` is -1 exactly when the cost is above
//!   the limit; every reply integer fits an `i64`; only a shaping algorithm
//!   makes an admitted call wait;
//! - a denied request is admitted `wait_ms` later and not a millisecond
//!   before;
//! - after an admission, a peek agrees with the reply and the state's idle
//!   instant is after now;
//! - `FORCE` answers what the call without it would, `REFUND` answers as a
//!   peek after it and never takes room;
//! - from idle, with a clock that only goes forward, the algorithm's own
//!   guarantee on what it admitted ([`Guarantee::check_admissions`]).
//!
//! A broken rule is a panic (what a fuzzer reports). The caller's
//! `on_change` sees every state a step changed (the module checks its RDB
//! and AOF forms there).

use crate::{Algorithm, Decision, Micros, Request, Wait, MAX_SPAN_MS, MAX_TIME_US};

/// Runs `steps` on `state`, asserting the contract of the core crate and
/// the reply rules of the spec at every one:
///
/// - `decide` predicts `apply`; a denial or `COST 0` changes nothing;
///   an admission with a cost changes the state;
/// - `remaining <= limit`, `limit` is the parameters' limit, `wait_ms` is
///   -1 exactly when the cost is above the limit, every reply integer fits
///   an `i64`, an admitted call waits only on a shaping limiter;
/// - after an admission the state re-encodes to itself (what RDB, AOF and
///   replicas get), a peek at the same instant agrees with the reply, and the
///   key's expiry is in the future (the admission is not lost at once);
/// - a denial's `remaining` is what a peek says, and the same request is
///   admitted after `wait_ms` and not one millisecond before (unless the
///   state is more than MAX_SPAN_MS away from now, see below);
/// - from idle, with a clock that only goes forward, the algorithm's own
///   guarantee holds on what it admitted ([`Guarantee::check_admissions`]).
pub fn run_steps<A: Guarantee>(
    state: &mut A::State,
    params: &A::Params,
    steps: &[(Micros, Request)],
    on_change: &mut impl FnMut(&A::State),
) -> Vec<(u64, u64)> {
    let mut admitted = Vec::new();
    for &(now, request) in steps {
        let before = state.clone();
        let cost = match request {
            Request::Cost(cost) => cost,
            Request::UpTo(most) => {
                let cost = check_up_to::<A>(state, params, most, now);
                // Then it is that plain call, checked as one below.
                let as_cost = crate::run::<A>(&mut state.clone(), params, Request::Cost(cost), now);
                let outcome = crate::decide::<A>(state, params, request, now);
                assert_eq!(outcome, as_cost, "UPTO {most} is not COST {cost}");
                cost
            }
            _ => {
                run_forced_or_refunded::<A>(state, params, request, now, on_change);
                continue;
            }
        };
        let decided = A::decide(state, params, cost, now);
        let d = A::apply(state, params, cost, now);
        if tracing() {
            eprintln!(
                "{params:?} cost {cost} at {now:?}\n  {before:?}\n  -> {d:?}\n  -> {state:?}"
            );
        }
        assert_eq!(decided, d, "decide and apply disagree");
        check_decision::<A>(&d, params, cost);
        if !d.allowed || cost == 0 {
            assert_eq!(*state, before, "a denial or COST 0 changed the state");
            let peek = A::decide(state, params, 0, now);
            assert_eq!(peek.remaining, d.remaining, "a denial and a peek disagree");
            if let (false, Wait::Ms(wait_ms)) = (d.allowed, d.wait) {
                // Beyond MAX_SPAN_MS of debt (a clock stepped back by
                // millennia) the buckets cap it so that replies fit an i64,
                // and wait_ms is a bound no longer exact.
                if d.reset_ms < MAX_SPAN_MS {
                    check_wait::<A>(state, params, cost, now, wait_ms);
                }
            }
        } else {
            admitted.push((now.as_us(), cost));
            assert_ne!(*state, before, "an admission changed nothing");
            on_change(state);
            let peek = A::decide(state, params, 0, now);
            assert_eq!(
                peek.remaining, d.remaining,
                "an admission and a peek disagree"
            );
            let idle_at_ms = A::idle_at_ms(state, params);
            assert!(
                idle_at_ms < i64::MAX as u64
                    && u128::from(idle_at_ms) * 1000 > u128::from(now.as_us()),
                "expiry {idle_at_ms} ms not after an admission at {} us",
                now.as_us()
            );
        }
    }
    admitted
}

/// `UPTO most`: [`Algorithm::fits`] is at most `most`, what it says fits
/// is admitted, and one unit more is not (when `most` allows one more).
/// Returns the cost `UPTO` runs as: the units that fit, or 1 when none do.
fn check_up_to<A: Guarantee>(state: &A::State, params: &A::Params, most: u64, now: Micros) -> u64 {
    let fits = A::fits(state, params, most, now);
    assert!(fits <= most, "UPTO {most} fits {fits}");
    if fits > 0 {
        assert!(
            A::decide(state, params, fits, now).allowed,
            "the {fits} units that fit are denied"
        );
    }
    if fits < most {
        assert!(
            !A::decide(state, params, fits + 1, now).allowed,
            "{} units fit, not {fits} (UPTO {most})",
            fits + 1
        );
    }
    fits.max(1)
}

/// One `COST n FORCE` or `REFUND n` step: `decide` predicts `run`, the call
/// is answered allowed with `remaining <= limit`, `changed` says whether the
/// state changed, and a changed state re-encodes to itself and expires after
/// now. A forced call answers what the unforced one would have; a refund
/// answers as a peek after it and never takes room.
fn run_forced_or_refunded<A: Guarantee>(
    state: &mut A::State,
    params: &A::Params,
    request: Request,
    now: Micros,
    on_change: &mut impl FnMut(&A::State),
) {
    let before = state.clone();
    let predicted = crate::decide::<A>(state, params, request, now);
    let outcome = crate::run::<A>(state, params, request, now);
    if tracing() {
        eprintln!(
            "{params:?} {request:?} at {now:?}\n  {before:?}\n  -> {outcome:?}\n  -> {state:?}"
        );
    }
    assert_eq!(predicted, outcome, "decide and run disagree");
    assert_eq!(outcome.changed, *state != before, "changed is wrong");
    let d = outcome.decision;
    assert!(d.allowed, "{request:?} answered denied");
    assert_eq!(
        d.limit,
        A::limit(params),
        "limit is not the parameters' limit"
    );
    assert!(d.remaining <= d.limit, "remaining above the limit: {d:?}");
    match request {
        Request::Force(cost) => {
            let unforced = A::decide(&before, params, cost, now);
            assert_eq!(
                d,
                Decision {
                    allowed: true,
                    ..unforced
                },
                "FORCE answers unlike the call without it"
            );
        }
        Request::Refund(_) => {
            assert_eq!(
                d,
                A::decide(state, params, 0, now),
                "a refund answers unlike a peek after it"
            );
            let peek_before = A::decide(&before, params, 0, now);
            assert!(
                d.remaining >= peek_before.remaining,
                "a refund took room: {peek_before:?} -> {d:?}"
            );
        }
        Request::Cost(_) | Request::UpTo(_) => unreachable!("plain calls run in run_steps"),
    }
    if outcome.changed {
        on_change(state);
        let idle_at_ms = A::idle_at_ms(state, params);
        assert!(
            idle_at_ms < i64::MAX as u64,
            "expiry {idle_at_ms} ms overflows"
        );
    }
}

/// Runs `steps` from an idle limiter and, when the clock only went forward,
/// checks the algorithm's own guarantee on what it admitted.
pub fn run_fresh<A: Guarantee>(
    params: &A::Params,
    steps: &[(Micros, Request)],
    on_change: &mut impl FnMut(&A::State),
) {
    let Some(&(now, _)) = steps.first() else {
        return;
    };
    let admitted = run_steps::<A>(&mut A::idle(params, now), params, steps, on_change);
    // (A forced or refunded unit is outside the algorithm's guarantee.)
    let plain = steps
        .iter()
        .all(|(_, r)| matches!(r, Request::Cost(_) | Request::UpTo(_)));
    if plain && steps.windows(2).all(|w| w[0].0 <= w[1].0) {
        A::check_admissions(params, &admitted);
    }
}

/// `FUZZ_TRACE=1` prints every step (to read a crash: `FUZZ_TRACE=1 cargo
/// fuzz run ... <artifact>` or the replay test).
fn tracing() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("FUZZ_TRACE").is_some())
}

fn check_decision<A: Guarantee>(d: &Decision, params: &A::Params, cost: u64) {
    let limit = A::limit(params);
    assert_eq!(d.limit, limit, "limit is not the parameters' limit");
    assert!(d.remaining <= d.limit, "remaining above the limit: {d:?}");
    assert!(d.reset_ms <= i64::MAX as u64, "reset_ms overflows: {d:?}");
    let never = d.wait == Wait::Never;
    assert_eq!(
        never,
        !d.allowed && cost > limit,
        "wait_ms -1 must mean exactly a cost above the limit: {d:?}"
    );
    if cost > limit {
        assert!(!d.allowed, "a cost above the limit was admitted");
    }
    match d.wait {
        Wait::Ms(ms) => assert!(ms <= i64::MAX as u64, "wait_ms overflows: {d:?}"),
        Wait::Never => {}
    }
    if d.allowed && !A::SHAPES {
        assert_eq!(d.wait, Wait::Ms(0), "an admission that waits");
    }
    if cost == 0 {
        assert!(d.allowed, "COST 0 denied");
    }
}

/// The same request, `wait_ms` later, is admitted; one millisecond earlier
/// it is not.
fn check_wait<A: Guarantee>(
    state: &A::State,
    params: &A::Params,
    cost: u64,
    now: Micros,
    wait_ms: u64,
) {
    let at = |ms: u64| now.saturating_add_ms(ms);
    if at(wait_ms).as_us() > MAX_TIME_US {
        return;
    }
    let later = A::decide(state, params, cost, at(wait_ms));
    assert!(
        later.allowed,
        "denied again {wait_ms} ms later, as wait_ms said: {later:?}"
    );
    if wait_ms > 0 {
        let early = A::decide(state, params, cost, at(wait_ms - 1));
        assert!(!early.allowed, "admitted before wait_ms ({wait_ms} ms)");
    }
}

/// What the checks need to know of each algorithm besides [`Algorithm`]:
/// implemented next to each one.
pub trait Guarantee: Algorithm {
    /// The limit a reply reports: the capacity, or units per window.
    fn limit(params: &Self::Params) -> u64;
    /// Checks the algorithm's guarantee on the (Unix us, cost) it admitted
    /// from idle, with a clock that only went forward.
    fn check_admissions(params: &Self::Params, admitted: &[(u64, u64)]);
}

/// From a full bucket, units admitted in any span `t` never exceed
/// `capacity + count * t / ms` (in ticks: a unit is `ms * 1000` ticks, a
/// microsecond `count`).
pub(crate) fn check_bucket_bound(capacity: u64, count: u64, ms: u64, admitted: &[(u64, u64)]) {
    let period = u128::from(ms) * 1000;
    for (i, &(first_us, _)) in admitted.iter().enumerate() {
        let mut units = 0u128;
        for &(us, cost) in &admitted[i..] {
            units += u128::from(cost);
            let bound =
                u128::from(capacity) * period + u128::from(count) * u128::from(us - first_us);
            assert!(
                units * period <= bound,
                "{units} units admitted from {first_us} to {us} us"
            );
        }
    }
}

/// Units admitted in any interval of `window_ms` never exceed `limit`.
pub(crate) fn check_window_bound(limit: u64, window_ms: u64, admitted: &[(u64, u64)]) {
    for (i, &(first_us, _)) in admitted.iter().enumerate() {
        let end_us = first_us.saturating_add(window_ms.saturating_mul(1000));
        let units: u64 = admitted[i..]
            .iter()
            .take_while(|a| a.0 < end_us)
            .map(|a| a.1)
            .sum();
        assert!(
            units <= limit,
            "{units} units admitted in {window_ms} ms from {first_us} us"
        );
    }
}
