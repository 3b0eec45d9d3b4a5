//! The seven limiter commands described as data, so that a contract every
//! one of them keeps (denials change nothing, replicas converge, state
//! survives a restart, bad input is refused, ...) is written once and checked
//! for all of them: see the tests in `contract/` and in `features/`
//! (`refund_force.rs`, `notifications.rs`, `observability.rs`). What only one
//! algorithm promises stays in its own file in `algorithms/`
//! (`token_bucket.rs`, ...). The table holds every algorithm the core has, a
//! test below checks (`the_table_has_every_algorithm_of_the_core`).
//!
//! Every algorithm's first parameter is its limit (a capacity, a count per
//! window or period, or units held at once), so a test states the limit and
//! the table the rest. Where a promise cannot be checked for one of them
//! within a test (a quota's shortest period is a day), its row says so as
//! data (an `Option` left `None`), and the test skips that row by reading
//! it.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use super::*;

/// Long periods: nothing refills, drains or leaves a window during a test.
pub const SLOW_MS: i64 = 1_000_000;
pub const SLOW: &str = "1000000";
/// Slack for the time a test itself takes, far above any real run.
pub const SLACK_MS: i64 = 10_000;
/// `MAX_PARAM` as an argument.
pub const MAX: &str = "1099511627776";

/// One limiter command and what the shared contracts need to know of it.
pub struct Algorithm {
    /// The command, e.g. `RL.TOKENBUCKET`.
    pub command: &'static str,
    /// Its name in `RL.SETSTATE`, what an AOF rewrite writes for its keys.
    pub setstate_name: &'static str,
    /// What `TYPE` shows for its keys.
    pub type_name: &'static str,
    /// The key a test uses for it (other keys start with it).
    pub key: &'static str,
    /// Its parameters in order, as errors name them.
    pub params: &'static [Param],
    /// The parameters after the limit under which nothing leaves, drains or
    /// refills during a test.
    pub slow: &'static [&'static str],
    /// Other valid parameters after the limit, as a caller may switch to.
    pub other: &'static [&'static str],
    /// Parameters under which a key is idle again within a fraction of a
    /// second; `None` where no key can be (a quota's shortest period is a
    /// day).
    pub fast: Option<Fast>,
    /// Parameters with a limit of 3 under which units come back within a
    /// second; `None` where none can (a quota's units come back when its
    /// period ends, at the earliest at the next midnight).
    pub short: Option<Short>,
    /// Periods aligned on the epoch: the length in ms of the aligned period
    /// of a parameter list (limit first), so that calls that must land in
    /// one period first move away from its end; `None` for limiters without
    /// aligned periods.
    pub aligned: Option<fn(&[&str]) -> u64>,
    /// Its propagated calls carry, besides the master's time (`AT`), the end
    /// of the call's period (`END unix_us`), so that replicas read no
    /// time-zone database.
    pub pins_period_end: bool,
    /// An admitted request may be told to wait for its turn (`wait_ms` > 0).
    pub shapes: bool,
    /// `COMMAND INFO` flags it `fast` (O(1) or about). `RL.CONCURRENCY` is
    /// not: a call walks the leases held on the key.
    pub fast_flag: bool,
    /// Its reply has a sixth integer, the lease granted (0 when none was).
    pub lease: bool,
    /// How far the key's expiry may lie beyond the `reset_ms` of the call
    /// that set it, besides the contract's slack (see
    /// [`Algorithm::latest_expiry_ms`]): 1 where the expiry is an instant
    /// rounded up to the millisecond and `reset_ms` is counted from a clock
    /// reading inside one.
    pub expiry_beyond_reset_ms: i64,
    /// Builds limiters worth keeping (admitted, denied and peeked traffic, a
    /// parameter change) under keys starting with its argument.
    pub build: fn(&mut Connection, &str) -> Vec<Built>,
    /// Random parameters for mixed traffic.
    pub random_params: fn(&mut Xorshift64) -> Vec<&'static str>,
    /// Arguments after the key a key of doubtful content is exercised with.
    pub exercise: &'static [&'static [&'static str]],
    /// Arguments of an `RL.SETSTATE` after the algorithm's name.
    pub setstate_fields: &'static [&'static str],
    /// Refusals of its own beyond a parameter out of range: arguments after
    /// the key, and the exact error.
    pub refusals: &'static [(&'static [&'static str], &'static str)],
}

/// One parameter of a limiter command.
pub enum Param {
    /// An integer from 1 to its largest value, and its name.
    Integer(&'static str, u64),
    /// One of a few words, in any case, or its index among them (what a
    /// call propagated from a policy, whose parameters are numbers, says):
    /// a quota's period.
    Word(&'static str, &'static [&'static str]),
}

impl Param {
    /// A value it refuses.
    pub fn refused(&self) -> &'static str {
        match self {
            Param::Integer(..) => "0",
            Param::Word(..) => "FORTNIGHT",
        }
    }
}

/// See [`Algorithm::fast`]: the parameters (limit first), and the bounds
/// `(above, at_most)` of the `reset_ms` a first call there reports.
pub struct Fast {
    pub params: &'static [&'static str],
    pub reset_ms: (i64, i64),
}

/// See [`Algorithm::short`]: the parameters (limit 3 first), and the longest
/// `wait_ms` a denial there may report.
pub struct Short {
    pub params: &'static [&'static str],
    pub wait_max_ms: i64,
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.command)
    }
}

/// A limiter key a builder left: the parameters it was last called with, and
/// whether its `DUMP` is small enough to corrupt byte by byte in a test.
pub struct Built {
    pub key: String,
    pub params: Vec<&'static str>,
    pub fuzz: bool,
}

impl Algorithm {
    /// The latest PTTL a key may have right after a call that answered
    /// `reset_ms`: the contract lets it expire up to `min(reset_ms, 1000)`
    /// after it is idle, so that a busy key's expiry need not be written on
    /// every call.
    pub fn latest_expiry_ms(&self, reset_ms: i64) -> i64 {
        reset_ms + reset_ms.min(1000) + self.expiry_beyond_reset_ms
    }

    /// Its place in `ALGORITHMS`.
    pub fn index(&self) -> usize {
        ALGORITHMS
            .iter()
            .position(|alg| alg.command == self.command)
            .expect("an algorithm of the table")
    }

    /// The next algorithm in the table: one whose keys are of another type.
    pub fn another(&self) -> &'static Algorithm {
        &ALGORITHMS[(self.index() + 1) % ALGORITHMS.len()]
    }

    /// `command key args...`.
    pub fn words<'a>(&'a self, key: &'a str, args: &[&'a str]) -> Vec<&'a str> {
        let mut words = vec![self.command, key];
        words.extend_from_slice(args);
        words
    }

    /// A call that must succeed.
    pub fn call(&self, con: &mut Connection, key: &str, args: &[&str]) -> Reply {
        self.reply(&query::<Vec<i64>>(con, &self.words(key, args)))
    }

    /// Its reply: the five integers of every limiter, then the lease where
    /// it has one, which is 0 unless the call was admitted.
    pub fn reply(&self, ints: &[i64]) -> Reply {
        if !self.lease {
            return Reply::from_ints(ints);
        }
        assert_eq!(ints.len(), 6, "{self} replies six integers: {ints:?}");
        let reply = Reply::from_ints(&ints[..5]);
        assert!(
            ints[5] >= 0 && (reply.allowed || ints[5] == 0),
            "{self}: a lease of {} with {reply:?}",
            ints[5]
        );
        reply
    }

    /// Its reply, from a `Value` (of a transaction or a script).
    pub fn reply_of(&self, value: &Value) -> Reply {
        match value {
            Value::Array(items) => {
                let ints: Vec<i64> = items
                    .iter()
                    .map(|item| match item {
                        Value::Int(i) => *i,
                        other => panic!("{self} reply holds a non-integer: {other:?}"),
                    })
                    .collect();
                self.reply(&ints)
            }
            other => panic!("{self} reply is not an array: {other:?}"),
        }
    }

    /// A call that must fail; its error.
    pub fn call_err(&self, con: &mut Connection, key: &str, args: &[&str]) -> String {
        query_err(con, &self.words(key, args))
    }

    /// The slow parameters under `limit`.
    pub fn slow_params<'a>(&'a self, limit: &'a str) -> Vec<&'a str> {
        let mut params = vec![limit];
        params.extend_from_slice(self.slow);
        params
    }

    /// A valid parameter list: the slow one with a limit of 5.
    pub fn valid(&self) -> Vec<&str> {
        self.slow_params("5")
    }

    /// A call of `cost` under the slow parameters and `limit`.
    pub fn slow(&self, con: &mut Connection, key: &str, limit: &str, cost: &str) -> Reply {
        let mut args = self.slow_params(limit);
        args.extend(["COST", cost]);
        self.call(con, key, &args)
    }

    /// For periods aligned on the epoch: waits, if needed, until the period
    /// of `params` has at least half of it (at most `SLACK_MS`) left.
    pub fn away_from_window_end(&self, con: &mut Connection, params: &[&str]) {
        if let Some(window_ms) = self.aligned {
            let window_ms = window_ms(params);
            away_from_window_end(con, window_ms, (window_ms / 2).min(SLACK_MS as u64));
        }
    }
}

impl Built {
    fn new(key: String, params: &[&'static str], fuzz: bool) -> Built {
        Built {
            key,
            params: params.to_vec(),
            fuzz,
        }
    }

    /// The reply of a `COST 0` call with its parameters.
    pub fn peek(&self, alg: &Algorithm, con: &mut Connection) -> Reply {
        let mut args = self.params.clone();
        args.extend(["COST", "0"]);
        alg.call(con, &self.key, &args)
    }

    /// An admitted (or not) call of one unit with its parameters.
    pub fn take(&self, alg: &Algorithm, con: &mut Connection) -> Reply {
        alg.call(con, &self.key, &self.params)
    }
}

/// Runs `test` once per algorithm, even when one fails, and fails naming
/// every algorithm (and the server) it failed for.
pub fn for_each_algorithm(kind: ServerKind, mut test: impl FnMut(&'static Algorithm)) {
    let mut failed = Vec::new();
    for alg in &ALGORITHMS {
        eprintln!("--- {alg} on {kind}");
        if catch_unwind(AssertUnwindSafe(|| test(alg))).is_err() {
            failed.push(alg.command);
        }
    }
    assert!(
        failed.is_empty(),
        "on {kind}, failed for: {} (see the panic messages above)",
        failed.join(", ")
    );
}

/// A new connection to a server emptied by `FLUSHALL`, so that what one
/// algorithm's check leaves never meets the next.
pub fn flushed(server: &Server) -> Connection {
    let mut con = server.conn();
    let _: () = query(&mut con, &["FLUSHALL"]);
    con
}

/// Runs `test` for every algorithm on every server kind: one server per
/// kind, emptied before each algorithm, and a new connection each time.
pub fn for_each_algorithm_on_each_server(test: impl Fn(&'static Algorithm, &mut Connection)) {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        for_each_algorithm(kind, |alg| test(alg, &mut flushed(&server)));
    });
}

pub fn assert_between(what: &str, value: i64, above: i64, at_most: i64) {
    assert!(
        value > above && value <= at_most,
        "{what} = {value}, expected in ({above}, {at_most}]"
    );
}

/// A limiter call with the server's clock read just before and just after
/// it (microseconds): the call's own reading lies in between.
pub fn timed(con: &mut Connection, words: &[&str]) -> (Reply, u64, u64) {
    let before = server_time_us(con);
    let reply = rl(con, words);
    let after = server_time_us(con);
    (reply, before, after)
}

/// Waits until the server's clock is at least `us`.
pub fn until_server_time(con: &mut Connection, us: u64) {
    poll_until(
        "the server clock to move on",
        Duration::from_secs(10),
        || server_time_us(con) >= us,
    );
}

// ---------------------------------------------------------------------------
// The table

pub const TOKEN_BUCKET: Algorithm = Algorithm {
    command: "RL.TOKENBUCKET",
    setstate_name: "TOKENBUCKET",
    type_name: "rl-tokbkt",
    key: "tb",
    params: &[
        Param::Integer("capacity", MAX_PARAM),
        Param::Integer("refill_count", MAX_PARAM),
        Param::Integer("refill_ms", MAX_PARAM),
    ],
    slow: &["1", SLOW],
    other: &["3", "999999"],
    fast: Some(Fast {
        params: &["3", "1", "100"],
        reset_ms: (0, 100),
    }),
    short: Some(Short {
        params: &["3", "1", "300"],
        wait_max_ms: 600,
    }),
    aligned: None,
    pins_period_end: false,
    shapes: false,
    fast_flag: true,
    lease: false,
    expiry_beyond_reset_ms: 1,
    build: build_token_buckets,
    random_params: random_bucket_params,
    exercise: BUCKET_EXERCISE,
    setstate_fields: &["1", "1", "0", "1", "1000"],
    refusals: &[
        // 1025 tokens at one per 2^40 ms: 2^50 + 2^40 ms to fill.
        (&["1025", "1", MAX], TOKEN_BUCKET_TOO_SLOW),
        (&[MAX, "1", MAX], TOKEN_BUCKET_TOO_SLOW),
        (&[MAX, "1", MAX, "COST", "0"], TOKEN_BUCKET_TOO_SLOW),
    ],
};

/// Parameters of a token or leaky bucket for mixed traffic.
fn random_bucket_params(random: &mut Xorshift64) -> Vec<&'static str> {
    vec![
        random.pick(&["3", "10", "10", "1000"]),
        random.pick(&["1", "3", "7"]),
        random.pick(&["1", "997", "1000", "86400000"]),
    ]
}

const BUCKET_EXERCISE: &[&[&str]] = &[
    &["10", "1", SLOW, "COST", "0"],
    &["10", "1", SLOW],
    &["3", "7", "10"],
    &["1000", "1", "1", "COST", "5"],
];

const TOKEN_BUCKET_TOO_SLOW: &str = "ERR capacity * refill_ms / refill_count (the time to \
    fill the bucket) is too long: a limiter may take at most 1125899906842624 ms to get \
    back to idle";

pub const FIXED_WINDOW: Algorithm = Algorithm {
    command: "RL.FIXEDWINDOW",
    setstate_name: "FIXEDWINDOW",
    type_name: "rl-fixwin",
    key: "fw",
    params: &[
        Param::Integer("limit", MAX_PARAM),
        Param::Integer("window_ms", MAX_PARAM),
    ],
    slow: &[SLOW],
    other: &["60000"],
    fast: Some(Fast {
        params: &["5", "200"],
        reset_ms: (0, 200),
    }),
    short: Some(Short {
        params: &["3", "300"],
        wait_max_ms: 300,
    }),
    aligned: Some(second_param_window),
    pins_period_end: false,
    shapes: false,
    fast_flag: true,
    lease: false,
    expiry_beyond_reset_ms: 1,
    build: build_fixed_windows,
    random_params: |random| {
        vec![
            random.pick(&["2", "10", "10", "100"]),
            random.pick(&["1000", "60000", "60000", "3600000"]),
        ]
    },
    exercise: &[&["10", SLOW, "COST", "0"], &["10", SLOW], &["3", "10"]],
    setstate_fields: &["1", "0", "1000", "1"],
    refusals: &[],
};

pub const LEAKY_BUCKET: Algorithm = Algorithm {
    command: "RL.LEAKYBUCKET",
    setstate_name: "LEAKYBUCKET",
    type_name: "rl-leakbk",
    key: "lb",
    params: &[
        Param::Integer("capacity", MAX_PARAM),
        Param::Integer("leak_count", MAX_PARAM),
        Param::Integer("leak_ms", MAX_PARAM),
    ],
    slow: &["1", SLOW],
    other: &["7", "999999"],
    fast: Some(Fast {
        params: &["3", "1", "100"],
        reset_ms: (0, 100),
    }),
    short: Some(Short {
        params: &["3", "1", "300"],
        wait_max_ms: 600,
    }),
    aligned: None,
    pins_period_end: false,
    shapes: true,
    fast_flag: true,
    lease: false,
    expiry_beyond_reset_ms: 1,
    build: build_leaky_buckets,
    random_params: random_bucket_params,
    exercise: BUCKET_EXERCISE,
    setstate_fields: &["1", "1700000000000000", "0", "1", "1000"],
    refusals: &[
        // 1025 units at one per 2^40 ms: 2^50 + 2^40 ms to drain.
        (&["1025", "1", MAX], LEAKY_BUCKET_TOO_SLOW),
        (&[MAX, "1", MAX, "COST", "0"], LEAKY_BUCKET_TOO_SLOW),
    ],
};

const LEAKY_BUCKET_TOO_SLOW: &str = "ERR capacity * leak_ms / leak_count (the time to drain \
    a full queue) is too long: a limiter may take at most 1125899906842624 ms to get back \
    to idle";

pub const SLIDING_LOG: Algorithm = Algorithm {
    command: "RL.SLIDING",
    setstate_name: "SLIDING",
    type_name: "rl-slilog",
    key: "sl",
    params: &[
        Param::Integer("limit", 16_777_215),
        Param::Integer("window_ms", MAX_PARAM),
    ],
    slow: &[SLOW],
    other: &["60000"],
    // The entry is stamped at the next whole millisecond, and reset_ms is
    // the window all the same.
    fast: Some(Fast {
        params: &["5", "200"],
        reset_ms: (199, 200),
    }),
    short: Some(Short {
        params: &["3", "300"],
        wait_max_ms: 301,
    }),
    aligned: None,
    pins_period_end: false,
    shapes: false,
    fast_flag: true,
    lease: false,
    // The key expires when its newest entry leaves, at the millisecond the
    // entry was rounded up to; reset_ms counts from the request.
    expiry_beyond_reset_ms: 1,
    build: build_sliding_logs,
    random_params: |random| {
        vec![
            random.pick(&["2", "10", "10", "1000"]),
            random.pick(&["1", "50", "1000", "60000", "3600000"]),
        ]
    },
    exercise: &[
        &["10", SLOW, "COST", "0"],
        &["10", SLOW, "COST", "3"],
        &["10", SLOW],
        &["3", "10"],
        &["100000", "1", "COST", "7"],
    ],
    setstate_fields: &["1", "0", "0", "0", "0"],
    refusals: &[(
        &["100001", "1000"],
        "ERR limit is above ratelimit.sliding-max-limit (100000)",
    )],
};

pub const HASH_WINDOW: Algorithm = Algorithm {
    command: "RL.HASHWINDOW",
    setstate_name: "HASHWINDOW",
    type_name: "rl-hashwn",
    key: "hw",
    params: &[
        Param::Integer("limit", MAX_PARAM),
        Param::Integer("window_ms", MAX_PARAM),
        Param::Integer("bucket_ms", MAX_PARAM),
    ],
    // Ten buckets of 100 s.
    slow: &[SLOW, "100000"],
    other: &["60000", "1000"],
    fast: Some(Fast {
        params: &["5", "300", "100"],
        reset_ms: (100, 400),
    }),
    short: Some(Short {
        params: &["3", "300", "100"],
        wait_max_ms: 400,
    }),
    aligned: None,
    pins_period_end: false,
    shapes: false,
    fast_flag: true,
    lease: false,
    expiry_beyond_reset_ms: 0,
    build: build_hash_windows,
    random_params: |random| {
        let (window_ms, bucket_ms) = [
            ("10", "1"),
            ("1000", "100"),
            ("3000", "1"),
            ("60000", "1000"),
            ("60000", "60000"),
            ("3600000", "60000"),
        ][(random.next() % 6) as usize];
        vec![
            random.pick(&["2", "10", "10", "1000"]),
            window_ms,
            bucket_ms,
        ]
    },
    exercise: &[
        &["100", "40000", "4000", "COST", "0"],
        &["100", "40000", "4000", "COST", "200"],
        &["100", "40000", "4000"],
        &["100", "60000", "1000", "COST", "0"],
        &["3", "10", "1"],
    ],
    setstate_fields: &["1", "1000", "1", "0", "1", "0"],
    refusals: &[
        (&["5", "1000", "300"], "ERR bucket_ms must divide window_ms"),
        (
            &["5", "1000", "2000"],
            "ERR bucket_ms must divide window_ms",
        ),
        (
            &["5", "3601", "1"],
            "ERR window_ms / bucket_ms is above ratelimit.hashwindow-max-buckets (3600)",
        ),
        (
            &["5", "1000001", "1"],
            "ERR window_ms / bucket_ms must be an integer from 1 to 1000000",
        ),
        (
            &["5", MAX, "1"],
            "ERR window_ms / bucket_ms must be an integer from 1 to 1000000",
        ),
    ],
};

/// A day, in ms: every period of a quota in UTC (a day, an ISO week from
/// Monday, a month, a year) starts at a UTC midnight, a multiple of it since
/// the epoch.
const DAY_MS: u64 = 86_400_000;

/// [`Algorithm::aligned`] of a fixed window: its second parameter.
fn second_param_window(params: &[&str]) -> u64 {
    params[1].parse().expect("a window in ms")
}

pub const QUOTA: Algorithm = Algorithm {
    command: "RL.QUOTA",
    setstate_name: "QUOTA",
    type_name: "rl-quotas",
    key: "qu",
    params: &[
        Param::Integer("limit", MAX_PARAM),
        Param::Word("period", &["DAY", "WEEK", "MONTH", "YEAR"]),
    ],
    // In UTC (no TZ): a period ends at a UTC midnight, which
    // `away_from_window_end` keeps clear of.
    slow: &["DAY"],
    other: &["WEEK"],
    // Its shortest period is a day: neither idle again nor refilled within
    // a test.
    fast: None,
    short: None,
    aligned: Some(|_| DAY_MS),
    pins_period_end: true,
    shapes: false,
    fast_flag: true,
    lease: false,
    // The key expires at its period's end, a whole millisecond.
    expiry_beyond_reset_ms: 0,
    build: build_quotas,
    random_params: |random| {
        let mut params = vec![
            random.pick(&["2", "10", "10", "1000"]),
            random.pick(&["DAY", "WEEK", "MONTH", "YEAR", "day"]),
        ];
        match random.next() % 4 {
            0 => params.extend(["TZ", "+05:30"]),
            1 => params.extend(["TZ", "America/New_York"]),
            _ => {}
        }
        params
    },
    exercise: &[
        &["10", "DAY", "COST", "0"],
        &["10", "DAY"],
        &["10", "MONTH", "COST", "5"],
        &["3", "YEAR", "TZ", "America/New_York"],
    ],
    // End of period (2027-01-01 UTC), count.
    setstate_fields: &["1", "1798761600000000", "1"],
    refusals: &[
        (
            &["5", "DAY", "TZ", "Mars/Olympus"],
            "ERR TZ must be UTC, a fixed offset such as +05:30, or a time zone name such as \
             America/New_York, not 'Mars/Olympus'",
        ),
        (
            &["5", "4"],
            "ERR period must be one of DAY, WEEK, MONTH, YEAR, not '4'",
        ),
        (
            &["5", "DAY", "END", "1798761600000000"],
            "ERR END is reserved for replication and AOF loading",
        ),
    ],
};

pub const CONCURRENCY: Algorithm = Algorithm {
    command: "RL.CONCURRENCY",
    setstate_name: "CONCURRENCY",
    type_name: "rl-concur",
    key: "cc",
    params: &[
        Param::Integer("limit", 16_777_215),
        Param::Integer("lease_ms", MAX_PARAM),
    ],
    // Units come back when a lease ends: released, or lease_ms after it
    // was granted.
    slow: &[SLOW],
    other: &["60000"],
    fast: Some(Fast {
        params: &["5", "100"],
        // Until the lease ends, lease_ms from the call.
        reset_ms: (99, 100),
    }),
    short: Some(Short {
        params: &["3", "300"],
        wait_max_ms: 300,
    }),
    aligned: None,
    pins_period_end: false,
    shapes: false,
    fast_flag: false,
    lease: true,
    expiry_beyond_reset_ms: 1,
    build: build_concurrency,
    random_params: |random| {
        vec![
            random.pick(&["2", "10", "10", "1000"]),
            random.pick(&["1", "50", "1000", "60000", "3600000"]),
        ]
    },
    exercise: &[
        &["10", SLOW, "COST", "0"],
        &["10", SLOW, "COST", "3"],
        &["10", SLOW],
        &["3", "10"],
        &["100000", "1", "COST", "7"],
    ],
    // last_us, last_id, one lease: id, expires_us, units.
    setstate_fields: &[
        "1",
        "1700000000000000",
        "1700000000000000",
        "1",
        "1700000000000000",
        "1700000001000000",
        "1",
    ],
    refusals: &[],
};

/// In the module's order (its rows in `src/algorithms.rs`), which `INFO
/// ratelimit` follows.
pub static ALGORITHMS: [Algorithm; 7] = [
    TOKEN_BUCKET,
    FIXED_WINDOW,
    LEAKY_BUCKET,
    SLIDING_LOG,
    HASH_WINDOW,
    CONCURRENCY,
    QUOTA,
];

/// The table holds every algorithm the module serves, each once: those of
/// `clients/contract/contract.json`, which the core crate writes from its
/// own list of algorithms (the Rust kit's test `contract` fails while the
/// checked-in file differs from what the core would write). So an algorithm
/// added to the core turns this red until it has a row here, and with it
/// every contract test above. The file is preferred to the server's command
/// list, where nothing tells a limiter command from a companion
/// (`RL.RELEASE`) or another command (`RL.HIT`) but a list kept by hand.
#[test]
fn the_table_has_every_algorithm_of_the_core() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/contract/contract.json");
    let text = std::fs::read_to_string(&path).expect("clients/contract/contract.json");
    let contract: serde_json::Value = serde_json::from_str(&text).expect("the contract is JSON");
    let mut core: Vec<&str> = contract["algorithms"]
        .as_array()
        .expect("algorithms")
        .iter()
        .map(|alg| alg["command"].as_str().expect("a command"))
        .collect();
    core.sort_unstable();
    let mut table: Vec<&str> = ALGORITHMS.iter().map(|alg| alg.command).collect();
    table.sort_unstable();
    assert_eq!(
        table, core,
        "the table's commands and the core's algorithms"
    );
    core.dedup();
    assert_eq!(
        core.len(),
        ALGORITHMS.len(),
        "an algorithm twice in the table"
    );
    // And each row's names agree with the core's word for it.
    for alg in &ALGORITHMS {
        let word = contract["algorithms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["command"] == alg.command)
            .and_then(|a| a["word"].as_str())
            .expect("a word");
        assert_eq!(alg.setstate_name, word, "{alg}");
        assert_eq!(alg.command, format!("RL.{word}"), "{alg}");
    }
}

// ---------------------------------------------------------------------------
// Builders: limiters whose states outlive a test, after traffic of every kind.

/// Costs admitted, denied (20) and peeked (0).
const COSTS: [&str; 5] = ["1", "3", "0", "20", "2"];

fn build_token_buckets(con: &mut Connection, key: &str) -> Vec<Built> {
    build_buckets(con, "RL.TOKENBUCKET", key)
}

/// A token bucket or a leaky bucket (same parameters: capacity, then a rate
/// as a count per period).
fn build_buckets(con: &mut Connection, command: &str, key: &str) -> Vec<Built> {
    let frac = format!("{key}:frac");
    for cost in COSTS {
        rl(con, &[command, key, "10", "1", SLOW, "COST", cost]);
        rl(con, &[command, &frac, "10", "3", "7001", "COST", cost]);
    }
    // In debt, then refunded to below the limit again.
    rl(con, &[command, key, "10", "1", SLOW, "COST", "12", "FORCE"]);
    rl(con, &[command, key, "10", "1", SLOW, "REFUND", "11"]);
    // A parameter change.
    rl(con, &[command, &frac, "12", "7", "9999999"]);
    vec![
        Built::new(key.to_string(), &["10", "1", SLOW], true),
        Built::new(frac, &["12", "7", "9999999"], true),
    ]
}

fn build_fixed_windows(con: &mut Connection, key: &str) -> Vec<Built> {
    let long = format!("{key}:long");
    away_from_window_end(con, 9_999_999, SLACK_MS as u64);
    away_from_window_end(con, SLOW_MS as u64, SLACK_MS as u64);
    for cost in COSTS {
        rl(con, &["RL.FIXEDWINDOW", key, "10", SLOW, "COST", cost]);
        rl(
            con,
            &["RL.FIXEDWINDOW", &long, "10", "9999999", "COST", cost],
        );
    }
    rl(
        con,
        &["RL.FIXEDWINDOW", key, "10", SLOW, "COST", "12", "FORCE"],
    );
    rl(con, &["RL.FIXEDWINDOW", key, "10", SLOW, "REFUND", "11"]);
    // A parameter change.
    rl(con, &["RL.FIXEDWINDOW", &long, "12", "9999999"]);
    vec![
        Built::new(key.to_string(), &["10", SLOW], true),
        Built::new(long, &["12", "9999999"], true),
    ]
}

fn build_leaky_buckets(con: &mut Connection, key: &str) -> Vec<Built> {
    build_buckets(con, "RL.LEAKYBUCKET", key)
}

/// Spread over a few milliseconds, so that the logs hold several entries.
fn build_sliding_logs(con: &mut Connection, key: &str) -> Vec<Built> {
    let big = format!("{key}:big");
    for cost in COSTS.iter().chain(&["1", "1"]) {
        let start = server_time_us(con);
        rl(con, &["RL.SLIDING", key, "10", SLOW, "COST", cost]);
        rl(con, &["RL.SLIDING", &big, "1000", "9999999", "COST", cost]);
        until_server_time(con, start + 2000);
    }
    rl(con, &["RL.SLIDING", key, "10", SLOW, "COST", "12", "FORCE"]);
    rl(con, &["RL.SLIDING", key, "10", SLOW, "REFUND", "13"]);
    // A parameter change.
    rl(con, &["RL.SLIDING", &big, "999", "8888888", "COST", "4"]);
    vec![
        Built::new(key.to_string(), &["10", SLOW], true),
        Built::new(big, &["999", "8888888"], false),
    ]
}

/// Spread over a few bucket widths, so that the fine window (3,600 buckets of
/// 20 ms: a minute and more, so that it outlives a slow full sync on a loaded
/// machine) fills several buckets.
fn build_hash_windows(con: &mut Connection, key: &str) -> Vec<Built> {
    let (fine, ring) = (format!("{key}:fine"), format!("{key}:ring"));
    for cost in COSTS.iter().chain(&["1", "1"]) {
        let start = server_time_us(con);
        rl(
            con,
            &["RL.HASHWINDOW", key, "10", SLOW, "100000", "COST", cost],
        );
        rl(
            con,
            &["RL.HASHWINDOW", &fine, "1000", "72000", "20", "COST", cost],
        );
        rl(
            con,
            &["RL.HASHWINDOW", &ring, "100", "40000", "4000", "COST", cost],
        );
        until_server_time(con, start + 20_000);
    }
    rl(
        con,
        &[
            "RL.HASHWINDOW",
            &fine,
            "1000",
            "72000",
            "20",
            "COST",
            "1500",
            "FORCE",
        ],
    );
    rl(
        con,
        &["RL.HASHWINDOW", &fine, "1000", "72000", "20", "REFUND", "3"],
    );
    // A parameter change.
    rl(
        con,
        &["RL.HASHWINDOW", &ring, "90", "80000", "4000", "COST", "4"],
    );
    vec![
        Built::new(key.to_string(), &["10", SLOW, "100000"], false),
        Built::new(fine, &["1000", "72000", "20"], false),
        Built::new(ring, &["90", "80000", "4000"], true),
    ]
}

/// Quotas in UTC and in another zone. Every zone here starts its periods on
/// a multiple of 30 minutes UTC: half a minute clear of one, the calls land
/// in one period.
fn build_quotas(con: &mut Connection, key: &str) -> Vec<Built> {
    let zoned = format!("{key}:zoned");
    away_from_window_end(con, 1_800_000, 30_000);
    for cost in COSTS {
        rl(con, &["RL.QUOTA", key, "10", "DAY", "COST", cost]);
        rl(
            con,
            &[
                "RL.QUOTA",
                &zoned,
                "10",
                "MONTH",
                "TZ",
                "Asia/Tokyo",
                "COST",
                cost,
            ],
        );
    }
    rl(con, &["RL.QUOTA", key, "10", "DAY", "COST", "12", "FORCE"]);
    rl(con, &["RL.QUOTA", key, "10", "DAY", "REFUND", "11"]);
    // A parameter change: another limit and period (the count stays in the
    // month it was counted in).
    let params = ["12", "YEAR", "TZ", "Asia/Tokyo"];
    rl(con, &[&["RL.QUOTA", zoned.as_str()][..], &params].concat());
    vec![
        Built::new(key.to_string(), &["10", "DAY"], true),
        Built::new(zoned, &params, true),
    ]
}

/// Leases of several sizes, one of them released and one renewed.
fn build_concurrency(con: &mut Connection, key: &str) -> Vec<Built> {
    let long = format!("{key}:long");
    let mut leases = Vec::new();
    for cost in COSTS {
        leases.push(lease_of(
            con,
            &["RL.CONCURRENCY", key, "10", SLOW, "COST", cost],
        ));
        lease_of(
            con,
            &["RL.CONCURRENCY", &long, "10", "7777777", "COST", cost],
        );
    }
    lease_of(
        con,
        &["RL.CONCURRENCY", key, "10", SLOW, "COST", "12", "FORCE"],
    );
    lease_of(con, &["RL.CONCURRENCY", key, "10", SLOW, "REFUND", "11"]);
    // The lease of 3 released, the one of 2 renewed.
    let (three, two) = (leases[1].to_string(), leases[4].to_string());
    let released: i64 = query(con, &["RL.RELEASE", key, &three]);
    let renewed: i64 = query(con, &["RL.RENEW", key, &two, "2000000"]);
    assert_eq!((released, renewed), (1, 1), "leases {leases:?}");
    // A parameter change.
    lease_of(con, &["RL.CONCURRENCY", &long, "12", "9999999"]);
    vec![
        Built::new(key.to_string(), &["10", SLOW], true),
        Built::new(long, &["12", "9999999"], true),
    ]
}

/// The lease an `RL.CONCURRENCY` call was granted (0 if none).
fn lease_of(con: &mut Connection, words: &[&str]) -> i64 {
    let ints: Vec<i64> = query(con, words);
    CONCURRENCY.reply(&ints);
    ints[5]
}
