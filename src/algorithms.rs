//! The table of algorithms: every algorithm the module serves, one row each.
//!
//! A row names an algorithm of `crate::limiter` and says everything the
//! module needs to serve it. The rest comes from the table:
//!
//! - its command, registered with its flags, arity (`-(2 + params)`), ACL
//!   categories and `COMMAND DOCS`, and the row's companion commands;
//! - its native type (`TYPE key` shows `type_name`), with its newest RDB
//!   encoding version (`ratelimit.write-encoding` may pin it lower);
//! - its name in `RL.ALL` and `RL.POLICY SET` specs, in `RL.SETSTATE`, in
//!   `RL.POLICY GET` and in the policies' RDB data: the command's name after
//!   the dot (`TOKENBUCKET`), matched in any case;
//! - its keyspace event: the command's name in lower case
//!   (`rl.tokenbucket`);
//! - its `INFO ratelimit` fields: the spec word in lower case
//!   (`tokenbucket_calls`), with counters indexed by its row;
//! - the fuzz targets' selectors: the rows in order.
//!
//! So a name is spelled once, and no index is kept by hand. What is code, not
//! data, lives with the algorithm's types in the core crate: its parameters
//! as a list of named integers (`limiter::Parameters`, read by the one
//! [`Params`] impl) and its state as a list of fields (`limiter::StateFields`,
//! encoded by the one `NativeState` impl); and in the row, its `bounds`.
//! `docs/design.md` ("One table of algorithms") tells how the commands
//! still to come fit in a row.

use std::ffi::CStr;

use crate::args::{ParamList, Params, BLOCK, COST_OR_REFUND, COST_REFUND_OR_UPTO};
use crate::calendar::{self, Zone};
use crate::config;
use crate::error::Error;
use crate::ffi::{Arg, Boxed, BucketRepr, CounterRepr, DataType, NumericConfig, Repr, ThinRepr};
use crate::limiter::hash_window::HashWindowParams;
use crate::limiter::quota::QuotaParams;
use crate::limiter::sliding_log::SlidingLogParams;
use crate::limiter::{
    Algorithm, Concurrency, FixedWindow, HashWindow, LeakyBucket, Micros, Parameters, Quota,
    SlidingLog, TokenBucket,
};
use crate::stats::Outcomes;

self::algorithms! { $
    TokenBucket: BucketRepr => Row {
        command: c"RL.TOKENBUCKET",
        key: KeyFormat::Native { type_name: c"rl-tokbkt", encoding: 1 },
        summary: c"Token bucket with continuous refill: admits a request of COST units (default 1) if the bucket holds them",
        complexity: c"O(1)",
        args: &[
            Arg::key(c"key"),
            Arg::integer(c"capacity"),
            Arg::integer(c"refill_count"),
            Arg::integer(c"refill_ms"),
            COST_REFUND_OR_UPTO,
            BLOCK,
        ],
        // The capacity and the count refilled (leaked) per period.
        scaled: &[0, 1],
        ..Row::LIMITER
    },
    FixedWindow: CounterRepr => Row {
        command: c"RL.FIXEDWINDOW",
        key: KeyFormat::Native { type_name: c"rl-fixwin", encoding: 1 },
        summary: c"Fixed window counter aligned on the Unix epoch: admits a request of COST units (default 1) if the window has room",
        complexity: c"O(1)",
        args: &[
            Arg::key(c"key"),
            Arg::integer(c"limit"),
            Arg::integer(c"window_ms"),
            COST_REFUND_OR_UPTO,
            BLOCK,
        ],
        ..Row::LIMITER
    },
    LeakyBucket: BucketRepr => Row {
        command: c"RL.LEAKYBUCKET",
        key: KeyFormat::Native { type_name: c"rl-leakbk", encoding: 1 },
        summary: c"Leaky bucket as a shaping queue: admits a request of COST units if the queue has room, and tells in wait_ms when its turn comes",
        complexity: c"O(1)",
        args: &[
            Arg::key(c"key"),
            Arg::integer(c"capacity"),
            Arg::integer(c"leak_count"),
            Arg::integer(c"leak_ms"),
            COST_OR_REFUND,
            BLOCK,
        ],
        // The capacity and the count refilled (leaked) per period.
        scaled: &[0, 1],
        upto: false,
        ..Row::LIMITER
    },
    SlidingLog: ThinRepr => Row {
        command: c"RL.SLIDING",
        key: KeyFormat::Native { type_name: c"rl-slilog", encoding: 1 },
        summary: c"Exact sliding log: admits a request of COST units if no window_ms interval would hold more than limit units",
        complexity: c"O(1) amortised for admissions, O(log N) for denials, N the entries in the window",
        args: &[
            Arg::key(c"key"),
            Arg::integer(c"limit"),
            Arg::integer(c"window_ms"),
            COST_REFUND_OR_UPTO,
            BLOCK,
        ],
        bound: Some(Bound {
            what: "limit",
            config: &config::SLIDING_MAX_LIMIT,
            of: SlidingLogParams::limit,
        }),
        ..Row::LIMITER
    },
    HashWindow: ThinRepr => Row {
        command: c"RL.HASHWINDOW",
        key: KeyFormat::Native { type_name: c"rl-hashwn", encoding: 2 },
        summary: c"Sliding window approximated by fixed buckets: admits a request of COST units if the buckets covering window_ms have room",
        complexity: c"O(1) amortised for admissions, O(B) for denials, B = window_ms / bucket_ms",
        args: &[
            Arg::key(c"key"),
            Arg::integer(c"limit"),
            Arg::integer(c"window_ms"),
            Arg::integer(c"bucket_ms"),
            COST_REFUND_OR_UPTO,
            BLOCK,
        ],
        bound: Some(Bound {
            what: "window_ms / bucket_ms",
            config: &config::HASHWINDOW_MAX_BUCKETS,
            of: HashWindowParams::buckets,
        }),
        ..Row::LIMITER
    },
    Concurrency: Boxed => Row {
        command: c"RL.CONCURRENCY",
        key: KeyFormat::Native { type_name: c"rl-concur", encoding: 1 },
        summary: c"Concurrency limiter: grants a lease of COST units (default 1) if the leases held leave room under limit; a lease ends at RL.RELEASE or lease_ms after it was granted or renewed",
        complexity: c"O(N), N the leases held on the key",
        args: &[
            Arg::key(c"key"),
            Arg::integer(c"limit"),
            Arg::integer(c"lease_ms"),
            COST_OR_REFUND,
            BLOCK,
        ],
        flags: c"write",
        acl: c"write",
        specs: Specs { policies: true, all: false },
        reply: ReplyShape::Lease,
        companions: &[Companion::Release, Companion::Renew],
        upto: false,
        ..Row::LIMITER
    },
    Quota: CounterRepr => Row {
        command: c"RL.QUOTA",
        key: KeyFormat::Native { type_name: c"rl-quotas", encoding: 1 },
        summary: c"Calendar quota: admits a request of COST units if the day, ISO week, month or year it falls in, in its time zone (TZ, default UTC), has room",
        complexity: c"O(1)",
        args: &[
            Arg::key(c"key"),
            Arg::integer(c"limit"),
            Arg::one_of(
                c"period",
                &[
                    Arg::keyword(c"day", c"DAY"),
                    Arg::keyword(c"week", c"WEEK"),
                    Arg::keyword(c"month", c"MONTH"),
                    Arg::keyword(c"year", c"YEAR"),
                ],
            ),
            Arg::string(c"zone")
                .token(c"TZ")
                .summary(c"UTC (the default), a fixed offset such as +05:30, or a time zone name such as America/New_York")
                .optional(),
            COST_REFUND_OR_UPTO,
            BLOCK,
        ],
        resolve: resolve_quota,
        period_end: |p| Some(p.end()),
        ..Row::LIMITER
    },
}

/// One row: an algorithm served as a command.
pub struct Row<L: Algorithm> {
    /// The command (`RL.TOKENBUCKET`); every other name of the algorithm
    /// comes from it (see the module's comment).
    pub command: &'static CStr,
    /// What its keys hold.
    pub key: KeyFormat,
    /// `COMMAND DOCS`: summary, complexity and every argument, the key and
    /// options included (their count agrees with the arity, a test checks).
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    pub args: &'static [Arg],
    /// Command flags and ACL categories.
    pub flags: &'static CStr,
    pub acl: &'static CStr,
    /// Where a spec may name the algorithm.
    pub specs: Specs,
    /// The bound a module config puts on client calls (never on replicated
    /// ones: the master accepted them), if any.
    pub bound: Option<Bound<L>>,
    /// The positions of its size and rate parameters: what a policy's
    /// scale (the protection loop's `ADAPT`, `RL.POLICY SCALE`) scales.
    pub scaled: &'static [usize],
    /// The reply of its command and of `RL.HIT`.
    pub reply: ReplyShape,
    /// Commands that come with it, registered with it.
    pub companions: &'static [Companion],
    /// Completes the parameters of a call at its time `now`, from its
    /// `TZ zone` and (replicated) `END unix_us` options: a calendar quota
    /// learns where its period ends. The others take neither option.
    pub resolve: Resolve<L>,
    /// The end of the call's period, which a calendar quota's pinned call
    /// carries (`END unix_us`), so that replicas never read a tz database.
    pub period_end: fn(&L::Params) -> Option<Micros>,
    /// Whether `UPTO n` may ask it for part of a request: every limiter of
    /// counted units; not a shaping queue (a partial place in a queue means
    /// nothing) nor leases (a lease is granted whole).
    pub upto: bool,
}

/// A bound an operator sets on one quantity of a call's parameters: a
/// module config (`ratelimit.<name>`), below the core's own range, for what
/// a key may cost in memory.
pub struct Bound<L: Algorithm> {
    /// What it bounds, as its error names it.
    pub what: &'static str,
    /// The config that holds the largest value.
    pub config: &'static NumericConfig,
    /// The quantity, from the parameters.
    pub of: fn(&L::Params) -> u64,
}

impl<L: Algorithm> Row<L> {
    /// Checks a client's call against the row's bound: `ERR <what> is above
    /// ratelimit.<config> (<max>)`.
    #[inline(always)]
    pub fn check_bound(&self, params: &L::Params) -> Result<(), Error> {
        let Some(bound) = &self.bound else {
            return Ok(());
        };
        let max = config::get(bound.config.value);
        if (bound.of)(params) > max {
            return Err(Error::AboveConfig {
                what: bound.what,
                config: bound.config.name.to_str().unwrap_or("config"),
                max,
            });
        }
        Ok(())
    }
}

/// See [`Row::resolve`].
pub type Resolve<L> =
    fn(&mut <L as Algorithm>::Params, Option<Zone>, Option<Micros>, Micros) -> Result<(), Error>;

/// [`Row::resolve`] of an algorithm without periods.
fn resolve_nothing<P>(
    _: &mut P,
    zone: Option<Zone>,
    end: Option<Micros>,
    _: Micros,
) -> Result<(), Error> {
    if zone.is_some() {
        return Err(Error::UnknownOption("TZ".to_string()));
    }
    if end.is_some() {
        return Err(Error::UnknownOption("END".to_string()));
    }
    Ok(())
}

/// [`Row::resolve`] of `RL.QUOTA`: the end of the period that contains
/// `now` in the zone (UTC by default), or the master's, when it says it.
fn resolve_quota(
    params: &mut QuotaParams,
    zone: Option<Zone>,
    end: Option<Micros>,
    now: Micros,
) -> Result<(), Error> {
    let end = end.unwrap_or_else(|| {
        calendar::period_end(params.period(), zone.unwrap_or(calendar::UTC), now)
    });
    *params = params.at_end(end);
    Ok(())
}

impl<L: Algorithm> Row<L> {
    /// What a row says unless it says otherwise: a write command, fast,
    /// answering the five integers, accepted in every spec, bounded by no
    /// config, alone. (The empty names are for every row to give; a test
    /// checks that each does.)
    pub const LIMITER: Row<L> = Row {
        command: c"",
        key: KeyFormat::Native {
            type_name: c"",
            encoding: 0,
        },
        summary: c"",
        complexity: c"",
        args: &[],
        flags: c"write fast",
        acl: c"write fast",
        specs: Specs {
            policies: true,
            all: true,
        },
        bound: None,
        // The limit (a capacity, or requests per window) comes first.
        scaled: &[0],
        reply: ReplyShape::Decision,
        companions: &[],
        resolve: resolve_nothing::<L::Params>,
        period_end: |_| None,
        upto: true,
    };
}

/// What a limiter command replies (sent by `crate::commands`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyShape {
    /// The five integers: allowed, limit, remaining, wait_ms, reset_ms.
    Decision,
    /// The five integers and the lease granted (0 when none was).
    Lease,
}

/// A command that comes with an algorithm (its handler is generic, in
/// `crate::commands`, for every algorithm with leases).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Companion {
    /// `RL.RELEASE key lease`: ends a lease.
    Release,
    /// `RL.RENEW key lease lease_ms`: extends a lease.
    Renew,
}

/// What a key of the algorithm holds.
#[derive(Clone, Copy, Debug)]
pub enum KeyFormat {
    /// A module type of its own (`TYPE key` shows `type_name`, 9
    /// characters), whose RDB and AOF forms are those of `encoding`
    /// (`crate::datatype::NativeState`).
    Native {
        type_name: &'static CStr,
        encoding: i32,
    },
}

/// Where a spec (`<ALGORITHM> <params...>`) may name the algorithm.
#[derive(Clone, Copy, Debug)]
pub struct Specs {
    /// `RL.POLICY SET` (and so `RL.HIT`, `RL.ALL ... POLICY name`).
    pub policies: bool,
    /// An inline spec of `RL.ALL`.
    pub all: bool,
}

/// An algorithm of the table, with what the table says of it.
pub trait Listed: Algorithm + Sized + 'static {
    /// How its state sits in its key's value pointer (`crate::ffi`): packed
    /// into the pointer when it fits (`BucketRepr`, `CounterRepr`), one
    /// block behind it (`ThinRepr`), or a box (`Boxed`). The row names it.
    type Repr: Repr<Self::State>;
    /// Its row.
    const ROW: Row<Self>;
    /// Its row's position in the table.
    const INDEX: usize;
    /// The keyspace event of a call that changed it: the command in lower
    /// case.
    const EVENT: &'static CStr;
    /// Its command's arity: at least the command, the key and the
    /// parameters.
    const ARITY: i32 = -(2 + <Self::Params as Params>::COUNT as i32);
    /// Its name in specs and `RL.SETSTATE`: the command after the dot.
    const WORD: &'static CStr = after_dot(Self::ROW.command);
    /// The prefix of its `INFO` fields: the word in lower case.
    const INFO_NAME: &'static CStr = after_dot(Self::EVENT);

    /// Its native type, once registered.
    fn data_type() -> &'static DataType<Self>;

    /// A spec of it.
    fn spec(params: Self::Params) -> Spec;

    /// Its newest encoding version (RDB, `DUMP`): what it writes unless
    /// `ratelimit.write-encoding` pins it lower.
    fn newest_encoding() -> i32 {
        match Self::ROW.key {
            KeyFormat::Native { encoding, .. } => encoding,
        }
    }

    /// The encoding of its AOF form, `RL.SETSTATE`'s decimal fields (the
    /// AOF rewrite without an RDB preamble): encoding 1 for every type,
    /// which every release reads (`RL.SETSTATE` reads the newer ones too).
    fn encoding() -> i32 {
        1
    }

    /// Its counters for `INFO ratelimit`.
    fn stats() -> &'static Outcomes {
        &COUNTERS[Self::INDEX]
    }
}

/// Each algorithm's counters, by row ([`Listed::stats`]).
static COUNTERS: [Outcomes; COUNT] = [const { Outcomes::new() }; COUNT];

/// What follows the first `.` of `name` (all of it if there is none).
pub const fn after_dot(name: &'static CStr) -> &'static CStr {
    let bytes = name.to_bytes_with_nul();
    let mut i = 0;
    while i < bytes.len() && bytes[i] != b'.' {
        i += 1;
    }
    if i == bytes.len() {
        return name;
    }
    let (_, rest) = bytes.split_at(i + 1);
    match CStr::from_bytes_with_nul(rest) {
        Ok(rest) => rest,
        Err(_) => panic!("a suffix of a C string is a C string"),
    }
}

/// `name` in ASCII lower case, with its NUL (`N` is its length with it).
pub const fn lowercase<const N: usize>(name: &CStr) -> [u8; N] {
    let bytes = name.to_bytes_with_nul();
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N {
        out[i] = bytes[i].to_ascii_lowercase();
        i += 1;
    }
    out
}

/// Where a spec was given, to name it in an error.
#[derive(Clone, Copy, Debug)]
pub enum Site {
    /// `RL.POLICY SET` (and a policy loaded from RDB).
    Policy,
    /// The n-th spec of `RL.ALL`, from 1.
    InCall(usize),
}

impl Site {
    fn allows(self, specs: Specs) -> bool {
        match self {
            Site::Policy => specs.policies,
            Site::InCall(_) => specs.all,
        }
    }
}

impl std::fmt::Display for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Site::Policy => f.write_str("policy"),
            Site::InCall(n) => write!(f, "spec {n}"),
        }
    }
}

impl Spec {
    /// Parses `<ALGORITHM> <params...>` at the start of `args`; returns the
    /// spec and how many words it took. `what` names it in errors (and is
    /// only formatted for one, so a good call builds no string).
    pub fn parse(args: &[&[u8]], what: Site) -> Result<(Spec, usize), Error> {
        fn params<L: Listed>(args: &[&[u8]], what: Site) -> Result<Spec, Error> {
            let count = <L::Params as Params>::COUNT;
            if args.len() < 1 + count {
                return Err(Error::Syntax(format!("{what} needs {count} parameters")));
            }
            Ok(L::spec(L::Params::parse(&args[1..1 + count])?))
        }
        let name = args.first().copied().unwrap_or_default();
        let mut known = false;
        for_each_algorithm!(L => {
            if name.eq_ignore_ascii_case(L::WORD.to_bytes()) {
                if what.allows(L::ROW.specs) {
                    let spec = params::<L>(args, what)?;
                    return Ok((spec, 1 + spec.param_count()));
                }
                known = true;
            }
        });
        if known {
            return Err(Error::Syntax(format!(
                "{what}: {} cannot be used here",
                Error::quote(name).to_ascii_uppercase()
            )));
        }
        Err(Error::Syntax(format!(
            "{what}: unknown algorithm '{}' (expected {})",
            Error::quote(name),
            words_allowed(what).join(", ")
        )))
    }

    /// Whether `RL.ALL` may use it (inline or through a policy).
    pub fn in_all(&self) -> bool {
        with_algorithm!(*self, L, _p => L::ROW.specs.all)
    }

    /// The algorithm's name, as in a spec.
    pub fn name(&self) -> &'static str {
        with_algorithm!(*self, L, _p => word::<L>())
    }

    /// The parameters, in command order (no allocation).
    pub fn params(&self) -> ParamList {
        with_algorithm!(*self, L, p => p.values())
    }

    /// The limit a caller is told about: the capacity, or requests per window.
    pub fn limit(&self) -> u64 {
        self.params().as_slice()[0]
    }

    /// The spec under a policy's scale (percent): each size and rate
    /// parameter its row lists becomes `max(1, floor(p x scale / 100))`.
    /// Parameters the rules would refuse scaled (a span beyond its bound)
    /// stay as they are.
    pub fn scaled(&self, scale: u64) -> Spec {
        if scale >= 100 {
            return *self;
        }
        with_algorithm!(*self, L, p => {
            let mut values = p.values();
            let values = values.as_mut_slice();
            for &i in L::ROW.scaled {
                values[i] = crate::limiter::protection::scaled(values[i], scale);
            }
            match <<L as Algorithm>::Params as Parameters>::from_integers(values) {
                Ok(scaled) => L::spec(scaled),
                Err(_) => *self,
            }
        })
    }

    /// Whether its calls count in a time zone (a calendar quota: its
    /// policy takes `TZ zone`).
    pub fn has_zone(&self) -> bool {
        with_algorithm!(*self, L, p => (L::ROW.period_end)(&p).is_some())
    }

    /// The keyword that parameter `i` stands for, if it is one (a quota's
    /// period: `DAY`, ...).
    pub fn keyword(&self, i: usize, value: u64) -> Option<&'static str> {
        with_algorithm!(*self, L, _p => {
            let int = <<L as Algorithm>::Params as Parameters>::INTEGERS.get(i)?;
            int.keywords.get(usize::try_from(value).ok()?).copied()
        })
    }

    pub fn param_count(&self) -> usize {
        with_algorithm!(*self, L, _p => <<L as Algorithm>::Params as Params>::COUNT)
    }
}

/// Algorithms as `COMMAND DOCS` keywords (`tokenbucket`, typed
/// `TOKENBUCKET`), those of the rows that allow them.
pub struct Keywords {
    args: [Arg; COUNT],
    len: usize,
}

impl Keywords {
    /// From (keyword name, token, allowed) per row.
    const fn of(rows: [(&'static CStr, &'static CStr, bool); COUNT]) -> Keywords {
        let mut args = [Arg::string(c""); COUNT];
        let (mut i, mut len) = (0, 0);
        while i < COUNT {
            let (name, token, allowed) = rows[i];
            if allowed {
                args[len] = Arg::keyword(name, token);
                len += 1;
            }
            i += 1;
        }
        Keywords { args, len }
    }

    pub const fn as_slice(&'static self) -> &'static [Arg] {
        self.args.split_at(self.len).0
    }
}

/// `L::WORD` as text.
pub fn word<L: Listed>() -> &'static str {
    L::WORD.to_str().unwrap_or_default()
}

/// The words a spec at `site` may start with, in table order.
pub fn words_allowed(site: Site) -> Vec<&'static str> {
    let mut words = Vec::new();
    for_each_algorithm!(L => {
        if site.allows(L::ROW.specs) {
            words.push(word::<L>());
        }
    });
    words
}

/// The table's macro: from the rows, the [`Spec`] enum (one variant per
/// algorithm, holding its parameters), the [`Listed`] impls, [`COUNT`], and
/// two macros that run code once per algorithm, as a type:
///
/// - `with_algorithm!(spec, L, p => body)`: `body` with `L` the algorithm
///   of `spec` and `p` its parameters;
/// - `for_each_algorithm!(L => body)`: `body` for every row, in order.
///
/// (`$` is passed in so that the generated macros can have arguments.)
macro_rules! algorithms {
    ($d:tt $($Alg:ident : $Repr:ty => $row:expr),+ $(,)?) => {
        /// One algorithm with validated parameters: a spec of `RL.ALL` or a
        /// policy.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Spec {
            $($Alg(<$Alg as Algorithm>::Params)),+
        }

        /// The rows' positions.
        #[allow(dead_code)]
        enum Position {
            $($Alg),+
        }

        /// How many rows.
        pub const COUNT: usize = [$(stringify!($Alg)),+].len();

        /// The algorithms `RL.POLICY SET` takes, as `COMMAND DOCS` keywords.
        pub static POLICY_KEYWORDS: Keywords = Keywords::of([$((
            <$Alg as Listed>::INFO_NAME,
            <$Alg as Listed>::WORD,
            <$Alg as Listed>::ROW.specs.policies,
        )),+]);

        $(
            impl Listed for $Alg {
                type Repr = $Repr;
                const ROW: Row<Self> = $row;
                const INDEX: usize = Position::$Alg as usize;
                const EVENT: &'static CStr = {
                    const NAME: &CStr = <$Alg as Listed>::ROW.command;
                    const LOWER: [u8; NAME.to_bytes_with_nul().len()] = lowercase(NAME);
                    match CStr::from_bytes_with_nul(&LOWER) {
                        Ok(event) => event,
                        Err(_) => panic!("a command name has one NUL"),
                    }
                };

                fn data_type() -> &'static DataType<Self> {
                    static TYPE: DataType<$Alg> = DataType::new();
                    &TYPE
                }

                fn spec(params: Self::Params) -> Spec {
                    Spec::$Alg(params)
                }
            }
        )+

        macro_rules! with_algorithm {
            ($d spec:expr, $d L:ident, $d p:ident => $d body:expr) => {
                match $d spec {
                    $(
                        $crate::algorithms::Spec::$Alg($d p) => {
                            #[allow(dead_code)]
                            type $d L = $crate::limiter::$Alg;
                            $d body
                        }
                    )+
                }
            };
        }
        pub(crate) use with_algorithm;

        macro_rules! for_each_algorithm {
            ($d L:ident => $d body:expr) => {{
                $({
                    #[allow(dead_code)]
                    type $d L = $crate::limiter::$Alg;
                    $d body;
                })+
            }};
        }
        pub(crate) use for_each_algorithm;
    };
}
use algorithms;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row names its command, its type and its documentation, and
    /// no two rows share a name.
    #[test]
    fn every_row_gives_its_names_once() {
        let mut seen = Vec::new();
        for_each_algorithm!(L => {
            let KeyFormat::Native { type_name, encoding } = L::ROW.key;
            assert!(L::ROW.command.to_bytes().starts_with(b"RL."), "{:?}", L::ROW.command);
            assert_eq!(type_name.to_bytes().len(), 9, "{type_name:?}");
            assert!(encoding >= 1);
            assert!(!L::ROW.summary.is_empty() && !L::ROW.complexity.is_empty());
            seen.push((L::WORD, type_name, L::INDEX));
        });
        assert_eq!(seen.len(), COUNT);
        for (i, (word, type_name, index)) in seen.iter().enumerate() {
            assert_eq!(*index, i, "rows are indexed in order");
            for (other, other_type, _) in &seen[..i] {
                assert!(word != other && type_name != other_type, "{word:?}");
            }
        }
    }

    /// The table serves every algorithm of the core, in the core's order
    /// (`limiter::for_each_algorithm`, which the core's and the contract
    /// file's per-algorithm tests iterate), under the core's word.
    #[test]
    fn the_table_has_a_row_for_every_algorithm_of_the_core() {
        struct Words(Vec<&'static str>);
        impl crate::limiter::EachAlgorithm for Words {
            fn visit<A: crate::limiter::Sampled + crate::limiter::contract::Guarantee>(
                &mut self,
                word: &'static str,
            ) {
                self.0.push(word);
            }
        }
        let mut core = Words(Vec::new());
        crate::limiter::for_each_algorithm(&mut core);
        let mut table = Vec::new();
        for_each_algorithm!(L => table.push(L::WORD.to_str().expect("ASCII")));
        assert_eq!(table, core.0);
    }

    /// `COMMAND DOCS` shows `UPTO` exactly where the command takes it.
    #[test]
    fn documented_upto_is_where_the_row_takes_it() {
        for_each_algorithm!(L => {
            let documented = L::ROW
                .args
                .iter()
                .any(|arg| arg.name() == crate::args::COST_REFUND_OR_UPTO.name());
            assert_eq!(documented, L::ROW.upto, "{:?}", L::ROW.command);
        });
        let without: Vec<_> = {
            let mut v = Vec::new();
            for_each_algorithm!(L => if !L::ROW.upto { v.push(word::<L>()) });
            v
        };
        assert_eq!(without, ["LEAKYBUCKET", "CONCURRENCY"]);
    }

    /// `COMMAND DOCS` names the parameters as the core does in errors.
    #[test]
    fn documented_parameters_are_the_cores() {
        use crate::limiter::Parameters;
        for_each_algorithm!(L => {
            let documented: Vec<_> = L::ROW.args[1..]
                .iter()
                .take(<<L as Algorithm>::Params as Params>::COUNT)
                .map(|arg| arg.name().to_str().unwrap())
                .collect();
            let core: Vec<_> = <<L as Algorithm>::Params as Parameters>::INTEGERS.iter().map(|p| p.name).collect();
            assert_eq!(documented, core, "{:?}", L::ROW.command);
        });
    }

    #[test]
    fn names_come_from_the_command() {
        assert_eq!(TokenBucket::WORD, c"TOKENBUCKET");
        assert_eq!(TokenBucket::EVENT, c"rl.tokenbucket");
        assert_eq!(TokenBucket::INFO_NAME, c"tokenbucket");
        assert_eq!(SlidingLog::WORD, c"SLIDING");
        assert_eq!(SlidingLog::INFO_NAME, c"sliding");
        assert_eq!(after_dot(c"nodot"), c"nodot");
    }

    #[test]
    fn specs_name_the_algorithms_in_table_order() {
        assert_eq!(
            words_allowed(Site::Policy).join(", "),
            "TOKENBUCKET, FIXEDWINDOW, LEAKYBUCKET, SLIDING, HASHWINDOW, CONCURRENCY, QUOTA"
        );
        let (spec, words) =
            Spec::parse(&[b"sliding", b"5", b"1000", b"COST"], Site::InCall(1)).unwrap();
        assert_eq!(
            (spec.name(), words, spec.params().as_slice()),
            ("SLIDING", 3, &[5, 1000][..])
        );
        assert_eq!(
            Spec::parse(&[b"BUCKET", b"1"], Site::Policy).unwrap_err().message(),
            "ERR policy: unknown algorithm 'BUCKET' (expected TOKENBUCKET, FIXEDWINDOW, LEAKYBUCKET, SLIDING, HASHWINDOW, CONCURRENCY, QUOTA)"
        );
    }
}
