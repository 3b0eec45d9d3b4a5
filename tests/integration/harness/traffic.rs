//! Mixed limiter traffic for the load and fault tests: every algorithm,
//! `RL.HIT` and `RL.ALL` over a fixed keyspace, each reply checked for its
//! shape and counted.

use super::*;

/// A small deterministic generator (xorshift64), so a failing run replays.
pub struct Xorshift64(pub u64);

impl Xorshift64 {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// One of `choices`.
    pub fn pick<'a>(&mut self, choices: &[&'a str]) -> &'a str {
        choices[self.below(choices.len())]
    }
}

/// Policies [`MixedTraffic`] calls through `RL.HIT` and `RL.ALL`:
/// an enforced tight rule, an enforced wide one, and a tight one in shadow.
pub const MIXED_POLICIES: [(&str, &[&str]); 3] = [
    ("mixed:tight", &["TOKENBUCKET", "4", "1", "600000"]),
    ("mixed:wide", &["TOKENBUCKET", "1000000000", "1", "600000"]),
    (
        "mixed:shadow",
        &["TOKENBUCKET", "3", "1", "600000", "MODE", "SHADOW"],
    ),
];

/// Costs the traffic draws from: mostly 1, some inspections (`COST 0`), and
/// 7, above every tight limit, which no tight limiter can ever admit.
const MIXED_COSTS: [u64; 8] = [0, 1, 1, 1, 1, 2, 3, 7];

/// Mixed traffic over every algorithm, `RL.HIT` and `RL.ALL`, on a fixed
/// keyspace: `<alg>:<n>` for `n` below `keys_per_algorithm`. Even `n` are
/// tight limiters (a handful of units, one back every 10 minutes: soon
/// denying), odd `n` wide ones (10^9 units: always admitting), so the traffic
/// keeps both admitting and denying. Each key always gets the same
/// parameters. Every TTL is minutes long, so no key expires during a test,
/// and master and replica can be compared key by key once traffic stops.
pub struct MixedTraffic {
    keys_per_algorithm: usize,
    fixed_window_ms: String,
}

/// One command of the traffic and what its reply must look like.
pub struct MixedCall {
    pub words: Vec<String>,
    pub expect: Expected,
}

/// The shape a reply must have.
#[derive(Clone, Debug)]
pub struct Expected {
    /// The command name as `INFO commandstats` shows it, lowercased.
    pub name: &'static str,
    /// The limit of each limiter involved (one, or one per `RL.ALL` key).
    pub limits: Vec<i64>,
    /// Whether each limiter is a policy in shadow mode (never denies).
    pub shadow: Vec<bool>,
    pub cost: i64,
    /// A leaky bucket may ask an admitted caller to wait.
    pub may_queue: bool,
}

/// What the traffic got back, summed over calls.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Calls sent, by lowercased command name.
    pub sent: std::collections::BTreeMap<&'static str, u64>,
    pub admitted: u64,
    pub denied: u64,
    /// Limiter calls the master must have propagated: one per enforced
    /// limiter of each admitted call with a cost.
    pub propagated_exactly: u64,
    /// Limiter calls it may also have propagated: one per shadow limiter of
    /// each admitted call with a cost (shadow consumes only what the rule
    /// would admit).
    pub propagated_at_most: u64,
}

impl Tally {
    pub fn total(&self) -> u64 {
        self.sent.values().sum()
    }

    pub fn add(&mut self, other: &Tally) {
        for (name, count) in &other.sent {
            *self.sent.entry(name).or_default() += count;
        }
        self.admitted += other.admitted;
        self.denied += other.denied;
        self.propagated_exactly += other.propagated_exactly;
        self.propagated_at_most += other.propagated_at_most;
    }
}

impl Expected {
    /// Checks a reply is well formed for this call: an array of five
    /// integers (six for `RL.ALL`), consistent with the limits and the cost.
    /// Returns whether the call was admitted.
    pub fn check(&self, value: &Value) -> Result<bool, String> {
        let ints: Vec<i64> = match value {
            Value::Array(items) => items
                .iter()
                .map(|item| match item {
                    Value::Int(i) => Ok(*i),
                    other => Err(format!("a non-integer in the reply: {other:?}")),
                })
                .collect::<Result<_, _>>()?,
            other => return Err(format!("not an array of integers: {other:?}")),
        };
        let all = self.limits.len() > 1;
        let expected_len = if all { 6 } else { 5 };
        if ints.len() != expected_len {
            return Err(format!("{} integers, expected {expected_len}", ints.len()));
        }
        let (allowed, limit, remaining, wait_ms, reset_ms) =
            (ints[0], ints[1], ints[2], ints[3], ints[4]);
        let fail = |why: &str| Err(format!("{why}: {ints:?}"));
        if allowed != 0 && allowed != 1 {
            return fail("allowed is neither 0 nor 1");
        }
        if !self.limits.contains(&limit) {
            return fail(&format!("limit is not one of {:?}", self.limits));
        }
        if remaining < 0 || remaining > limit {
            return fail("remaining is outside 0..=limit");
        }
        if reset_ms < 0 {
            return fail("reset_ms is negative");
        }
        let enforced = || self.limits.iter().zip(&self.shadow).filter(|(_, s)| !**s);
        let never_fits = enforced().any(|(limit, _)| self.cost > *limit);
        if allowed == 1 {
            if never_fits {
                return fail("admitted a cost above an enforced limit");
            }
            if wait_ms != 0 && !(self.may_queue && wait_ms > 0) {
                return fail("admitted with a wait_ms");
            }
        } else {
            if self.cost == 0 {
                return fail("COST 0 denied");
            }
            if enforced().next().is_none() {
                return fail("a shadow policy denied");
            }
            if never_fits && wait_ms != -1 {
                return fail("a cost above the limit must have wait_ms -1");
            }
            if !never_fits && wait_ms < 1 {
                return fail("a denial must say how long to wait");
            }
        }
        if all {
            let denied_by = ints[5];
            let ok = if allowed == 1 {
                denied_by == 0
            } else {
                (1..=self.limits.len() as i64).contains(&denied_by)
            };
            if !ok {
                return fail("denied_by does not match allowed");
            }
        }
        Ok(allowed == 1)
    }

    /// Counts one call with this reply into `tally`.
    pub fn count(&self, admitted: bool, tally: &mut Tally) {
        *tally.sent.entry(self.name).or_default() += 1;
        if admitted {
            tally.admitted += 1;
        } else {
            tally.denied += 1;
        }
        if admitted && self.cost > 0 {
            let shadowed = self.shadow.iter().filter(|s| **s).count() as u64;
            tally.propagated_exactly += self.limits.len() as u64 - shadowed;
            tally.propagated_at_most += shadowed;
        }
    }
}

impl MixedTraffic {
    /// Traffic over `keys_per_algorithm` keys of each kind. Picks a fixed
    /// window whose current window has at least 15 minutes left on `con`'s
    /// clock, so no fixed-window key expires during the test, and creates
    /// the policies.
    pub fn new(con: &mut Connection, keys_per_algorithm: usize) -> MixedTraffic {
        let now_ms = server_time_us(con) / 1000;
        let fixed_window_ms = (3_600_000u64..)
            .step_by(60_000)
            .find(|window_ms| window_ms - now_ms % window_ms > 15 * 60_000)
            .expect("some window");
        for (name, rule) in MIXED_POLICIES {
            let mut words = vec!["RL.POLICY", "SET", name];
            words.extend_from_slice(rule);
            let _: () = query(con, &words);
        }
        MixedTraffic {
            keys_per_algorithm,
            fixed_window_ms: fixed_window_ms.to_string(),
        }
    }

    const PREFIXES: [&'static str; 6] = ["tb", "fw", "lb", "sl", "hw", "hit"];

    /// Every key the traffic may write.
    pub fn keys(&self) -> Vec<String> {
        Self::PREFIXES
            .iter()
            .flat_map(|prefix| (0..self.keys_per_algorithm).map(move |n| format!("{prefix}:{n}")))
            .collect()
    }

    /// Parameters after the key, and the limit, for limiter `prefix:n`.
    fn params(&self, prefix: &str, n: usize) -> (Vec<String>, i64) {
        let wide = n % 2 == 1;
        let words: Vec<&str> = match (prefix, wide) {
            ("tb", false) => vec!["TOKENBUCKET", "5", "1", "600000"],
            ("tb", true) => vec!["TOKENBUCKET", "1000000000", "1", "600000"],
            ("fw", false) => vec!["FIXEDWINDOW", "6", &self.fixed_window_ms],
            ("fw", true) => vec!["FIXEDWINDOW", "1000000000", &self.fixed_window_ms],
            ("lb", false) => vec!["LEAKYBUCKET", "6", "1", "600000"],
            ("lb", true) => vec!["LEAKYBUCKET", "1000000000", "1", "600000"],
            ("sl", false) => vec!["SLIDING", "5", "600000"],
            ("sl", true) => vec!["SLIDING", "100000", "600000"],
            ("hw", false) => vec!["HASHWINDOW", "5", "600000", "60000"],
            ("hw", true) => vec!["HASHWINDOW", "1000000000", "600000", "60000"],
            _ => unreachable!("no limiter {prefix}"),
        };
        let limit = words[1].parse().unwrap();
        (words.iter().map(|w| w.to_string()).collect(), limit)
    }

    /// The policy for `hit:n`: its name, limit and whether it is in shadow.
    fn policy(n: usize) -> (&'static str, i64, bool) {
        let (name, rule) = MIXED_POLICIES[n % MIXED_POLICIES.len()];
        (name, rule[1].parse().unwrap(), rule.contains(&"SHADOW"))
    }

    fn single(&self, prefix: &str, n: usize, cost: u64) -> MixedCall {
        let key = format!("{prefix}:{n}");
        if prefix == "hit" {
            let (policy, limit, shadow) = Self::policy(n);
            return MixedCall {
                words: ["RL.HIT", policy, &key, "COST", &cost.to_string()]
                    .map(String::from)
                    .to_vec(),
                expect: Expected {
                    name: "rl.hit",
                    limits: vec![limit],
                    shadow: vec![shadow],
                    cost: cost as i64,
                    may_queue: false,
                },
            };
        }
        let (params, limit) = self.params(prefix, n);
        let mut words = vec![format!("RL.{}", params[0]), key];
        words.extend(params[1..].iter().cloned());
        words.extend(["COST".to_string(), cost.to_string()]);
        let name = match prefix {
            "tb" => "rl.tokenbucket",
            "fw" => "rl.fixedwindow",
            "lb" => "rl.leakybucket",
            "sl" => "rl.sliding",
            _ => "rl.hashwindow",
        };
        MixedCall {
            words,
            expect: Expected {
                name,
                limits: vec![limit],
                shadow: vec![false],
                cost: cost as i64,
                may_queue: prefix == "lb",
            },
        }
    }

    /// `RL.ALL` over `tb:n`, `sl:n` and `hit:n`, with the same parameters
    /// and policy each gets on its own.
    fn all(&self, n: usize, cost: u64) -> MixedCall {
        let mut words: Vec<String> = ["RL.ALL", "3"].map(String::from).to_vec();
        words.extend(["tb", "sl", "hit"].map(|prefix| format!("{prefix}:{n}")));
        let (tb, tb_limit) = self.params("tb", n);
        let (sl, sl_limit) = self.params("sl", n);
        let (policy, policy_limit, shadow) = Self::policy(n);
        words.extend(tb);
        words.extend(sl);
        words.extend(["POLICY".to_string(), policy.to_string()]);
        words.extend(["COST".to_string(), cost.to_string()]);
        MixedCall {
            words,
            expect: Expected {
                name: "rl.all",
                limits: vec![tb_limit, sl_limit, policy_limit],
                shadow: vec![false, false, shadow],
                cost: cost as i64,
                may_queue: false,
            },
        }
    }

    /// One admitted call per key, so every key exists.
    pub fn preload(&self) -> Vec<MixedCall> {
        Self::PREFIXES
            .iter()
            .flat_map(|prefix| (0..self.keys_per_algorithm).map(move |n| self.single(prefix, n, 1)))
            .collect()
    }

    /// A random call: each algorithm, `RL.HIT` and `RL.ALL`, with random
    /// keys and costs.
    pub fn random(&self, rng: &mut Xorshift64) -> MixedCall {
        let n = rng.below(self.keys_per_algorithm);
        let cost = MIXED_COSTS[rng.below(MIXED_COSTS.len())];
        match rng.below(8) {
            0 | 1 => self.single("tb", n, cost),
            2 => self.single("fw", n, cost),
            3 => self.single("lb", n, cost),
            4 => self.single("sl", n, cost),
            5 => self.single("hw", n, cost),
            6 => self.single("hit", n, cost),
            _ => self.all(n, cost),
        }
    }
}

/// Sends `calls` in one pipeline, checks every reply (panicking with the
/// command and the reply otherwise) and counts them into `tally`.
pub fn send_checked(con: &mut Connection, calls: &[MixedCall], tally: &mut Tally) {
    let mut pipe = redis::pipe();
    for call in calls {
        let words: Vec<&str> = call.words.iter().map(String::as_str).collect();
        pipe.add_command(command(&words));
    }
    let replies: Vec<Value> = pipe
        .query(con)
        .unwrap_or_else(|e| panic!("pipeline starting {:?}: {}", calls[0].words, error_text(&e)));
    assert_eq!(replies.len(), calls.len(), "one reply per command");
    for (call, reply) in calls.iter().zip(&replies) {
        match call.expect.check(reply) {
            Ok(admitted) => call.expect.count(admitted, tally),
            Err(why) => panic!("{:?} got a malformed reply: {why}", call.words),
        }
    }
}
