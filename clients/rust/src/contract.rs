//! The contract file every kit is tested against (`clients/contract/`):
//! written from the core crate (algorithms, parameters and their rules,
//! periods, golden decisions) and from this kit's HTTP answer (the header and
//! problem-body vectors), and checked: this test fails when the checked-in
//! file differs from what it would write. `RL_CONTRACT_WRITE=1 cargo test
//! -p redis-ratelimit-client contract` rewrites it (then every kit's
//! conformance test says what it must follow).
//!
//! The file is data: no kit reads Rust. Its format is described in
//! `clients/contract/README.md`.

use redis_ratelimit_core::{
    quota::utc_period_end, Algorithm, Concurrency, FixedWindow, HashWindow, LeakyBucket, Micros,
    ParamError, Parameters, Period, Quota, QuotaParams, Request, SlidingLog, TokenBucket, Wait,
    MAX_PARAM, MAX_SPAN_MS,
};
use serde_json::{json, Value};

use crate::decision::Path;
use crate::layer::{denial_body, policy_item, ratelimit_item};
use crate::rule::{period_nominal_s, period_word, Spec, Zone};
use crate::Decision;

/// Where the file lives, from this crate's directory.
const FILE: &str = "../contract/contract.json";

/// The parameter a [`ParamError`] names: the argument out of range,
/// `bucket_ms` for a bucket that does not divide its window, `span` for a
/// span too long.
fn named(e: &ParamError) -> &'static str {
    match e {
        ParamError::Range { arg, .. } => arg,
        ParamError::BucketDoesNotDivide => "bucket_ms",
        ParamError::SpanTooLong { .. } | ParamError::SpanOutOfRange { .. } => "span",
    }
}

/// A small deterministic generator (xorshift64*), so the file is the same
/// on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// One algorithm of the file: its word, its parameters' type, and the
/// parameter sets its validation cases and golden sequences start from.
trait Row: Algorithm<Params: Parameters> {
    const WORD: &'static str;
    /// A valid parameter set, the base of the validation cases.
    const BASE: &'static [u64];
    /// Cases across parameters (spans, divisions, bounds).
    const CROSS: &'static [&'static [u64]];
    /// Parameter sets the golden sequences switch between (each valid).
    const GOLDEN: &'static [&'static [u64]];
    /// The parameters a call at `now` runs with (a quota's period end).
    fn at(params: Self::Params, _now: Micros) -> Self::Params {
        params
    }
}

const M: u64 = MAX_PARAM;

impl Row for TokenBucket {
    const WORD: &'static str = "TOKENBUCKET";
    const BASE: &'static [u64] = &[10, 1, 1000];
    const CROSS: &'static [&'static [u64]] = &[
        &[M, 1, M],
        &[1 << 30, 1, 1 << 20],
        &[1 << 30, 1, 1 << 21],
        &[M, M, M],
    ];
    const GOLDEN: &'static [&'static [u64]] = &[
        &[5, 1, 1000],
        &[10, 3, 1000],
        &[100, 7, 60_000],
        &[1, 1, 1],
        &[M, M, 1],
        &[3, 2, 7],
    ];
}

impl Row for LeakyBucket {
    const WORD: &'static str = "LEAKYBUCKET";
    const BASE: &'static [u64] = &[10, 1, 1000];
    const CROSS: &'static [&'static [u64]] = &[&[M, 1, M], &[1 << 30, 1, 1 << 20], &[M, M, M]];
    const GOLDEN: &'static [&'static [u64]] = &[
        &[5, 1, 1000],
        &[10, 3, 1000],
        &[2, 1, 10_000],
        &[1, 1, 1],
        &[M, M, 1],
    ];
}

impl Row for FixedWindow {
    const WORD: &'static str = "FIXEDWINDOW";
    const BASE: &'static [u64] = &[10, 1000];
    const CROSS: &'static [&'static [u64]] = &[&[M, M]];
    const GOLDEN: &'static [&'static [u64]] = &[
        &[5, 1000],
        &[10, 60_000],
        &[1, 1],
        &[M, 7],
        &[3, 86_400_000],
    ];
}

impl Row for SlidingLog {
    const WORD: &'static str = "SLIDING";
    const BASE: &'static [u64] = &[10, 1000];
    const CROSS: &'static [&'static [u64]] = &[&[(1 << 24) - 1, M], &[1 << 24, 1]];
    const GOLDEN: &'static [&'static [u64]] = &[
        &[5, 1000],
        &[10, 1500],
        &[1, 1],
        &[(1 << 24) - 1, 60_000],
        &[3, 7],
    ];
}

impl Row for HashWindow {
    const WORD: &'static str = "HASHWINDOW";
    const BASE: &'static [u64] = &[10, 60_000, 1000];
    const CROSS: &'static [&'static [u64]] = &[
        &[10, 1000, 300],
        &[10, 1000, 1000],
        &[10, 1_000_000, 1],
        &[10, 1_000_001, 1],
        &[10, M, M],
        &[10, M, 1 << 20],
        &[10, M, 1 << 19],
        &[10, 1000, 2000],
    ];
    const GOLDEN: &'static [&'static [u64]] = &[
        &[5, 1000, 100],
        &[10, 60_000, 1000],
        &[1, 1, 1],
        &[M, 6000, 2000],
        &[7, 3000, 1000],
    ];
}

impl Row for Quota {
    const WORD: &'static str = "QUOTA";
    const BASE: &'static [u64] = &[10, 0];
    const CROSS: &'static [&'static [u64]] = &[&[M, 3], &[1, 4]];
    const GOLDEN: &'static [&'static [u64]] = &[&[5, 0], &[10, 1], &[3, 2], &[M, 3], &[1, 0]];
    fn at(params: QuotaParams, now: Micros) -> QuotaParams {
        params.at_end(utc_period_end(params.period(), now))
    }
}

impl Row for Concurrency {
    const WORD: &'static str = "CONCURRENCY";
    const BASE: &'static [u64] = &[10, 60_000];
    const CROSS: &'static [&'static [u64]] = &[&[(1 << 24) - 1, M], &[1 << 24, 1]];
    /// No golden sequences: a kit holds requests in flight, not leases.
    const GOLDEN: &'static [&'static [u64]] = &[];
}

/// The parameters of `R`, in order, with their ranges and keywords.
fn params_of<R: Row>() -> Value {
    R::Params::INTEGERS
        .iter()
        .map(|p| json!({"name": p.name, "min": p.min, "max": p.max, "keywords": p.keywords}))
        .collect()
}

/// What the core says of `values`: accepted, or the parameter its error
/// names and the error's text.
fn verdict<R: Row>(values: &[u64]) -> Value {
    match R::Params::from_integers(values) {
        Ok(_) => json!({"params": values, "ok": true}),
        Err(e) => {
            json!({"params": values, "ok": false, "names": named(&e), "message": e.to_string()})
        }
    }
}

/// Each parameter just inside and just outside its range, the others at
/// their base, then the cases across parameters.
fn validation_of<R: Row>() -> Vec<Value> {
    let mut cases = vec![verdict::<R>(R::BASE)];
    for (i, p) in R::Params::INTEGERS.iter().enumerate() {
        let mut values: Vec<u64> = vec![p.min, p.max, p.max + 1];
        if p.min > 0 {
            values.insert(0, p.min - 1);
        }
        for v in values {
            let mut set = R::BASE.to_vec();
            set[i] = v;
            cases.push(verdict::<R>(&set));
        }
    }
    cases.extend(R::CROSS.iter().map(|set| verdict::<R>(set)));
    cases
}

fn decision_json(d: &redis_ratelimit_core::Decision) -> Value {
    let wait = match d.wait {
        Wait::Ms(ms) => ms as i64,
        Wait::Never => -1,
    };
    json!([d.allowed as u8, d.limit, d.remaining, wait, d.reset_ms])
}

/// Sequences of calls on one key from idle: each step's parameters (a
/// sequence switches between two sets), instant in microseconds, request
/// and the core's decision.
fn golden_of<R: Row>(seed: u64) -> Vec<Value> {
    const T0_US: u64 = 1_767_225_600_000_000 - 3_000; // 2026-01-01, 3 ms before midnight
    let mut rng = Rng(seed);
    let mut sequences = Vec::new();
    if R::GOLDEN.is_empty() {
        return sequences;
    }
    for s in 0..8 {
        let a = R::GOLDEN[s % R::GOLDEN.len()];
        let b = rng.pick(R::GOLDEN);
        let mut now = T0_US + rng.below(2_000_000);
        let first = R::Params::from_integers(a).expect("a golden parameter set is valid");
        let mut state = R::idle(&R::at(first, Micros::from_us(now)), Micros::from_us(now));
        let mut steps = Vec::new();
        let mut current = a;
        for _ in 0..24 {
            now += match rng.below(10) {
                0 => 0,
                1..=3 => rng.below(1_000),
                4..=6 => rng.below(1_000_000),
                7 => rng.below(10_000_000),
                8 => rng.below(100_000_000),
                _ => rng.below(100_000_000_000), // up to a day and more
            };
            if rng.below(8) == 0 {
                current = if current == a { b } else { a };
            }
            let params = R::Params::from_integers(current).expect("valid");
            let limit_hint = current[0].min(20);
            let request = match rng.below(10) {
                0 => Request::Cost(0),
                1..=5 => Request::Cost(1),
                6 => Request::Cost(1 + rng.below(limit_hint + 1)),
                7 => Request::Force(1 + rng.below(limit_hint + 1)),
                8 => Request::Refund(1 + rng.below(limit_hint)),
                _ => Request::Cost(current[0].saturating_add(rng.below(2))),
            };
            let at = Micros::from_us(now);
            let outcome =
                redis_ratelimit_core::run::<R>(&mut state, &R::at(params, at), request, at);
            let req = match request {
                Request::Cost(n) => json!({"cost": n}),
                Request::Force(n) => json!({"force": n}),
                Request::Refund(n) => json!({"refund": n}),
                Request::UpTo(n) => json!({"upto": n}),
            };
            steps.push(json!({
                "params": current,
                "at_us": now,
                "request": req,
                "decision": decision_json(&outcome.decision),
            }));
        }
        sequences.push(json!({"steps": steps}));
    }
    sequences
}

fn algorithm<R: Row>(seed: u64) -> Value {
    json!({
        "word": R::WORD,
        "command": format!("RL.{}", R::WORD),
        "params": params_of::<R>(),
        "validation": validation_of::<R>(),
        "golden": golden_of::<R>(seed),
    })
}

/// `w` of `RateLimit-Policy` for each algorithm's golden and base sets.
fn policy_windows() -> Vec<Value> {
    let mut out = Vec::new();
    let mut add = |word: &str, sets: &[&[u64]]| {
        for set in sets {
            let spec = Spec::parse("r", word, set).expect("valid");
            out.push(json!({"algorithm": word, "params": set, "w": spec.window_s()}));
        }
    };
    add("TOKENBUCKET", TokenBucket::GOLDEN);
    add(
        "TOKENBUCKET",
        &[&[10, 3, 1000], &[15_000, 15_000, 1000], &[5, 1, 1000]],
    );
    add("LEAKYBUCKET", LeakyBucket::GOLDEN);
    add("FIXEDWINDOW", FixedWindow::GOLDEN);
    add("SLIDING", SlidingLog::GOLDEN);
    add("HASHWINDOW", HashWindow::GOLDEN);
    add("QUOTA", Quota::GOLDEN);
    add("CONCURRENCY", &[&[10, 60_000]]);
    out
}

/// Rules and decisions, and the exact fields and body they give.
fn header_vectors() -> Vec<Value> {
    /// `allowed, limit, remaining, wait_ms, reset_ms`.
    type Fields = (bool, u64, u64, i64, u64);
    let cases: &[(&str, &str, &[u64], Fields)] = &[
        (
            "per-user",
            "TOKENBUCKET",
            &[5, 1, 1000],
            (true, 5, 4, 0, 1000),
        ),
        (
            "per-user",
            "TOKENBUCKET",
            &[5, 1, 1000],
            (false, 5, 0, 1, 5000),
        ),
        (
            "per-user",
            "TOKENBUCKET",
            &[10, 3, 1000],
            (false, 10, 0, 334, 3334),
        ),
        ("per-user", "SLIDING", &[5, 1000], (true, 5, 4, 0, 1000)),
        ("per-user", "SLIDING", &[5, 1000], (false, 5, 0, 1001, 1001)),
        (
            "api",
            "FIXEDWINDOW",
            &[100, 60_000],
            (false, 100, 0, 59_999, 59_999),
        ),
        (
            "api",
            "HASHWINDOW",
            &[100, 60_000, 1000],
            (true, 100, 0, 0, 60_000),
        ),
        (
            "daily",
            "QUOTA",
            &[1000, 0],
            (false, 1000, 0, 3_600_000, 3_600_000),
        ),
        ("big", "TOKENBUCKET", &[5, 1, 1000], (false, 5, 5, -1, 0)),
        (
            "q\"uote",
            "LEAKYBUCKET",
            &[2, 1, 10_000],
            (false, 2, 0, 10_000, 20_000),
        ),
        (
            "slots",
            "CONCURRENCY",
            &[10, 60_000],
            (false, 10, 0, 1000, 60_000),
        ),
    ];
    cases
        .iter()
        .map(
            |&(name, word, params, (allowed, limit, remaining, wait_ms, reset_ms))| {
                let spec = Spec::parse(name, word, params).expect("valid");
                let d = Decision::from_fields(
                    allowed,
                    limit,
                    remaining,
                    wait_ms,
                    reset_ms,
                    Path::Redis,
                );
                json!({
                    "rule": name,
                    "algorithm": word,
                    "params": params,
                    "decision": [allowed as u8, limit, remaining, wait_ms, reset_ms],
                    "ratelimit_policy": policy_item(name, &spec),
                    "ratelimit": ratelimit_item(name, &d),
                    "retry_after": if allowed { Value::Null } else { json!(d.retry_after_s()) },
                    "body": if allowed { Value::Null } else { json!(denial_body(name, &d)) },
                })
            },
        )
        .collect()
}

/// `TZ` values: accepted by the server and every kit; refused by every kit
/// (their syntax); refused by the server alone (a name its time-zone
/// database does not know: a kit without one cannot tell).
fn zones() -> Value {
    let accepted = [
        "UTC",
        "utc",
        "Z",
        "+05:30",
        "-18:00",
        "+18:00",
        "-00:00",
        "+17:59",
        "America/New_York",
        "Europe/Paris",
        "Asia/Kolkata",
    ];
    let refused = [
        "+18:01",
        "-18:01",
        "+25:00",
        "+5:30",
        "05:30",
        "+05:60",
        "+0530",
        "",
        "/etc/localtime",
        "../UTC",
        "America/../UTC",
    ];
    for name in accepted {
        assert!(Zone::new(name).is_ok(), "this kit refuses {name:?}");
    }
    json!({
        "accepted": accepted,
        "refused": refused,
        "refused_by_server_only": ["Mars/Olympus_Mons"],
        "grammar": "UTC or Z (any case); +HH:MM or -HH:MM from -18:00 to +18:00 (two-digit hours, minutes 00 to 59); or an IANA time-zone name the server's database knows (at most 64 bytes, no leading '/', no '..')",
    })
}

/// The core's algorithms, by command word ([`redis_ratelimit_core::for_each_algorithm`]).
fn core_words() -> Vec<&'static str> {
    struct Words(Vec<&'static str>);
    impl redis_ratelimit_core::EachAlgorithm for Words {
        fn visit<A: redis_ratelimit_core::Sampled + redis_ratelimit_core::contract::Guarantee>(
            &mut self,
            word: &'static str,
        ) {
            self.0.push(word);
        }
    }
    let mut words = Words(Vec::new());
    redis_ratelimit_core::for_each_algorithm(&mut words);
    words.0
}

/// The server's text for an integer option out of its range: the core's
/// rendering of a range error, as the module sends it.
fn range_message(word: &'static str) -> String {
    let error = ParamError::Range {
        arg: word,
        min: 0,
        max: MAX_PARAM,
    };
    format!("ERR {error}")
}

/// The options' rules: each request a tagged value can hold, the blocking
/// timeouts, and the words the server refuses that a tagged request cannot
/// even build. `tests/integration` sends every `args` to a real server and
/// checks the reply against `ok` and `message`.
fn options() -> Value {
    let max = MAX_PARAM as i128;
    let values = [0, 1, max, max + 1, -1];
    let mut requests = Vec::new();
    for (kind, word) in [("cost", "COST"), ("force", "COST"), ("refund", "REFUND")] {
        for n in values {
            let mut args = vec![
                if kind == "refund" { "REFUND" } else { "COST" }.to_string(),
                n.to_string(),
            ];
            if kind == "force" {
                args.push("FORCE".to_string());
            }
            let mut case =
                json!({"request": {kind: n}, "args": args, "ok": (0..=max).contains(&n)});
            if !(0..=max).contains(&n) {
                case["names"] = json!(word);
                case["message"] = json!(range_message(word));
            }
            requests.push(case);
        }
    }
    let blocks: Vec<Value> = values
        .iter()
        .map(|&n| {
            let mut case =
                json!({"block_ms": n, "args": ["BLOCK", n.to_string()], "ok": (0..=max).contains(&n)});
            if !(0..=max).contains(&n) {
                case["names"] = json!("BLOCK");
                case["message"] = json!(range_message("BLOCK"));
            }
            case
        })
        .collect();
    let refused = |args: &[&str], message: &str| json!({"args": args, "message": message});
    json!({
        "words": [
            {"word": "COST", "min": 0, "max": MAX_PARAM, "default": 1},
            {"word": "FORCE", "flag": true},
            {"word": "REFUND", "min": 0, "max": MAX_PARAM},
            {"word": "BLOCK", "min": 0, "max": MAX_PARAM, "unit": "ms"},
        ],
        "requests": requests,
        "blocks": blocks,
        "refused_words": [
            refused(&["REFUND", "1", "FORCE"], "ERR REFUND cannot be given with FORCE"),
            refused(&["COST", "1", "REFUND", "1"], "ERR REFUND cannot be given with COST"),
            refused(&["COST", "1", "COST", "2"], "ERR COST given more than once"),
            refused(&["REFUND", "1", "REFUND", "1"], "ERR REFUND given more than once"),
            refused(&["FORCE", "FORCE"], "ERR FORCE given more than once"),
            refused(&["BLOCK", "1", "BLOCK", "1"], "ERR BLOCK given more than once"),
            refused(&["COST"], "ERR COST needs a value"),
            refused(&["REFUND"], "ERR REFUND needs a value"),
            refused(&["BLOCK"], "ERR BLOCK needs a value"),
            refused(&["COST", "x"], &range_message("COST")),
            refused(&["SOON", "1"], "ERR unknown option 'SOON' (expected COST, FORCE, REFUND, UPTO or BLOCK)"),
        ],
    })
}

/// The replies' fields in order: every limiter command answers the five
/// decision fields; `RL.CONCURRENCY` adds the lease granted, `RL.ALL` the
/// 1-based position of the limiter that denied; `RL.HIT` answers as its
/// policy's algorithm.
fn replies() -> Value {
    let five = ["allowed", "limit", "remaining", "wait_ms", "reset_ms"];
    let mut replies: Vec<Value> = core_words()
        .into_iter()
        .map(|word| {
            let mut fields: Vec<&str> = five.to_vec();
            if word == "CONCURRENCY" {
                fields.push("lease");
            }
            json!({"command": format!("RL.{word}"), "fields": fields})
        })
        .collect();
    replies.push(json!({"command": "RL.HIT", "fields": "as the policy's algorithm"}));
    let mut all = five.to_vec();
    all.push("denied_by");
    replies.push(json!({"command": "RL.ALL", "fields": all}));
    Value::Array(replies)
}

/// The protection loop (`RL.OUTCOME`, `RL.POLICY ... ADAPT/STAGES/WINDOW`,
/// `RL.POLICY SCALE`, `RL.POLICY STATS`): the arguments and their ranges,
/// the defaults, the replies' fields, what a scaled parameter becomes, and
/// the timings every kit's protection loop keeps.
fn protection() -> Value {
    use redis_ratelimit_core::protection::{scaled, Adapt, DEFAULT_WINDOW_MS, MAX_WINDOW_MS};
    let arg = |word: &str, min: u64, max: Value| json!({"name": word, "min": min, "max": max});
    let window = [
        "calls",
        "admitted",
        "denied",
        "ok",
        "errors",
        "deny_permille",
        "error_permille",
    ];
    let mut scaled_cases = Vec::new();
    for p in [1u64, 2, 3, 10, 99, 100, 1000, MAX_PARAM] {
        for scale in [1u64, 33, 50, 80, 99, 100] {
            scaled_cases.push(json!({"param": p, "scale": scale, "scaled": scaled(p, scale)}));
        }
    }
    json!({
        "stages": [
            {"stage": 0, "name": "normal"},
            {"stage": 1, "name": "degrade"},
            {"stage": 2, "name": "break"},
        ],
        "defaults": {
            "window_ms": DEFAULT_WINDOW_MS,
            "factor": Adapt::DEFAULT_FACTOR,
            "min": Adapt::DEFAULT_MIN,
            "recover": Adapt::DEFAULT_RECOVER,
            "mincalls": Adapt::DEFAULT_MIN_CALLS,
        },
        "arguments": [
            arg("ERRORS", 0, json!(100)),
            arg("FACTOR", 1, json!(100)),
            arg("MIN", 1, json!(100)),
            arg("RECOVER", 0, json!(100)),
            arg("MINCALLS", 0, json!(MAX_PARAM)),
            arg("WINDOW", 1, json!(MAX_WINDOW_MS)),
            arg("degrade_pct", 0, json!(100)),
            arg("break_pct", 0, json!("degrade_pct to 100")),
            arg("pct", 1, json!(100)),
            arg("ok", 0, json!(MAX_PARAM)),
            arg("errors", 0, json!(MAX_PARAM)),
            arg("DENIED", 0, json!(MAX_PARAM)),
        ],
        "stats_fields": ["scale", "stage", "window_ms", "window_end_ms", "current", "last", "adapting"],
        "window_fields": window,
        "outcome": "RL.OUTCOME name ok errors [DENIED n]: n calls the kit denied without asking the server (its deny cache, its local level); sent only when n > 0",
        "outcome_reply": "as RL.POLICY STATS",
        "get_fields": {
            "always": ["name", "algorithm", "params", "mode", "rollout", "calls", "admitted", "denied", "shadow_denied"],
            "when_set": ["adapt", "stages", "window_ms"],
            "then": ["scale", "stage"],
        },
        "scaled": scaled_cases,
        "kits": {
            "report_interval_ms": 1000,
            "stage_poll_ms": 1000,
            "stage_hold_ms": 5000,
            "error": "a 5xx answer, or an exception or a timeout of the handler (configurable)",
            "stage_of_many_masters": "the highest",
        },
    })
}

/// Observability (SPEC "Observability in every kit"): the metrics every kit
/// serves, by the names a Prometheus scrape shows, their labels and the
/// values a label takes; the deny events' fields and their shipping.
fn observability() -> Value {
    let metric = |name: &str, kind: &str, labels: &[&str], help: &str| json!({"name": name, "type": kind, "labels": labels, "help": help});
    json!({
        "metrics": [
            metric("ratelimit_decisions_total", "counter", &["rule", "level", "outcome"],
                "Decisions taken, by rule, by the level that took them and by outcome"),
            metric("ratelimit_redis_seconds", "histogram", &[],
                "Round trips of limiter commands to Redis, in seconds"),
            metric("ratelimit_remaining_ratio", "gauge", &["rule"],
                "remaining / limit of the rule's last decision taken by Redis or the local level (0: at the limit)"),
            metric("ratelimit_breaker_open", "gauge", &["breaker"],
                "1 while the breaker is open (Redis skipped, or a protected stage broken), else 0"),
            metric("ratelimit_scale", "gauge", &["rule"],
                "The protection loop's scale of the rule's policy, in percent"),
            metric("ratelimit_stage", "gauge", &["rule"],
                "The protection loop's stage of the rule's policy: 0 normal, 1 degrade, 2 break"),
            metric("ratelimit_deny_events_dropped_total", "counter", &[],
                "Deny events lost: the oldest dropped from a full buffer, and every event of a batch its sink refused"),
            metric("ratelimit_deny_events_shipped_total", "counter", &[],
                "Deny events a sink accepted"),
            metric("ratelimit_deny_events_sink_errors_total", "counter", &[],
                "Flushes a sink refused or failed (an error, a timeout, an HTTP status other than 2xx, a _bulk reply with errors)"),
        ],
        "levels": [
            {"level": "local", "means": "the in-process level of a global rule"},
            {"level": "redis", "means": "the server's answer"},
            {"level": "deny_cache", "means": "a denial repeated from the deny cache, without a round trip"},
            {"level": "grant", "means": "units held from an UPTO grant, without a round trip"},
            {"level": "fallback", "means": "the fallback's answer while Redis is away (fail open, fail closed, local only)"},
        ],
        "outcomes": ["admitted", "denied", "shadow_denied"],
        "rule_label": "the rule's name as the kit's user gave it (a policy rule: the policy's name); never a key, so the series stay few",
        "redis_seconds_buckets": [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0],
        "deny_events": {
            "fields": ["timestamp", "key", "rule", "level", "outcome", "limit", "remaining", "retry_after_ms", "client_ip", "user_agent"],
            "optional": ["client_ip", "user_agent"],
            "timestamp": "RFC 3339 in UTC with milliseconds, as 2026-12-02T10:00:00.123Z",
            "retry_after_ms": "the decision's wait_ms: -1 when the request can never pass",
            "outcome": "denied, or shadow_denied (a shadow policy would have denied; the request went on)",
            "format": "one JSON object per line, the fields in this order, an optional field left out when unknown",
            "buffer_events": 10000,
            "flush_interval_ms": 5000,
            "flush_events": 1000,
            "full": "the oldest events are dropped and counted in ratelimit_deny_events_dropped_total",
            "sinks": {
                "file": "the batch appended to the file as JSON lines",
                "bulk": "POST <url>/_bulk, Content-Type application/x-ndjson: per event an action line {\"index\":{\"_index\":\"<index>\"}} then the event's line; accepted on a 2xx whose JSON body has errors false",
                "callback": "the user's function, given the batch of events, on the flusher (never on a request)",
            },
            "bulk_index": "ratelimit-deny",
            "sink_timeout_ms": 2000,
            "failed_batch": "dropped and counted (dropped and sink_errors); never retried, never held",
            "request_path": "a denial appends to the buffer under a short lock and wakes the flusher; a request never waits for a sink",
            "max_header_bytes": 512,
            "headers_cut": "client_ip and user_agent longer than max_header_bytes (in UTF-8) are cut to at most that many bytes at a character boundary, so a flood of huge headers cannot fill memory",
        },
    })
}

/// The stripes' tags for `n` stripes over masters that each own the given
/// slot ranges (the contract's rule: masters in the order of the lowest
/// slot each owns; stripe i on master i mod M; tag i the first `rl<k>`
/// whose slot that master owns and that no earlier stripe took).
fn stripe_tags(masters: &[Vec<(u16, u16)>], n: usize) -> Vec<String> {
    let mut order: Vec<&Vec<(u16, u16)>> = masters.iter().collect();
    order.sort_by_key(|ranges| ranges.iter().map(|r| r.0).min());
    let mut tags: Vec<String> = Vec::new();
    for i in 0..n {
        let owns = order[i % order.len()];
        let tag = (0u64..)
            .map(|k| format!("rl{k}"))
            .find(|t| {
                let slot = crate::key_slot(t);
                owns.iter().any(|&(a, b)| (a..=b).contains(&slot)) && !tags.contains(t)
            })
            .expect("every master owns a slot some tag hashes to");
        tags.push(tag);
    }
    tags
}

/// Stripe `i` of `n`'s share of `total`: `total / n`, plus one for the
/// first `total % n` stripes.
fn stripe_share(total: u64, n: u64, i: u64) -> u64 {
    total / n + u64::from(i < total % n)
}

/// The batch a batched rule asks for: about `hold_ms` of the observed
/// rate, at least 1, at most `max_share_pct` % of the limit (at least 1).
fn batch_size(rate_per_s: u64, hold_ms: u64, limit: u64, max_share_pct: u64) -> u64 {
    let wanted = (rate_per_s * hold_ms).div_ceil(1000).max(1);
    let most = (limit * max_share_pct / 100).max(1);
    wanted.min(most)
}

/// `UPTO n` (the server's option), batched rules and stripes (the kits'):
/// the requests and errors, the replies with `granted`, sequences the core
/// runs, and the rules and vectors of batching and striping.
fn grants() -> Value {
    let max = MAX_PARAM as i128;
    let range = "ERR UPTO must be an integer from 1 to 1099511627776";
    let requests: Vec<Value> = [0, 1, 7, max, max + 1, -1]
        .iter()
        .map(|&n| {
            let ok = (1..=max).contains(&n);
            let mut case =
                json!({"request": {"upto": n}, "args": ["UPTO", n.to_string()], "ok": ok});
            if !ok {
                case["names"] = json!("UPTO");
                case["message"] = json!(range);
            }
            case
        })
        .collect();
    let refused = |args: &[&str], message: &str| json!({"args": args, "message": message});
    let five = ["allowed", "limit", "remaining", "wait_ms", "reset_ms"];
    let takes = [
        "TOKENBUCKET",
        "FIXEDWINDOW",
        "SLIDING",
        "HASHWINDOW",
        "QUOTA",
    ];
    let mut replies: Vec<Value> = takes
        .iter()
        .map(|w| {
            let mut fields = five.to_vec();
            fields.push("granted");
            json!({"command": format!("RL.{w}"), "fields": fields})
        })
        .collect();
    replies.push(json!({"command": "RL.HIT", "fields": "as the policy's algorithm, then granted"}));
    let mut all = five.to_vec();
    all.extend(["denied_by", "granted"]);
    replies.push(json!({"command": "RL.ALL", "fields": all}));
    // Sequences on one key, each step UPTO or COST, as the core runs them.
    let golden = |word: &str, params: &[u64], steps: &[(u64, Request)]| -> Value {
        const T0_US: u64 = 1_767_225_600_000_000; // 2026-01-01T00:00:00Z
        fn run_all<R: Row>(params: &[u64], steps: &[(u64, Request)]) -> Vec<Value> {
            let p = R::Params::from_integers(params).expect("valid");
            let mut state = R::idle(&R::at(p, Micros::from_us(T0_US)), Micros::from_us(T0_US));
            steps
                .iter()
                .map(|&(ms, request)| {
                    let at = Micros::from_us(T0_US + ms * 1000);
                    let outcome =
                        redis_ratelimit_core::run::<R>(&mut state, &R::at(p, at), request, at);
                    let req = match request {
                        Request::UpTo(n) => json!({"upto": n}),
                        Request::Cost(n) => json!({"cost": n}),
                        other => panic!("{other:?}"),
                    };
                    json!({
                        "at_us": T0_US + ms * 1000,
                        "request": req,
                        "decision": decision_json(&outcome.decision),
                        "granted": outcome.granted,
                    })
                })
                .collect()
        }
        let steps = match word {
            "TOKENBUCKET" => run_all::<TokenBucket>(params, steps),
            "FIXEDWINDOW" => run_all::<FixedWindow>(params, steps),
            "SLIDING" => run_all::<SlidingLog>(params, steps),
            "HASHWINDOW" => run_all::<HashWindow>(params, steps),
            _ => run_all::<Quota>(params, steps),
        };
        json!({"word": word, "params": params, "steps": steps})
    };
    let up = Request::UpTo;
    let script = [
        (0, up(4)),
        (0, up(9)),
        (0, up(9)),
        (0, Request::Cost(0)),
        (250, up(3)),
        (1_000, up(20)),
        (1_000, Request::Cost(1)),
        (61_000, up(6)),
    ];
    let goldens = vec![
        golden("TOKENBUCKET", &[10, 1, 250], &script),
        golden("FIXEDWINDOW", &[10, 60_000], &script),
        golden("SLIDING", &[10, 60_000], &script),
        golden("HASHWINDOW", &[10, 60_000, 1_000], &script),
        golden("QUOTA", &[10, 0], &script),
    ];
    let batch_vectors: Vec<Value> = [
        (0, 50, 1_000, 10),
        (10, 50, 1_000, 10),
        (19, 50, 1_000, 10),
        (21, 50, 1_000, 10),
        (1_000, 50, 1_000, 10),
        (5_000, 50, 10_000, 10),
        (100_000, 50, 10_000, 10),
        (100_000, 50, 5, 10),
        (7, 1, 1_000, 100),
        (3_333, 60_000, 1_099_511_627_776, 100),
    ]
    .iter()
    .map(|&(rate, hold, limit, pct)| {
        json!({"rate_per_s": rate, "hold_ms": hold, "limit": limit, "max_share_pct": pct,
               "batch": batch_size(rate, hold, limit, pct)})
    })
    .collect();
    let share_vectors: Vec<Value> = [(10, 3), (9, 3), (1_000, 7), (2, 2), (65, 64)]
        .iter()
        .map(|&(total, n)| {
            let shares: Vec<u64> = (0..n).map(|i| stripe_share(total, n, i)).collect();
            json!({"total": total, "n": n, "shares": shares})
        })
        .collect();
    let even = vec![vec![(0, 5460)], vec![(5461, 10922)], vec![(10923, 16383)]];
    let shuffled = vec![
        vec![(10923, 16383)],
        vec![(0, 100), (6000, 10922)],
        vec![(101, 5999)],
    ];
    let standalone = vec![vec![(0u16, 16383u16)]];
    let tag_vectors: Vec<Value> = [(&even, 3), (&even, 5), (&shuffled, 3), (&standalone, 3)]
        .iter()
        .map(|&(masters, n)| {
            let tags = stripe_tags(masters, n);
            let slots: Vec<u16> = tags.iter().map(|t| crate::key_slot(t)).collect();
            json!({"masters": masters, "n": n, "tags": tags, "slots": slots})
        })
        .collect();
    json!({
        "upto": "UPTO n (1 to max_param), in place of COST: take as many units as the limiter admits now, at most n and at least 1; if not even 1 fits, the denial COST 1 gets. The reply adds granted (units taken; 0 on a denial); it propagates and notifies as COST granted. A policy that is off answers allowed with granted n; a shadowed denial answers allowed with granted 0.",
        "commands": ["RL.TOKENBUCKET", "RL.FIXEDWINDOW", "RL.SLIDING", "RL.HASHWINDOW", "RL.QUOTA", "RL.HIT", "RL.ALL"],
        "refused_commands": [
            {"command": "RL.LEAKYBUCKET", "message": "ERR UPTO is not an option of RL.LEAKYBUCKET"},
            {"command": "RL.CONCURRENCY", "message": "ERR UPTO is not an option of RL.CONCURRENCY"},
            {"command": "RL.HIT", "policy": "LEAKYBUCKET", "message": "ERR UPTO is not an option of RL.HIT on a LEAKYBUCKET policy"},
            {"command": "RL.ALL", "spec": 2, "message": "ERR UPTO is not an option of RL.ALL with a LEAKYBUCKET limiter (spec 2)"},
        ],
        "requests": requests,
        "refused_words": [
            refused(&["UPTO", "2", "COST", "1"], "ERR UPTO cannot be given with COST"),
            refused(&["FORCE", "UPTO", "2"], "ERR UPTO cannot be given with FORCE"),
            refused(&["REFUND", "1", "UPTO", "2"], "ERR UPTO cannot be given with REFUND"),
            refused(&["UPTO", "2", "UPTO", "2"], "ERR UPTO given more than once"),
            refused(&["UPTO"], "ERR UPTO needs a value"),
        ],
        "replies": replies,
        "golden": goldens,
        "batched": {
            "algorithms": takes,
            "rules": "a global inline rule of one of these algorithms",
            "hold_ms": {"default": 50, "min": 1, "max": 60_000},
            "max_share_pct": {"default": 10, "min": 1, "max": 100},
            "batch": "clamp(ceil(rate_per_s * hold_ms / 1000), 1, max(1, floor(limit * max_share_pct / 100))); limit is the capacity of a token bucket, the limit of the others",
            "rate_per_s": "max(decisions on the rule in the previous whole second, decisions so far in this second), seconds counted on the instance's monotonic clock",
            "ask": "held units admit with no round trip (level grant); with none held and now >= next_ask_at, one UPTO batch call per rule and key at a time, concurrent callers share its grant in arrival order; with none held and now < next_ask_at, denied in process (level grant)",
            "next_ask_at": "after a grant g < batch: the ask's instant + hold_ms; after a denial: the ask's instant + max(wait_ms, hold_ms if batch > 1 else 0); wait_ms -1: never again until the rule changes",
            "refund": "units held longer than hold_ms since their grant, and every unit at close, go back in one REFUND call, never retried",
            "fallback": "with Redis away, the kit's fallback decides (held units are spent first)",
            "bound": "never above the limit (every unit is taken from the server first); under-admission at most the units instances hold: instances x batch, each for at most hold_ms",
            "vectors": batch_vectors,
        },
        "stripes": {
            "algorithms": takes,
            "n": {"min": 2, "max": 64},
            "share": "stripe i of n gets total / n, plus 1 if i < total % n, of every size and rate parameter (a token bucket's capacity and refill_count; a window's or a quota's limit); spans unchanged; a share of 0 refuses the rule, naming striped",
            "key": "{tag}key",
            "tags": "masters in the order of the lowest slot each owns (standalone or Sentinel: one master, all slots); stripe i on master i mod M; tag i is the first rl0, rl1, rl2, ... whose slot (CRC16-XMODEM mod 16384) that master owns and that no earlier stripe took",
            "own": "each limiter picks its own stripe at random when it starts",
            "spill": "a denial on the own stripe tries stripe (own + 1) mod n once; the request is denied only if both deny",
            "repick": "the tags are picked again when the kit sees the slot map change; units consumed under an old key are not seen under a new one",
            "bound": "each stripe is exact for its algorithm; the sum over the stripes is at most the limit",
            "share_vectors": share_vectors,
            "tag_vectors": tag_vectors,
        },
    })
}

/// The whole file.
fn contract() -> Value {
    let periods: Vec<Value> = (0..4)
        .map(|i| {
            let p = Period::from_index(i).expect("four periods");
            json!({"word": period_word(p), "index": i, "nominal_s": period_nominal_s(p)})
        })
        .collect();
    let algorithms = vec![
        algorithm::<TokenBucket>(1),
        algorithm::<LeakyBucket>(2),
        algorithm::<FixedWindow>(3),
        algorithm::<SlidingLog>(4),
        algorithm::<HashWindow>(5),
        algorithm::<Quota>(6),
        algorithm::<Concurrency>(7),
    ];
    // Every algorithm of the core has its entry: a new one turns this red
    // until it has a row here, and then every kit's conformance test.
    let mut described: Vec<&str> = algorithms
        .iter()
        .map(|a| a["word"].as_str().expect("word"))
        .collect();
    let mut core = core_words();
    described.sort_unstable();
    core.sort_unstable();
    assert_eq!(
        described, core,
        "the contract must describe every algorithm of the core"
    );
    json!({
        "version": 1,
        "about": "The contract every client kit is tested against. Written by clients/rust/src/contract.rs from the core crate and the Rust kit's HTTP answer; RL_CONTRACT_WRITE=1 cargo test -p redis-ratelimit-client contract rewrites it. Format: clients/contract/README.md.",
        "max_param": MAX_PARAM,
        "max_span_ms": MAX_SPAN_MS,
        "decision_fields": ["allowed", "limit", "remaining", "wait_ms", "reset_ms"],
        "requests": {
            "cost": "COST n (default 1): take n units if the limiter admits them; COST 0 peeks",
            "force": "COST n FORCE: take n units even if denied (debt of at most a limit beyond empty); COST 0 FORCE does nothing",
            "refund": "REFUND n: give back up to n units held; REFUND 0 does nothing; never with COST or FORCE",
        },
        "options": options(),
        "replies": replies(),
        "protection": protection(),
        "observability": observability(),
        "grants": grants(),
        "algorithms": algorithms,
        "periods": periods,
        "zones": zones(),
        "policy_window": policy_windows(),
        "headers": header_vectors(),
    })
}

#[test]
fn the_contract_file_is_what_the_core_writes() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(FILE);
    let text = serde_json::to_string_pretty(&contract()).expect("serializable") + "\n";
    if std::env::var_os("RL_CONTRACT_WRITE").is_some() {
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("the folder");
        std::fs::write(&path, &text).expect("written");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == text,
        "{} is not what the core writes: run RL_CONTRACT_WRITE=1 cargo test -p redis-ratelimit-client contract, then make every kit's conformance test pass",
        path.display()
    );
}

/// The Rust kit's own conformance: its rules accept and refuse what the
/// contract does, naming the same parameter.
#[test]
fn this_kit_validates_as_the_contract_says() {
    let contract = contract();
    for alg in contract["algorithms"].as_array().expect("algorithms") {
        let word = alg["word"].as_str().expect("word");
        for case in alg["validation"].as_array().expect("cases") {
            let params: Vec<u64> = case["params"]
                .as_array()
                .expect("params")
                .iter()
                .map(|v| v.as_u64().expect("u64"))
                .collect();
            match (Spec::parse("r", word, &params), case["ok"].as_bool()) {
                (Ok(_), Some(true)) => {}
                (Err(crate::Error::BadArgument { arg, .. }), Some(false)) => {
                    assert_eq!(
                        arg,
                        case["names"].as_str().expect("names"),
                        "{word} {params:?}"
                    )
                }
                (got, _) => panic!("{word} {params:?}: {got:?}, the contract says {case}"),
            }
        }
    }
    let zones = &contract["zones"];
    for name in zones["refused"].as_array().expect("refused") {
        let name = name.as_str().expect("str");
        assert!(
            Zone::new(name).is_err(),
            "this kit accepts the zone {name:?}"
        );
    }
}

/// The Rust kit's local level (what the fallback and the in-process level
/// run) reproduces every golden decision, through its own step.
#[test]
fn this_kit_local_level_reproduces_the_golden_decisions() {
    let contract = contract();
    let mut checked = 0;
    for alg in contract["algorithms"].as_array().expect("algorithms") {
        let word = alg["word"].as_str().expect("word");
        for sequence in alg["golden"].as_array().expect("golden") {
            let mut slot = None;
            for step in sequence["steps"].as_array().expect("steps") {
                let params: Vec<u64> = step["params"]
                    .as_array()
                    .expect("params")
                    .iter()
                    .map(|v| v.as_u64().expect("u64"))
                    .collect();
                let spec = Spec::parse("r", word, &params).expect("valid");
                let r = &step["request"];
                let request = if let Some(n) = r["cost"].as_u64() {
                    Request::Cost(n)
                } else if let Some(n) = r["force"].as_u64() {
                    Request::Force(n)
                } else {
                    Request::Refund(r["refund"].as_u64().expect("a request"))
                };
                let at = Micros::from_us(step["at_us"].as_u64().expect("at_us"));
                let got = crate::local::step(&spec, &mut slot, request, at, false);
                assert_eq!(
                    decision_json(&got.decision),
                    step["decision"],
                    "{word} at {at:?}: {request:?}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 1000, "{checked} decisions");
}

/// The Rust kit's requests accept and refuse what the contract's options
/// do, naming the same option; a value below 0 cannot be built (`u64`),
/// nor can a refund with FORCE or COST (`Request` is one of the three).
/// A blocking timeout is a `Duration` here, so the `blocks` cases below 0
/// cannot be built either, and a longer one waits without a limit.
#[test]
fn this_kit_builds_requests_as_the_contract_says() {
    let contract = contract();
    let spec = Spec::parse("r", "TOKENBUCKET", &[10, 1, 1000]).expect("valid");
    let mut checked = 0;
    for case in contract["options"]["requests"]
        .as_array()
        .expect("requests")
    {
        let (kind, value) = case["request"]
            .as_object()
            .and_then(|r| r.iter().next())
            .expect("a request");
        let Some(n) = value.as_u64() else {
            continue; // below 0: a u64 cannot hold it
        };
        let request = match kind.as_str() {
            "cost" => Request::Cost(n),
            "force" => Request::Force(n),
            _ => Request::Refund(n),
        };
        let got = crate::client::limiter_cmd("k", &spec, request);
        match (got, case["ok"].as_bool()) {
            (Ok(cmd), Some(true)) => {
                // The words sent are the contract's (COST 1 may be left out:
                // it is the default).
                let sent: Vec<String> = cmd
                    .args_iter()
                    .skip(5)
                    .map(|a| match a {
                        redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                        _ => String::new(),
                    })
                    .collect();
                let want: Vec<String> = case["args"]
                    .as_array()
                    .expect("args")
                    .iter()
                    .map(|a| a.as_str().expect("str").to_string())
                    .collect();
                if !(sent.is_empty() && want == ["COST", "1"]) {
                    assert_eq!(sent, want, "{case}");
                }
            }
            (Err(crate::Error::BadArgument { arg, .. }), Some(false)) => {
                assert_eq!(arg, case["names"].as_str().expect("names"), "{case}")
            }
            (got, _) => panic!("{case}: {got:?}"),
        }
        checked += 1;
    }
    assert!(checked >= 12, "{checked} cases");
}

/// The reply parser takes the contract's fields in their order: the five
/// decision fields, and the sixth of `RL.CONCURRENCY` (the lease) and of
/// `RL.ALL` (`denied_by`).
#[test]
fn this_kit_parses_replies_as_the_contract_says() {
    use crate::decision::Sixth;
    let contract = contract();
    for reply in contract["replies"].as_array().expect("replies") {
        let command = reply["command"].as_str().expect("command");
        let Some(fields) = reply["fields"].as_array() else {
            continue; // RL.HIT: as its policy's algorithm
        };
        let names: Vec<&str> = fields.iter().map(|f| f.as_str().expect("str")).collect();
        assert_eq!(
            names[..5],
            ["allowed", "limit", "remaining", "wait_ms", "reset_ms"]
        );
        let values: Vec<redis::Value> = [0, 7, 3, 40, 900, 12][..names.len()]
            .iter()
            .map(|&i| redis::Value::Int(i))
            .collect();
        let sixth = if command == "RL.ALL" {
            Sixth::DeniedBy
        } else {
            Sixth::Lease
        };
        let d = Decision::from_reply(redis::Value::Array(values), sixth).expect(command);
        assert_eq!(
            (
                d.allowed,
                d.limit,
                d.remaining,
                d.wait_ms,
                d.reset_after.as_millis()
            ),
            (false, 7, 3, 40, 900),
            "{command}"
        );
        match names.get(5) {
            None => assert_eq!((d.lease, d.denied_by), (None, None), "{command}"),
            Some(&"lease") => assert_eq!(d.lease, Some(12), "{command}"),
            // The reply's position counts from 1, the kit's index from 0.
            Some(&"denied_by") => assert_eq!(d.denied_by, Some(11), "{command}"),
            Some(other) => panic!("{command}: a sixth field {other} this kit does not know"),
        }
    }
}

/// The protection loop: this kit's loop timings are the contract's
/// `protection.kits`, its `RL.POLICY STATS` parser takes exactly
/// `stats_fields` and `window_fields` (a reply built from them is read
/// field by field; one without a field is refused), and a policy's spec at
/// a scale (what the local-only fallback runs) gives every `scaled` case.
#[test]
fn this_kit_runs_the_protection_loop_as_the_contract_says() {
    use crate::client::{PolicyStats, WindowCounts};
    use crate::protection::{DEFAULT_REPORT_INTERVAL, DEFAULT_STAGE_HOLD, DEFAULT_STAGE_POLL};
    use redis::Value as R;
    let contract = contract();
    let p = &contract["protection"];
    let ms = |d: std::time::Duration| json!(d.as_millis() as u64);
    assert_eq!(p["kits"]["report_interval_ms"], ms(DEFAULT_REPORT_INTERVAL));
    assert_eq!(p["kits"]["stage_poll_ms"], ms(DEFAULT_STAGE_POLL));
    assert_eq!(p["kits"]["stage_hold_ms"], ms(DEFAULT_STAGE_HOLD));
    assert_eq!(p["kits"]["stage_of_many_masters"], "the highest");

    let names = |v: &Value| -> Vec<String> {
        v.as_array()
            .expect("names")
            .iter()
            .map(|n| n.as_str().expect("str").to_string())
            .collect()
    };
    let stats_fields = names(&p["stats_fields"]);
    let window_fields = names(&p["window_fields"]);
    assert_eq!(stats_fields, PolicyStats::FIELDS);
    assert_eq!(window_fields, WindowCounts::FIELDS);
    let text = |s: &str| R::BulkString(s.as_bytes().to_vec());
    let window = |base: i64| {
        R::Array(
            window_fields
                .iter()
                .enumerate()
                .flat_map(|(i, n)| [text(n), R::Int(base + i as i64)])
                .collect(),
        )
    };
    let reply = |skip: Option<&str>| {
        R::Array(
            stats_fields
                .iter()
                .filter(|n| Some(n.as_str()) != skip)
                .flat_map(|n| {
                    let v = match n.as_str() {
                        "scale" => R::Int(80),
                        "stage" => R::Int(2),
                        "window_ms" => R::Int(1000),
                        "window_end_ms" => R::Int(1_700_000_000_000),
                        "current" => window(10),
                        "last" => window(20),
                        "adapting" => R::Int(1),
                        other => panic!("a STATS field {other} this test does not know"),
                    };
                    [text(n), v]
                })
                .collect(),
        )
    };
    let got = PolicyStats::parse("RL.POLICY STATS", &reply(None)).expect("parsed");
    assert_eq!(
        (
            got.scale,
            got.stage,
            got.window_ms,
            got.window_end_ms,
            got.adapting
        ),
        (80, 2, 1000, 1_700_000_000_000, true)
    );
    let c = got.current;
    assert_eq!(
        [
            c.calls,
            c.admitted,
            c.denied,
            c.ok,
            c.errors,
            c.deny_permille,
            c.error_permille
        ],
        [10, 11, 12, 13, 14, 15, 16]
    );
    assert_eq!(got.last.calls, 20);
    for field in &stats_fields {
        assert!(
            PolicyStats::parse("RL.POLICY STATS", &reply(Some(field))).is_err(),
            "a reply without {field} is refused"
        );
    }

    let mut checked = 0;
    for case in p["scaled"].as_array().expect("scaled") {
        let (param, scale, want) = (
            case["param"].as_u64().expect("param"),
            case["scale"].as_u64().expect("scale") as u8,
            case["scaled"].as_u64().expect("scaled"),
        );
        let window = Spec::parse("r", "FIXEDWINDOW", &[param, 1000]).expect("valid");
        assert_eq!(window.scaled(scale).params(), [want, 1000], "{case}");
        let bucket = Spec::parse("r", "TOKENBUCKET", &[param, param, 1000]).expect("valid");
        assert_eq!(bucket.scaled(scale).params(), [want, want, 1000], "{case}");
        checked += 1;
    }
    assert!(checked >= 40, "{checked} scaled cases");
}

/// The typed loop options ([`crate::PolicyProtection`]) check exactly the
/// contract's `protection.arguments` ranges of `RL.POLICY SET`, by name.
#[test]
fn this_kit_checks_the_loop_options_with_the_contract_ranges() {
    use crate::{Adapt, PolicyProtection};
    let contract = contract();
    let args = contract["protection"]["arguments"]
        .as_array()
        .expect("arguments");
    for (name, min, max) in PolicyProtection::RANGES {
        let entry = args
            .iter()
            .find(|a| a["name"] == name)
            .unwrap_or_else(|| panic!("{name} in the contract"));
        assert_eq!(entry["min"], json!(min), "{name}");
        if name == "break_pct" {
            assert_eq!(entry["max"], "degrade_pct to 100");
        } else {
            assert_eq!(entry["max"], json!(max), "{name}");
        }
    }
    // Each bound: the value in range passes, one past it is refused, named.
    let adapt = |f: &dyn Fn(&mut Adapt)| {
        let mut a = Adapt {
            errors: 5,
            ..Adapt::default()
        };
        f(&mut a);
        PolicyProtection {
            adapt: Some(Some(a)),
            ..PolicyProtection::default()
        }
    };
    let refused = |p: PolicyProtection| match p.check("p") {
        Err(crate::Error::BadArgument { arg, .. }) => arg,
        other => panic!("{p:?}: {other:?}"),
    };
    assert_eq!(refused(adapt(&|a| a.errors = 101)), "ERRORS");
    assert_eq!(refused(adapt(&|a| a.factor = Some(0))), "FACTOR");
    assert_eq!(refused(adapt(&|a| a.min = Some(0))), "MIN");
    assert_eq!(refused(adapt(&|a| a.recover = Some(101))), "RECOVER");
    assert_eq!(refused(adapt(&|a| a.window_ms = Some(0))), "WINDOW");
    assert_eq!(
        refused(adapt(&|a| a.mincalls = Some((1 << 40) + 1))),
        "MINCALLS"
    );
    let stages = |d, b| PolicyProtection {
        stages: Some((d, b)),
        ..PolicyProtection::default()
    };
    assert_eq!(refused(stages(101, 101)), "degrade_pct");
    assert_eq!(refused(stages(50, 30)), "break_pct");
    assert!(stages(30, 30).check("p").is_ok());
    let window = |w| PolicyProtection {
        window_ms: Some(w),
        ..PolicyProtection::default()
    };
    assert_eq!(refused(window(86_400_001)), "WINDOW");
    assert!(adapt(&|a| {
        a.factor = Some(80);
        a.min = Some(1);
        a.recover = Some(0);
        a.window_ms = Some(86_400_000);
        a.mincalls = Some(1 << 40);
    })
    .check("p")
    .is_ok());
    // The words, in the server's grammar.
    let full = PolicyProtection {
        adapt: Some(Some(Adapt {
            errors: 5,
            factor: Some(80),
            min: None,
            recover: Some(10),
            window_ms: Some(1000),
            mincalls: Some(20),
        })),
        stages: Some((30, 50)),
        window_ms: Some(1000),
    };
    assert_eq!(
        full.args().join(" "),
        "ADAPT ERRORS 5 FACTOR 80 RECOVER 10 WINDOW 1000 MINCALLS 20 STAGES 30 50 WINDOW 1000"
    );
    let off = PolicyProtection {
        adapt: Some(None),
        ..PolicyProtection::default()
    };
    assert_eq!(off.args().join(" "), "ADAPT OFF");
}
