//! The protection loop of a policy, as a pure state machine: limits that
//! adapt to the errors of what they admitted, and a stage (normal, degrade,
//! break) computed from how much they deny.
//!
//! A policy counts, per window, the calls it decided (admitted, denied,
//! shadow denials among the denied) and the outcomes its callers report of
//! the requests it admitted (`RL.OUTCOME name ok errors`). When a window
//! ends (at the first event after its end, on the master's clock), it is
//! evaluated:
//!
//! - **ADAPT** ([`Adapt`]): if the window had at least `min_calls` outcomes
//!   and `errors / (ok + errors)` exceeds `errors_pct` %, the scale becomes
//!   `max(min, scale x factor / 100)`; at most `errors_pct / 2` %, it becomes
//!   `min(100, scale + recover)`; in between it stays. Fewer outcomes change
//!   nothing. The policy's limiter runs with its size and rate parameters
//!   scaled ([`scaled`]).
//! - **STAGES** ([`Stages`]): the stage becomes 2 (break) if the window's
//!   deny ratio (`denied / calls`) exceeds `break_pct` %, else 1 (degrade)
//!   above `degrade_pct` %; otherwise it goes down one stage, so recovery is
//!   gradual.
//!
//! Windows are aligned on multiples of `window_ms` since the Unix epoch, so
//! every master agrees on where they end. Several windows may have ended
//! since the last event: each is evaluated in turn (an empty one changes the
//! scale by nothing and lowers the stage by one), in constant time however
//! many there were ([`LoopState::advance`]). Integers only: ratios compare
//! by cross-multiplication, in `u128`.

use crate::error::ParamError;
use crate::MAX_PARAM;

/// The policy's window when none is given: 10 seconds.
pub const DEFAULT_WINDOW_MS: u64 = 10_000;

/// The longest window: a day.
pub const MAX_WINDOW_MS: u64 = 86_400_000;

/// `ADAPT ERRORS pct [FACTOR f] [MIN m] [RECOVER r] [MINCALLS n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Adapt {
    errors_pct: u64,
    factor: u64,
    min: u64,
    recover: u64,
    min_calls: u64,
}

impl Adapt {
    /// `FACTOR` when none is given: a window above the error threshold
    /// lowers the scale to 80% of what it was.
    pub const DEFAULT_FACTOR: u64 = 80;
    /// `MIN` when none is given: the scale never goes below 50%.
    pub const DEFAULT_MIN: u64 = 50;
    /// `RECOVER` when none is given: 5 points a healthy window.
    pub const DEFAULT_RECOVER: u64 = 5;
    /// `MINCALLS` when none is given.
    pub const DEFAULT_MIN_CALLS: u64 = 100;

    /// Checks every argument, naming the one at fault.
    pub fn new(
        errors_pct: u64,
        factor: u64,
        min: u64,
        recover: u64,
        min_calls: u64,
    ) -> Result<Adapt, ParamError> {
        range("ERRORS", errors_pct, 0, 100)?;
        range("FACTOR", factor, 1, 100)?;
        range("MIN", min, 1, 100)?;
        range("RECOVER", recover, 0, 100)?;
        range("MINCALLS", min_calls, 0, MAX_PARAM)?;
        Ok(Adapt {
            errors_pct,
            factor,
            min,
            recover,
            min_calls,
        })
    }

    /// `ADAPT ERRORS pct` with every other argument at its default.
    pub fn errors(errors_pct: u64) -> Result<Adapt, ParamError> {
        Adapt::new(
            errors_pct,
            Adapt::DEFAULT_FACTOR,
            Adapt::DEFAULT_MIN,
            Adapt::DEFAULT_RECOVER,
            Adapt::DEFAULT_MIN_CALLS,
        )
    }

    /// The arguments in command order: ERRORS, FACTOR, MIN, RECOVER,
    /// MINCALLS.
    pub fn values(&self) -> [u64; 5] {
        [
            self.errors_pct,
            self.factor,
            self.min,
            self.recover,
            self.min_calls,
        ]
    }

    /// The scale after a window with these counts.
    pub fn next_scale(&self, scale: u64, window: &Counts) -> u64 {
        let outcomes = u128::from(window.ok) + u128::from(window.errors);
        if outcomes == 0 || outcomes < u128::from(self.min_calls) {
            return scale;
        }
        let errors = u128::from(window.errors);
        let pct = u128::from(self.errors_pct);
        if errors * 100 > pct * outcomes {
            (scale * self.factor / 100).max(self.min).min(scale)
        } else if errors * 200 <= pct * outcomes {
            (scale + self.recover).min(100)
        } else {
            scale
        }
    }
}

/// `STAGES degrade_pct break_pct`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stages {
    degrade_pct: u64,
    break_pct: u64,
}

impl Stages {
    /// Checks both, naming the one at fault: `break_pct` is at least
    /// `degrade_pct`.
    pub fn new(degrade_pct: u64, break_pct: u64) -> Result<Stages, ParamError> {
        range("degrade_pct", degrade_pct, 0, 100)?;
        range("break_pct", break_pct, degrade_pct, 100)?;
        Ok(Stages {
            degrade_pct,
            break_pct,
        })
    }

    /// `[degrade_pct, break_pct]`.
    pub fn values(&self) -> [u64; 2] {
        [self.degrade_pct, self.break_pct]
    }

    /// The stage after a window with these counts.
    pub fn next_stage(&self, stage: u8, window: &Counts) -> u8 {
        let calls = u128::from(window.calls);
        let denied = u128::from(window.denied);
        if calls > 0 && denied * 100 > u128::from(self.break_pct) * calls {
            2
        } else if calls > 0 && denied * 100 > u128::from(self.degrade_pct) * calls {
            1
        } else {
            stage.saturating_sub(1)
        }
    }
}

/// What a policy's loop does: adapt, stages, both or neither, over windows
/// of `window_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loop {
    adapt: Option<Adapt>,
    stages: Option<Stages>,
    window_ms: u64,
}

impl Default for Loop {
    fn default() -> Self {
        Loop {
            adapt: None,
            stages: None,
            window_ms: DEFAULT_WINDOW_MS,
        }
    }
}

impl Loop {
    /// Checks the window (1 ms to a day, naming `WINDOW`).
    pub fn new(
        adapt: Option<Adapt>,
        stages: Option<Stages>,
        window_ms: u64,
    ) -> Result<Loop, ParamError> {
        range("WINDOW", window_ms, 1, MAX_WINDOW_MS)?;
        Ok(Loop {
            adapt,
            stages,
            window_ms,
        })
    }

    /// The adapting rule, if any.
    pub fn adapt(&self) -> Option<Adapt> {
        self.adapt
    }

    /// The stages' thresholds, if any.
    pub fn stages(&self) -> Option<Stages> {
        self.stages
    }

    /// The window, in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// Whether the loop does anything.
    pub fn is_on(&self) -> bool {
        self.adapt.is_some() || self.stages.is_some()
    }
}

/// What one window counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Calls the policy decided (peeks included).
    pub calls: u64,
    /// Calls admitted.
    pub admitted: u64,
    /// Denials, shadow denials included.
    pub denied: u64,
    /// Outcomes reported: requests that went well.
    pub ok: u64,
    /// Outcomes reported: requests that failed.
    pub errors: u64,
}

impl Counts {
    /// `denied / calls` in per mille, rounded down (0 without calls).
    pub fn deny_permille(&self) -> u64 {
        permille(self.denied, self.calls)
    }

    /// `errors / (ok + errors)` in per mille, rounded down (0 without
    /// outcomes).
    pub fn error_permille(&self) -> u64 {
        permille(self.errors, self.ok.saturating_add(self.errors))
    }
}

fn permille(part: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 0;
    }
    (u128::from(part) * 1000 / u128::from(whole)) as u64
}

/// A policy's loop: its scale (1 to 100, percent), its stage (0 normal, 1
/// degrade, 2 break), the current window's counts and end, and the last
/// finished window's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopState {
    /// Percent of the policy's size and rate parameters the limiter runs
    /// with.
    pub scale: u64,
    /// 0 normal, 1 degrade, 2 break.
    pub stage: u8,
    /// The current window's end, in Unix milliseconds.
    pub window_end_ms: u64,
    /// What the current window counted so far.
    pub current: Counts,
    /// What the last finished window counted.
    pub last: Counts,
}

impl LoopState {
    /// A fresh loop at full scale, normal, in the window that holds
    /// `now_ms`.
    pub fn new(config: &Loop, now_ms: u64) -> LoopState {
        LoopState::with(100, 0, config, now_ms)
    }

    /// A loop with this scale and stage, in a fresh window that holds
    /// `now_ms` (a new master after a failover, a server after a restart).
    pub fn with(scale: u64, stage: u8, config: &Loop, now_ms: u64) -> LoopState {
        LoopState {
            scale: scale.clamp(1, 100),
            stage: stage.min(2),
            window_end_ms: window_end(now_ms, config.window_ms),
            current: Counts::default(),
            last: Counts::default(),
        }
    }

    /// Evaluates every window that ended at or before `now_ms`, in turn,
    /// and moves to the window that holds `now_ms`; whether the scale or
    /// the stage changed. A clock that stepped back changes nothing.
    pub fn advance(&mut self, config: &Loop, now_ms: u64) -> bool {
        if now_ms < self.window_end_ms {
            return false;
        }
        let before = (self.scale, self.stage);
        // The window that just ended, with what it counted.
        self.end_window(config);
        if now_ms >= self.window_end_ms {
            // Windows with nothing in them since: each changes the scale by
            // nothing and lowers the stage by one. After two the stage is 0
            // whatever it was, so they are counted, not walked.
            let empty = (now_ms - self.window_end_ms) / config.window_ms + 1;
            if config.stages.is_some() {
                self.stage = self.stage.saturating_sub(empty.min(2) as u8);
            }
            self.last = Counts::default();
            self.window_end_ms = self
                .window_end_ms
                .saturating_add(empty.saturating_mul(config.window_ms));
        }
        before != (self.scale, self.stage)
    }

    /// Evaluates the current window and starts the next one.
    fn end_window(&mut self, config: &Loop) {
        let window = self.current;
        if let Some(adapt) = &config.adapt {
            self.scale = adapt.next_scale(self.scale, &window);
        }
        if let Some(stages) = &config.stages {
            self.stage = stages.next_stage(self.stage, &window);
        }
        self.last = window;
        self.current = Counts::default();
        self.window_end_ms = self.window_end_ms.saturating_add(config.window_ms);
    }
}

/// The end of the window of `window_ms` that holds `now_ms` (windows are
/// aligned on the Unix epoch).
pub fn window_end(now_ms: u64, window_ms: u64) -> u64 {
    (now_ms / window_ms)
        .saturating_add(1)
        .saturating_mul(window_ms)
}

/// A size or rate parameter under a scale: `max(1, floor(p x scale /
/// 100))`.
pub fn scaled(p: u64, scale: u64) -> u64 {
    ((u128::from(p) * u128::from(scale.min(100)) / 100) as u64).max(1)
}

fn range(arg: &'static str, value: u64, min: u64, max: u64) -> Result<(), ParamError> {
    if value < min || value > max {
        return Err(ParamError::Range { arg, min, max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn counts(calls: u64, denied: u64, ok: u64, errors: u64) -> Counts {
        Counts {
            calls,
            admitted: calls - denied,
            denied,
            ok,
            errors,
        }
    }

    #[test]
    fn the_seeds_numbers() {
        // Seed 004: errors above 5% lower the threshold from 100% to 80%.
        let adapt = Adapt::errors(5).unwrap();
        assert_eq!(adapt.next_scale(100, &counts(0, 0, 900, 100)), 80);
        assert_eq!(adapt.next_scale(80, &counts(0, 0, 900, 100)), 64);
        assert_eq!(adapt.next_scale(64, &counts(0, 0, 900, 100)), 51);
        assert_eq!(adapt.next_scale(51, &counts(0, 0, 900, 100)), 50, "MIN");
        // At most half the threshold: recovery by 5 points.
        assert_eq!(adapt.next_scale(80, &counts(0, 0, 975, 25)), 85);
        assert_eq!(adapt.next_scale(98, &counts(0, 0, 1000, 0)), 100);
        // In between, or too few outcomes: unchanged.
        assert_eq!(adapt.next_scale(80, &counts(0, 0, 960, 40)), 80);
        assert_eq!(adapt.next_scale(80, &counts(0, 0, 90, 9)), 80);
        // Seed 000: above 30% denied degrades, above 50% breaks.
        let stages = Stages::new(30, 50).unwrap();
        assert_eq!(stages.next_stage(0, &counts(100, 31, 0, 0)), 1);
        assert_eq!(stages.next_stage(0, &counts(100, 51, 0, 0)), 2);
        assert_eq!(stages.next_stage(2, &counts(100, 30, 0, 0)), 1);
        assert_eq!(stages.next_stage(1, &counts(100, 30, 0, 0)), 0);
        assert_eq!(stages.next_stage(2, &counts(0, 0, 0, 0)), 1);
    }

    #[test]
    fn arguments_are_checked_naming_the_one_at_fault() {
        let err = |r: Result<Adapt, ParamError>| r.unwrap_err().to_string();
        assert_eq!(
            err(Adapt::new(101, 80, 50, 5, 100)),
            "ERRORS must be an integer from 0 to 100"
        );
        assert_eq!(
            err(Adapt::new(5, 0, 50, 5, 100)),
            "FACTOR must be an integer from 1 to 100"
        );
        assert_eq!(
            err(Adapt::new(5, 80, 0, 5, 100)),
            "MIN must be an integer from 1 to 100"
        );
        assert_eq!(
            Stages::new(50, 30).unwrap_err().to_string(),
            "break_pct must be an integer from 50 to 100"
        );
        assert_eq!(
            Loop::new(None, None, 0).unwrap_err().to_string(),
            "WINDOW must be an integer from 1 to 86400000"
        );
    }

    #[test]
    fn scaled_parameters_never_reach_zero() {
        assert_eq!(scaled(100, 80), 80);
        assert_eq!(scaled(1, 50), 1);
        assert_eq!(scaled(3, 50), 1);
        assert_eq!(scaled(MAX_PARAM, 100), MAX_PARAM);
        assert_eq!(scaled(MAX_PARAM, 1), MAX_PARAM / 100);
    }

    #[test]
    fn a_clock_that_steps_back_changes_nothing() {
        let config = Loop::new(Adapt::errors(5).ok(), Stages::new(30, 50).ok(), 1000).unwrap();
        let mut state = LoopState::new(&config, 10_500);
        assert_eq!(state.window_end_ms, 11_000);
        state.current = counts(10, 9, 0, 0);
        let before = state;
        assert!(!state.advance(&config, 10_000));
        assert_eq!(state, before);
    }

    /// The model: every window walked one by one.
    fn walk(state: &mut LoopState, config: &Loop, now_ms: u64) {
        while now_ms >= state.window_end_ms {
            let window = state.current;
            if let Some(a) = config.adapt {
                state.scale = a.next_scale(state.scale, &window);
            }
            if let Some(s) = config.stages {
                state.stage = s.next_stage(state.stage, &window);
            }
            state.last = window;
            state.current = Counts::default();
            state.window_end_ms += config.window_ms;
        }
    }

    fn loops() -> impl Strategy<Value = Loop> {
        (
            proptest::option::of((0u64..=100, 1u64..=100, 1u64..=100, 0u64..=100, 0u64..20)),
            proptest::option::of((0u64..=100, 0u64..=100)),
            1u64..5000,
        )
            .prop_map(|(a, s, w)| {
                let adapt = a.map(|(e, f, m, r, n)| Adapt::new(e, f, m, r, n).unwrap());
                let stages = s.map(|(d, b)| Stages::new(d.min(b), d.max(b)).unwrap());
                Loop::new(adapt, stages, w).unwrap()
            })
    }

    proptest! {
        /// Events at random instants (calls that admit or deny, outcomes),
        /// with gaps of up to a hundred windows: `advance` ends where the
        /// walk through every window ends, and says when the scale or the
        /// stage changed.
        #[test]
        fn advance_is_the_walk_through_every_window(
            config in loops(),
            start in 0u64..1 << 42,
            events in proptest::collection::vec((0u64..500_000, 0u8..4, 0u64..50), 1..60),
        ) {
            let mut fast = LoopState::new(&config, start);
            let mut model = fast;
            let mut now = start;
            for (gap, kind, n) in events {
                now += gap % (config.window_ms() * 100 + 1);
                let before = (fast.scale, fast.stage);
                let changed = fast.advance(&config, now);
                walk(&mut model, &config, now);
                prop_assert_eq!(fast, model);
                prop_assert_eq!(changed, before != (fast.scale, fast.stage));
                prop_assert!((1..=100).contains(&fast.scale) && fast.stage <= 2);
                for state in [&mut fast, &mut model] {
                    let c = &mut state.current;
                    match kind {
                        0 => { c.calls += n; c.admitted += n; }
                        1 => { c.calls += n; c.denied += n; }
                        2 => c.ok += n,
                        _ => c.errors += n,
                    }
                }
            }
        }

        /// The scale moves only within [MIN, 100] once inside it, and by the
        /// rule's steps.
        #[test]
        fn the_scale_stays_within_its_bounds(
            e in 0u64..=100, f in 1u64..=100, m in 1u64..=100, r in 0u64..=100,
            scale in 1u64..=100, ok in 0u64..1000, errors in 0u64..1000,
        ) {
            let adapt = Adapt::new(e, f, m, r, 0).unwrap();
            let next = adapt.next_scale(scale, &counts(0, 0, ok, errors));
            prop_assert!((1..=100).contains(&next));
            prop_assert!(next == scale || next < scale && next >= m.min(scale) || next > scale && next <= 100);
        }
    }
}
