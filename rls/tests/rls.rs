//! End-to-end tests of redis-ratelimit-rls: the binary as a process, real
//! redis-server (and valkey-server) processes with the module, a 3-master
//! cluster, gRPC over TCP with the crate's generated client, and raw HTTP/1.1
//! for `/healthcheck`, `/metrics` and `/json`.
//!
//! Fixed windows are aligned to their unit on the server's clock, so a test
//! counting on one window first waits until the window it runs in has
//! enough time left ([`settle`]); hour windows keep that wait rare.

mod harness;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::*;

/// The metric names the tests read (the reference's Prometheus mapping for
/// the per-descriptor ones; the service's own for the rest).
const TOTAL_HITS: &str = "ratelimit_service_rate_limit_total_hits";
const WITHIN_LIMIT: &str = "ratelimit_service_rate_limit_within_limit";
const NEAR_LIMIT: &str = "ratelimit_service_rate_limit_near_limit";
const OVER_LIMIT: &str = "ratelimit_service_rate_limit_over_limit";
const SHADOW_MODE: &str = "ratelimit_service_rate_limit_shadow_mode";
const CONFIG_LOAD_ERROR: &str = "ratelimit_service_config_load_error";
const OVER_LIMIT_WITH_LOCAL_CACHE: &str =
    "ratelimit_service_rate_limit_over_limit_with_local_cache";
const GLOBAL_SHADOW_MODE: &str = "ratelimit_service_global_shadow_mode";
/// Every Redis call (RL.ALL, refund or probe), by result.
const REDIS_CALLS: &str = "ratelimit_rls_redis_call_duration_seconds_count";
const BREAKER_OPEN: &str = "ratelimit_rls_breaker_open";

/// Waits until the current `period_s`-second window of the server's clock
/// has at least `need_s` seconds left, so a test's calls all fall in one
/// fixed window.
fn settle(server: &Server, period_s: u64, need_s: u64) {
    wait_until("a window with time left", || {
        let now_s = server.time_us() / 1_000_000;
        period_s - now_s % period_s >= need_s
    });
}

/// One server with the module, a runtime folder with `files`, and the
/// service on them with `env` added to [`base_env`].
struct Single {
    server: Server,
    runtime: Runtime,
    rls: Rls,
}

impl Single {
    fn start(kind: Kind, files: &[(&str, &str)], env: &[(&str, &str)]) -> Single {
        let server = Server::start(kind);
        let runtime = Runtime::new(files);
        let mut e = base_env(&server.addr(), &runtime);
        for (k, v) in env {
            set_env(&mut e, k, v);
        }
        let rls = Rls::start(&e);
        Single {
            server,
            runtime,
            rls,
        }
    }
}

// ---------------------------------------------------------------- semantics

/// The reference's configuration features on one domain: nested
/// descriptors, a value-less key (any value, each value its own counter), a
/// wildcard, `name`/`replaces`, `shadow_mode`, `unlimited`. Hour windows.
const SEMANTICS: &str = "\
domain: sem
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit:
          unit: hour
          requests_per_unit: 1
  - key: foo
    rate_limit:
      unit: hour
      requests_per_unit: 2
    descriptors:
      - key: bar
        rate_limit:
          unit: hour
          requests_per_unit: 3
      - key: bar
        value: named
        rate_limit:
          name: named_limit
          unit: hour
          requests_per_unit: 1
      - key: baz
        value: shady
        shadow_mode: true
        rate_limit:
          unit: hour
          requests_per_unit: 2
      - key: bay
        rate_limit:
          unlimited: true
  - key: category
    value: account
    rate_limit:
      replaces:
        - name: named_limit
      unit: hour
      requests_per_unit: 4
  - key: path
    value: /api/*
    rate_limit:
      unit: hour
      requests_per_unit: 2
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 5
  - key: metered
    rate_limit:
      unit: hour
      requests_per_unit: 5
  - key: jsonkey
    rate_limit:
      unit: hour
      requests_per_unit: 1
";

/// The state of one status, for compact assertions.
fn st(s: &DescriptorStatus) -> (Code, Option<(u32, i32)>, u32) {
    (code(s), limit_of(s), s.limit_remaining)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semantics_of_the_reference_configuration() {
    let s = Single::start(Kind::Redis, &[("sem.yaml", SEMANTICS)], &[]);
    settle(&s.server, 3600, 60);
    let mut c = s.rls.client().await;
    let hour = |n: u32| Some((n, unit::HOUR));

    // Nested descriptors: the two entries together match the inner limit.
    let nested = || {
        request(
            "sem",
            vec![desc(&[
                ("source_cluster", "proxy"),
                ("destination_cluster", "mock"),
            ])],
        )
    };
    let r = ok(&mut c, nested()).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(st(&r.statuses[0]), (Code::Ok, hour(1), 0));
    let before_s = s.server.time_us() / 1_000_000;
    let r = ok(&mut c, nested()).await;
    let after_s = s.server.time_us() / 1_000_000;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(st(&r.statuses[0]), (Code::OverLimit, hour(1), 0));
    // The reference's reset: the rest of the aligned window on the clock.
    let reset = reset_s(&r.statuses[0]).expect("duration_until_reset");
    let (lo, hi) = (3600 - after_s % 3600, 3600 - before_s % 3600);
    assert!(
        (lo as i64..=hi as i64).contains(&reset),
        "duration_until_reset {reset} outside [{lo}, {hi}]"
    );
    // Only the first entry: matches no limit of its own.
    let r = ok(
        &mut c,
        request("sem", vec![desc(&[("source_cluster", "proxy")])]),
    )
    .await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(st(&r.statuses[0]), (Code::Ok, None, 0));

    // A key without a value: any value, each its own counter.
    for (value, remaining) in [("a", 1), ("a", 0), ("b", 1)] {
        let r = ok(&mut c, request("sem", vec![desc(&[("foo", value)])])).await;
        assert_eq!(
            st(&r.statuses[0]),
            (Code::Ok, hour(2), remaining),
            "foo={value}"
        );
    }
    let r = ok(&mut c, request("sem", vec![desc(&[("foo", "a")])])).await;
    assert_eq!(st(&r.statuses[0]), (Code::OverLimit, hour(2), 0));

    // The nested value-less key under it.
    let r = ok(
        &mut c,
        request("sem", vec![desc(&[("foo", "a"), ("bar", "x")])]),
    )
    .await;
    assert_eq!(st(&r.statuses[0]), (Code::Ok, hour(3), 2));

    // Unlimited: OK, the reference's u32::MAX remaining, no limit, no key.
    for _ in 0..3 {
        let r = ok(
            &mut c,
            request("sem", vec![desc(&[("foo", "a"), ("bay", "z")])]),
        )
        .await;
        assert_eq!(st(&r.statuses[0]), (Code::Ok, None, u32::MAX));
    }
    assert!(
        s.server.keys().iter().all(|k| !k.contains("bay")),
        "an unlimited descriptor reached Redis: {:?}",
        s.server.keys()
    );

    // Shadow mode: over the limit, still OK, and counted.
    for remaining in [1, 0] {
        let r = ok(
            &mut c,
            request("sem", vec![desc(&[("foo", "a"), ("baz", "shady")])]),
        )
        .await;
        assert_eq!(st(&r.statuses[0]), (Code::Ok, hour(2), remaining));
    }
    for _ in 0..2 {
        let r = ok(
            &mut c,
            request("sem", vec![desc(&[("foo", "a"), ("baz", "shady")])]),
        )
        .await;
        assert_eq!(overall(&r), Code::Ok, "shadow mode never denies");
        assert_eq!(st(&r.statuses[0]), (Code::Ok, hour(2), 0));
    }

    // replaces: with `category=account` in the request, the limit named
    // `named_limit` is dropped (three calls pass its limit of 1) and not
    // counted; the replacing limit counts.
    for remaining in [3, 2, 1] {
        let r = ok(
            &mut c,
            request(
                "sem",
                vec![
                    desc(&[("category", "account")]),
                    desc(&[("foo", "r"), ("bar", "named")]),
                ],
            ),
        )
        .await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(st(&r.statuses[0]), (Code::Ok, hour(4), remaining));
        assert_eq!(st(&r.statuses[1]), (Code::Ok, None, 0), "a replaced limit");
    }
    let r = ok(
        &mut c,
        request("sem", vec![desc(&[("foo", "r"), ("bar", "named")])]),
    )
    .await;
    assert_eq!(
        st(&r.statuses[0]),
        (Code::Ok, hour(1), 0),
        "the replaced limit was not counted while replaced"
    );

    // A wildcard: a prefix; each value its own counter; others unmatched.
    for (value, remaining) in [("/api/v1", 1), ("/api/v1", 0), ("/api/v2", 1)] {
        let r = ok(&mut c, request("sem", vec![desc(&[("path", value)])])).await;
        assert_eq!(
            st(&r.statuses[0]),
            (Code::Ok, hour(2), remaining),
            "{value}"
        );
    }
    let r = ok(&mut c, request("sem", vec![desc(&[("path", "/api/v1")])])).await;
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);
    let r = ok(&mut c, request("sem", vec![desc(&[("path", "/other")])])).await;
    assert_eq!(st(&r.statuses[0]), (Code::Ok, None, 0));

    // Unmatched descriptors and unknown domains: OK without a limit.
    let r = ok(&mut c, request("sem", vec![desc(&[("nothing", "here")])])).await;
    assert_eq!(
        (overall(&r), st(&r.statuses[0])),
        (Code::Ok, (Code::Ok, None, 0))
    );
    let r = ok(&mut c, request("nodomain", vec![desc(&[("user", "u")])])).await;
    assert_eq!(
        (overall(&r), st(&r.statuses[0])),
        (Code::Ok, (Code::Ok, None, 0))
    );

    // overall_code: one descriptor over its limit denies the request; each
    // status tells its own.
    let r = ok(
        &mut c,
        request(
            "sem",
            vec![desc(&[("user", "mixed")]), desc(&[("foo", "a")])],
        ),
    )
    .await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(code(&r.statuses[0]), Code::Ok);
    assert_eq!(limit_of(&r.statuses[0]), hour(5));
    assert_eq!(st(&r.statuses[1]), (Code::OverLimit, hour(2), 0));
    // ...and took nothing from the descriptor that admitted.
    let r = ok(
        &mut c,
        request("sem", vec![desc_hits(&[("user", "mixed")], 0)]),
    )
    .await;
    assert_eq!(
        st(&r.statuses[0]),
        (Code::Ok, hour(5), 5),
        "a denied request took nothing"
    );

    // Errors: the reference's messages.
    let e = call(&mut c, request("", vec![desc(&[("user", "u")])]))
        .await
        .expect_err("an empty domain");
    assert_eq!(e.code(), tonic::Code::Unknown, "{e:?}");
    assert!(
        e.message().contains("rate limit domain must not be empty"),
        "{e:?}"
    );
    let e = call(&mut c, request("sem", vec![]))
        .await
        .expect_err("no descriptors");
    assert_eq!(e.code(), tonic::Code::Unknown, "{e:?}");
    assert!(
        e.message()
            .contains("rate limit descriptor list must not be empty"),
        "{e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_per_request_and_per_descriptor_and_limit_override() {
    let s = Single::start(Kind::Redis, &[("sem.yaml", SEMANTICS)], &[]);
    settle(&s.server, 3600, 60);
    let mut c = s.rls.client().await;
    let hour = |n: u32| Some((n, unit::HOUR));
    let user = |v: &str, hits: u32| {
        let mut r = request("sem", vec![desc(&[("user", v)])]);
        r.hits_addend = hits;
        r
    };

    // The request's hits_addend; 0 (unset) counts one hit.
    let r = ok(&mut c, user("h1", 3)).await;
    assert_eq!(st(&r.statuses[0]), (Code::Ok, hour(5), 2));
    let r = ok(&mut c, user("h1", 0)).await;
    assert_eq!(st(&r.statuses[0]), (Code::Ok, hour(5), 1));
    // More than what is left: denied, and nothing taken.
    let r = ok(&mut c, user("h1", 2)).await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);

    // A descriptor's own hits_addend: 0 is a check, nothing taken.
    for _ in 0..3 {
        let r = ok(
            &mut c,
            request("sem", vec![desc_hits(&[("user", "h1")], 0)]),
        )
        .await;
        assert_eq!(
            st(&r.statuses[0]),
            (Code::Ok, hour(5), 1),
            "a check takes nothing"
        );
    }
    // A descriptor's own hits_addend wins over the request's.
    let mut r = request(
        "sem",
        vec![desc_hits(&[("user", "h2")], 1), desc(&[("user", "h3")])],
    );
    r.hits_addend = 4;
    let r = ok(&mut c, r).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(st(&r.statuses[0]), (Code::Ok, hour(5), 4), "its own: 1 hit");
    assert_eq!(
        st(&r.statuses[1]),
        (Code::Ok, hour(5), 1),
        "the request's: 4 hits"
    );
    // A descriptor's own larger than its limit: denied, nothing taken.
    let r = ok(
        &mut c,
        request("sem", vec![desc_hits(&[("user", "h2")], 5)]),
    )
    .await;
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);
    let r = ok(
        &mut c,
        request("sem", vec![desc_hits(&[("user", "h2")], 4)]),
    )
    .await;
    assert_eq!(st(&r.statuses[0]), (Code::Ok, hour(5), 0));

    // A descriptor's `limit` override: its limit, whatever the file says,
    // even for a descriptor no file matches.
    let over = |entries: &[(&str, &str)], n: u32, u: i32| {
        let mut d = desc(entries);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: n,
            unit: u,
        });
        request("sem", vec![d])
    };
    for remaining in [1, 0] {
        let r = ok(&mut c, over(&[("user", "o1")], 2, unit::HOUR)).await;
        assert_eq!(st(&r.statuses[0]), (Code::Ok, hour(2), remaining));
    }
    let r = ok(&mut c, over(&[("user", "o1")], 2, unit::HOUR)).await;
    assert_eq!(st(&r.statuses[0]), (Code::OverLimit, hour(2), 0));
    let r = ok(&mut c, over(&[("unconfigured", "x")], 1, unit::DAY)).await;
    assert_eq!(st(&r.statuses[0]), (Code::Ok, Some((1, unit::DAY)), 0));
    let r = ok(&mut c, over(&[("unconfigured", "x")], 1, unit::DAY)).await;
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);
}

/// The reference's counters per descriptor: within, near (used after the
/// hit above floor(limit * NEAR_LIMIT_RATIO)), over, total, shadow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_in_metrics_and_the_json_endpoint() {
    let s = Single::start(Kind::Redis, &[("sem.yaml", SEMANTICS)], &[]);
    settle(&s.server, 3600, 60);
    let mut c = s.rls.client().await;
    // Limit 5, ratio 0.8: hits 1-4 within, 5 within and near, 6-7 over.
    for i in 1..=7 {
        let r = ok(&mut c, request("sem", vec![desc(&[("metered", "m")])])).await;
        let want = if i <= 5 { Code::Ok } else { Code::OverLimit };
        assert_eq!(overall(&r), want, "hit {i}");
    }
    // Two shadow-mode hits over the limit of 2.
    for _ in 0..4 {
        ok(
            &mut c,
            request("sem", vec![desc(&[("foo", "s"), ("baz", "shady")])]),
        )
        .await;
    }
    let labels = [("domain", "sem"), ("key1", "metered")];
    let m = s.rls.metrics();
    let got = (
        m.sum(TOTAL_HITS, &labels),
        m.sum(WITHIN_LIMIT, &labels),
        m.sum(NEAR_LIMIT, &labels),
        m.sum(OVER_LIMIT, &labels),
    );
    assert_eq!(
        got,
        (7.0, 5.0, 1.0, 2.0),
        "(total, within, near, over) of sem.metered:\n{}",
        m.text
    );
    let shadow = [("domain", "sem"), ("key1", "foo"), ("key2", "baz_shady")];
    assert_eq!(
        m.sum(SHADOW_MODE, &shadow),
        2.0,
        "shadow mode hits:\n{}",
        m.text
    );

    // /json: the same service in proto3 JSON; 429 when over the limit.
    let body = r#"{"domain":"sem","descriptors":[{"entries":[{"key":"jsonkey","value":"a"}]}]}"#;
    let (status, v) = s.rls.json(body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["overallCode"], "OK", "{v}");
    assert_eq!(
        v["statuses"][0]["currentLimit"]["requestsPerUnit"], 1,
        "{v}"
    );
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "HOUR", "{v}");
    let reset = v["statuses"][0]["durationUntilReset"]
        .as_str()
        .unwrap_or("");
    assert!(reset.ends_with('s') && reset.len() > 1, "{v}");
    let (status, v) = s.rls.json(body);
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["overallCode"], "OVER_LIMIT", "{v}");
    let (status, _) = s.rls.json("{not json");
    assert_eq!(status, 400);
    // The healthcheck answers OK with a configuration loaded.
    let h = s.rls.http("GET", "/healthcheck", "");
    assert_eq!(h.status, 200, "{}", h.body);
}

/// LIMIT_RESPONSE_HEADERS_ENABLED: the three headers from the descriptor
/// with the least remaining; SHADOW_MODE: OVER_LIMIT statuses, OK overall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_headers_and_global_shadow_mode() {
    let s = Single::start(
        Kind::Redis,
        &[("sem.yaml", SEMANTICS)],
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_REMAINING_HEADER", "X-Left"),
            ("SHADOW_MODE", "true"),
        ],
    );
    settle(&s.server, 3600, 60);
    let mut c = s.rls.client().await;
    let req = || {
        request(
            "sem",
            vec![
                desc(&[("user", "hdr")]),
                desc(&[("foo", "hdr"), ("bar", "b")]),
            ],
        )
    };
    let headers = |r: &RateLimitResponse| -> Vec<(String, String)> {
        let mut h: Vec<(String, String)> = r
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        h.sort();
        h
    };
    let before_s = s.server.time_us() / 1_000_000;
    let r = ok(&mut c, req()).await;
    let after_s = s.server.time_us() / 1_000_000;
    // user: 5 - 1 = 4 left; foo/bar: 3 - 1 = 2 left: the headers are bar's.
    let h = headers(&r);
    assert_eq!(h.len(), 3, "{h:?}");
    assert_eq!(h[0].0, "RateLimit-Limit");
    assert_eq!(h[0].1, "3");
    assert_eq!(h[1].0, "RateLimit-Reset");
    let reset: u64 = h[1].1.parse().unwrap();
    assert!(
        (3600 - after_s % 3600..=3600 - before_s % 3600).contains(&reset),
        "{h:?}"
    );
    assert_eq!(h[2], ("X-Left".to_string(), "2".to_string()));

    for _ in 0..2 {
        ok(&mut c, req()).await;
    }
    let r = ok(&mut c, req()).await;
    assert_eq!(overall(&r), Code::Ok, "SHADOW_MODE answers OK");
    assert_eq!(
        code(&r.statuses[1]),
        Code::OverLimit,
        "the status still tells"
    );
    let h = headers(&r);
    assert!(
        h.contains(&("X-Left".to_string(), "0".to_string())),
        "{h:?}"
    );
    let m = s.rls.metrics();
    assert_eq!(m.sum(GLOBAL_SHADOW_MODE, &[]), 1.0, "{}", m.text);
}

/// The extension algorithms, and several limits on one descriptor.
const EXTENSIONS: &str = "\
domain: ext
descriptors:
  - key: sw
    rate_limit:
      unit: hour
      requests_per_unit: 3
      algorithm: sliding_window
  - key: tb
    rate_limit:
      unit: hour
      requests_per_unit: 4
      algorithm: token_bucket
      burst: 2
  - key: hw
    rate_limit:
      unit: hour
      requests_per_unit: 3
      algorithm: hash_window
      buckets: 10
  - key: multi
    rate_limit:
      - unit: hour
        requests_per_unit: 10
      - unit: hour
        requests_per_unit: 2
        algorithm: sliding_window
  - key: period
    rate_limit:
      unit: minute
      unit_multiplier: 120
      requests_per_unit: 2
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_algorithms_and_several_limits() {
    let s = Single::start(Kind::Redis, &[("ext.yaml", EXTENSIONS)], &[]);
    settle(&s.server, 7200, 60);
    let mut c = s.rls.client().await;
    let one = |k: &str| request("ext", vec![desc(&[(k, "v")])]);
    let hour = |n: u32| Some((n, unit::HOUR));

    // Each admits its limit (the bucket its burst), then denies. A reset
    // is at most the period (the hash window's: the period from the end of
    // the current bucket, a tenth of it).
    for (key, limit, admitted, max_reset) in
        [("sw", 3, 3, 3600), ("tb", 4, 2, 3600), ("hw", 3, 3, 3960)]
    {
        for i in 1..=admitted {
            let r = ok(&mut c, one(key)).await;
            assert_eq!(
                st(&r.statuses[0]),
                (Code::Ok, hour(limit), admitted - i),
                "{key} call {i}"
            );
            let reset = reset_s(&r.statuses[0]).unwrap_or(-1);
            assert!((0..=max_reset).contains(&reset), "{key}: reset {reset}");
        }
        let r = ok(&mut c, one(key)).await;
        assert_eq!(overall(&r), Code::OverLimit, "{key}");
        assert_eq!(
            st(&r.statuses[0]),
            (Code::OverLimit, hour(limit), 0),
            "{key}"
        );
        let reset = reset_s(&r.statuses[0]).unwrap_or(-1);
        assert!(
            (1..=max_reset).contains(&reset),
            "{key} denied: reset {reset}"
        );
        // Every algorithm's key is in Redis.
        assert!(
            s.server
                .keys()
                .iter()
                .any(|k| k.contains(&format!("_{key}_"))),
            "{key}: {:?}",
            s.server.keys()
        );
    }

    // Two limits: the most restrictive tells; the first denial takes
    // nothing from the other, so the wide one counts only admitted calls.
    for remaining in [1, 0] {
        let r = ok(&mut c, one("multi")).await;
        assert_eq!(st(&r.statuses[0]), (Code::Ok, hour(2), remaining));
    }
    for _ in 0..3 {
        let r = ok(&mut c, one("multi")).await;
        assert_eq!(st(&r.statuses[0]), (Code::OverLimit, hour(2), 0));
    }
    let multi_keys: Vec<String> = s
        .server
        .keys()
        .into_iter()
        .filter(|k| k.contains("_multi_"))
        .collect();
    assert_eq!(multi_keys.len(), 2, "one key per limit: {multi_keys:?}");

    // unit_multiplier: 120 minutes, two hours' window.
    for remaining in [1, 0] {
        let r = ok(&mut c, one("period")).await;
        assert_eq!(code(&r.statuses[0]), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, remaining);
        let reset = reset_s(&r.statuses[0]).unwrap_or(-1);
        assert!(
            (60..=7200).contains(&reset),
            "a 120-minute window resets within 2 hours: {reset}"
        );
    }
    let r = ok(&mut c, one("period")).await;
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);
}

// ---------------------------------------------------------------- atomicity

/// Two descriptors: the second has room for one call.
const ATOMIC: &str = "\
domain: atom
descriptors:
  - key: wide
    rate_limit:
      unit: hour
      requests_per_unit: 100
  - key: narrow
    rate_limit:
      unit: hour
      requests_per_unit: 1
";

/// The scenario: a request over both descriptors is admitted once; then
/// the narrow one denies every time, and the wide one's count never moves.
async fn two_descriptors_deny_atomically(
    c: &mut RateLimitServiceClient<tonic::transport::Channel>,
) {
    let both = || {
        request(
            "atom",
            vec![desc(&[("wide", "w")]), desc(&[("narrow", "n")])],
        )
    };
    let check = || request("atom", vec![desc_hits(&[("wide", "w")], 0)]);
    let r = ok(c, both()).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 99);
    assert_eq!(r.statuses[1].limit_remaining, 0);
    for i in 0..5 {
        let r = ok(c, both()).await;
        assert_eq!(overall(&r), Code::OverLimit, "call {i}");
        assert_eq!(code(&r.statuses[1]), Code::OverLimit, "call {i}");
        let r = ok(c, check()).await;
        assert_eq!(
            st(&r.statuses[0]),
            (Code::Ok, Some((100, unit::HOUR)), 99),
            "after denial {i}, the wide descriptor kept its count"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_consumes_nothing_on_one_server() {
    for kind in [Kind::Redis, Kind::Valkey] {
        let s = Single::start(kind, &[("atom.yaml", ATOMIC)], &[]);
        settle(&s.server, 3600, 60);
        let mut c = s.rls.client().await;
        let before = s.server.calls("rl.all");
        two_descriptors_deny_atomically(&mut c).await;
        // One RL.ALL per request (1 + 5 denied + 5 checks).
        assert_eq!(s.server.calls("rl.all") - before, 11, "{kind:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_consumes_nothing_on_a_cluster() {
    let cluster = Cluster::start(Kind::Redis);
    settle(&cluster.nodes[0], 3600, 60);
    let runtime = Runtime::new(&[("atom.yaml", ATOMIC)]);
    for hash_tag in ["none", "domain"] {
        for n in &cluster.nodes {
            let _: String = n.query(&["FLUSHALL"]);
        }
        let mut env = base_env(&cluster.redis_url(), &runtime);
        set_env(&mut env, "REDIS_TYPE", "cluster");
        set_env(&mut env, "RLS_HASH_TAG", hash_tag);
        let rls = Rls::start(&env);
        let mut c = rls.client().await;
        let before: u64 = cluster.rl_all_calls().iter().sum();
        two_descriptors_deny_atomically(&mut c).await;
        let keys = cluster.keys();
        assert_eq!(keys.len(), 2, "{hash_tag}: {keys:?}");
        let slots: Vec<u64> = keys.iter().map(|(_, k)| cluster.keyslot(k)).collect();
        let groups = if hash_tag == "domain" {
            assert!(keys.iter().all(|(_, k)| k.contains("{atom}")), "{keys:?}");
            assert_eq!(slots[0], slots[1], "one slot with RLS_HASH_TAG=domain");
            1
        } else {
            assert_ne!(
                slots[0], slots[1],
                "{keys:?}: the refund path needs two slots"
            );
            2
        };
        // RL.ALL per request: one per slot group for the 6 two-descriptor
        // requests (refunds are not RL.ALL), one for each of the 5 checks.
        let calls: u64 = cluster.rl_all_calls().iter().sum::<u64>() - before;
        assert_eq!(calls, 6 * groups + 5, "{hash_tag}: RL.ALL calls");

        // One request, counted on each master: one RL.ALL per slot group,
        // each on the master of its slot.
        let per_node = cluster.rl_all_calls();
        ok(
            &mut c,
            request(
                "atom",
                vec![desc(&[("wide", "w2")]), desc(&[("narrow", "n2")])],
            ),
        )
        .await;
        let delta: Vec<u64> = cluster
            .rl_all_calls()
            .iter()
            .zip(&per_node)
            .map(|(a, b)| a - b)
            .collect();
        assert_eq!(delta.iter().sum::<u64>(), groups, "{hash_tag}: {delta:?}");
        assert!(delta.iter().all(|d| *d <= groups), "{delta:?}");
    }
}

// ---------------------------------------------------------- window boundary

const WINDOWS: &str = "\
domain: win
descriptors:
  - key: sliding
    rate_limit:
      unit: second
      requests_per_unit: 3
      algorithm: sliding_window
  - key: fixed
    rate_limit:
      unit: second
      requests_per_unit: 5
";

/// A sliding window of L per W never admits L + 1 calls within W: for
/// admissions i and i + L, the later one's reply comes at least W after the
/// earlier one's send, whatever the latency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_never_admits_more_than_its_limit_in_any_window() {
    const L: usize = 3;
    const W: Duration = Duration::from_secs(1);
    let s = Single::start(Kind::Redis, &[("win.yaml", WINDOWS)], &[]);
    let mut c = s.rls.client().await;
    let mut admitted: Vec<(Instant, Instant)> = Vec::new();
    let mut denied = 0;
    let start = Instant::now();
    // At least 3.5 s of offered load, and until 4 windows' worth were
    // admitted with denials between them (a slow machine takes longer).
    while start.elapsed() < Duration::from_millis(3500) || admitted.len() <= 4 * L || denied == 0 {
        assert!(
            start.elapsed() < PATIENCE,
            "{} admitted, {denied} denied",
            admitted.len()
        );
        let sent = Instant::now();
        let r = ok(&mut c, request("win", vec![desc(&[("sliding", "s")])])).await;
        let recv = Instant::now();
        match overall(&r) {
            Code::Ok => admitted.push((sent, recv)),
            _ => denied += 1,
        }
        // Offered load well above the limit, spread across boundaries.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for i in 0..admitted.len() - L {
        let gap = admitted[i + L].1 - admitted[i].0;
        assert!(
            gap >= W,
            "admissions {i} and {} within {gap:?} < {W:?}",
            i + L
        );
    }
}

/// The default fixed window: the reference's windows, aligned to the second
/// on the server's clock: no aligned second admits more than L, and the
/// quota is whole again in the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_counts_in_the_references_aligned_windows() {
    const L: u32 = 5;
    let s = Single::start(Kind::Redis, &[("win.yaml", WINDOWS)], &[]);
    let mut c = s.rls.client().await;
    let mut per_second: std::collections::BTreeMap<u64, u32> = Default::default();
    let mut fresh_checked = 0;
    let mut prev_end_s = 0;
    let start = Instant::now();
    // At least 3.5 s, and until both checks below have something to check
    // (a slow machine takes longer).
    while start.elapsed() < Duration::from_millis(3500)
        || fresh_checked < 2
        || !per_second.values().any(|n| *n == L)
    {
        assert!(
            start.elapsed() < PATIENCE,
            "{fresh_checked} boundaries, admitted per second: {per_second:?}"
        );
        let t0 = s.server.time_us() / 1_000_000;
        let r = ok(&mut c, request("win", vec![desc(&[("fixed", "f")])])).await;
        let t1 = s.server.time_us() / 1_000_000;
        if t0 == t1 {
            let status = &r.statuses[0];
            if code(status) == Code::Ok {
                *per_second.entry(t0).or_default() += 1;
            }
            // The first call of a second whose previous call ended in an
            // earlier second: nothing else can have counted in this window.
            if prev_end_s < t0 && prev_end_s != 0 {
                assert_eq!(
                    st(status),
                    (Code::Ok, Some((L, unit::SECOND)), L - 1),
                    "the first call of second {t0}"
                );
                fresh_checked += 1;
            }
        }
        prev_end_s = t1;
    }
    for (second, n) in &per_second {
        assert!(*n <= L, "second {second} admitted {n} > {L}");
    }
}

// --------------------------------------------------------------- hot reload

fn reload_config(limit: u32, extra: &str) -> String {
    format!(
        "\
domain: reload
descriptors:
  - key: k
    rate_limit:
      unit: hour
      requests_per_unit: {limit}
{extra}"
    )
}

/// Calls keep answering while the runtime's `current` symlink is swapped to
/// new configurations, and each new configuration applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_under_load_drops_no_call() {
    let first = reload_config(1_000_000, "");
    let mut s = Single::start(Kind::Redis, &[("reload.yaml", &first)], &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..3 {
        let mut c = s.rls.client().await;
        let (stop, done) = (stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let req = request("reload", vec![desc(&[("k", &format!("t{t}"))])]);
                match tokio::time::timeout(Duration::from_secs(10), call(&mut c, req)).await {
                    Ok(Ok(r)) if overall(&r) == Code::Ok => {}
                    Ok(Ok(r)) => failures.push(format!("{r:?}")),
                    Ok(Err(e)) => failures.push(format!("{e:?}")),
                    Err(_) => failures.push("no answer within 10 s".to_string()),
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            failures
        }));
    }
    let mut c = s.rls.client().await;
    let limit_now = |r: &RateLimitResponse| limit_of(&r.statuses[0]).map(|l| l.0);
    wait_for("calls under way", || {
        let d = done.clone();
        async move { d.load(Ordering::Relaxed) > 50 }
    })
    .await;

    // A swap of the symlink to a new version with a new limit and a new
    // descriptor.
    let tight = "  - key: tight\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n";
    s.runtime
        .swap(&[("reload.yaml", &reload_config(2_000_000, tight))]);
    let probe = || request("reload", vec![desc_hits(&[("k", "probe")], 0)]);
    let mut seen = 0;
    let start = Instant::now();
    while seen != 2_000_000 {
        assert!(start.elapsed() < PATIENCE, "the new limit never applied");
        seen = limit_now(&ok(&mut c, probe()).await).unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tight_req = || request("reload", vec![desc(&[("tight", "x")])]);
    assert_eq!(overall(&ok(&mut c, tight_req()).await), Code::Ok);
    assert_eq!(overall(&ok(&mut c, tight_req()).await), Code::OverLimit);

    // A second swap, and an edit in place of the folder it points to.
    s.runtime
        .swap(&[("reload.yaml", &reload_config(3_000_000, ""))]);
    wait_for("the third configuration", || {
        let mut c = c.clone();
        async move {
            ok(&mut c, probe()).await.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.requests_per_unit)
                == Some(3_000_000)
        }
    })
    .await;
    let calls_then = done.load(Ordering::Relaxed);
    s.runtime
        .write("reload.yaml", &reload_config(4_000_000, ""));
    wait_for("the edited configuration", || {
        let mut c = c.clone();
        async move {
            ok(&mut c, probe()).await.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.requests_per_unit)
                == Some(4_000_000)
        }
    })
    .await;
    // The descriptor the swap removed is unmatched now.
    let r = ok(&mut c, tight_req()).await;
    assert_eq!(st(&r.statuses[0]), (Code::Ok, None, 0));
    wait_for("more calls after the reloads", || {
        let d = done.clone();
        async move { d.load(Ordering::Relaxed) > calls_then + 50 }
    })
    .await;

    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for t in tasks {
        failures.extend(t.await.unwrap());
    }
    assert!(
        failures.is_empty(),
        "{} of {} calls failed, first: {}",
        failures.len(),
        done.load(Ordering::Relaxed),
        failures[0]
    );
}

// ------------------------------------------------------------------- faults

/// `kill -9` of Redis under load: every call answers UNAVAILABLE at once
/// (never past its deadline), the breaker lets only probes reach Redis, and
/// the service recovers when Redis is back on its port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_answers_unavailable_then_recovers() {
    const OPEN_MS: u64 = 500;
    const FAILURES: u64 = 3;
    let mut s = Single::start(
        Kind::Redis,
        &[("reload.yaml", &reload_config(1_000_000, ""))],
        &[
            ("REDIS_TIMEOUT", "200ms"),
            ("RLS_BREAKER_OPEN_MS", &OPEN_MS.to_string()),
            ("RLS_BREAKER_FAILURES", &FAILURES.to_string()),
        ],
    );
    // Each task records every answer: Ok(true) admitted, Ok(false) over,
    // Err(code) a status, or a hang.
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(std::sync::Mutex::new(Vec::<Result<(), String>>::new()));
    let unavailable = Arc::new(AtomicU64::new(0));
    let oks = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..2 {
        let mut c = s.rls.client().await;
        let (stop, answers, unavailable, oks) = (
            stop.clone(),
            answers.clone(),
            unavailable.clone(),
            oks.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let req = request("reload", vec![desc(&[("k", &format!("t{t}"))])]);
                let answer =
                    match tokio::time::timeout(Duration::from_secs(5), call(&mut c, req)).await {
                        Ok(Ok(r)) if overall(&r) == Code::Ok => {
                            oks.fetch_add(1, Ordering::Relaxed);
                            Ok(())
                        }
                        Ok(Ok(r)) => Err(format!("not OK: {r:?}")),
                        Ok(Err(e)) if e.code() == tonic::Code::Unavailable => {
                            unavailable.fetch_add(1, Ordering::Relaxed);
                            Ok(())
                        }
                        Ok(Err(e)) => Err(format!("{e:?}")),
                        Err(_) => Err("no answer within 5 s".to_string()),
                    };
                answers.lock().unwrap().push(answer);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    let count = |a: &Arc<AtomicU64>| a.load(Ordering::Relaxed);
    wait_until("admitted calls", || count(&oks) > 50);

    s.server.kill9();
    wait_until("UNAVAILABLE answers", || count(&unavailable) > 0);
    // Past the failures that open the breaker, only probes reach Redis:
    // one per OPEN_MS (a failed probe opens it again).
    wait_until("the breaker to open", || {
        s.rls.metrics().sum(BREAKER_OPEN, &[]) == 1.0
    });
    let calls_before = s.rls.metrics().sum(REDIS_CALLS, &[]);
    let outage_start = Instant::now();
    let unavailable_before = count(&unavailable);
    wait_until("an outage of 3 s", || {
        outage_start.elapsed() >= Duration::from_secs(3)
    });
    let calls_after = s.rls.metrics().sum(REDIS_CALLS, &[]);
    let outage = outage_start.elapsed();
    let answered = count(&unavailable) - unavailable_before;
    eprintln!(
        "outage of {outage:?}: {answered} calls answered UNAVAILABLE, {} Redis calls (probes)",
        calls_after - calls_before
    );
    let bound = outage.as_millis() as f64 / OPEN_MS as f64 + FAILURES as f64 + 2.0;
    assert!(
        calls_after - calls_before <= bound,
        "{} Redis calls in {outage:?} of outage ({answered} calls answered), more than probes ({bound})",
        calls_after - calls_before
    );
    assert!(
        answered > 20,
        "only {answered} calls answered during the outage"
    );

    // Back on the same port with the module: answers recover.
    s.server.restart();
    let oks_then = count(&oks);
    wait_until("admitted calls after the restart", || {
        count(&oks) > oks_then + 20
    });
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let answers = answers.lock().unwrap();
    let bad: Vec<&String> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert!(
        bad.is_empty(),
        "{} of {} answers neither OK nor UNAVAILABLE, first: {}",
        bad.len(),
        answers.len(),
        bad[0]
    );
    assert!(
        s.rls.metrics().has(REDIS_CALLS),
        "no {REDIS_CALLS}:\n{:?}",
        s.rls.metrics().names()
    );
}

/// A bad file written under load: the old configuration stays, the log
/// names the file and line, and /metrics counts the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_configuration_file_keeps_the_old_one() {
    let good = reload_config(1_000, "");
    let s = Single::start(Kind::Redis, &[("reload.yaml", &good)], &[]);
    settle(&s.server, 3600, 60);
    let mut c = s.rls.client().await;
    let probe = || request("reload", vec![desc(&[("k", "bad")])]);
    let r = ok(&mut c, probe()).await;
    assert_eq!(limit_of(&r.statuses[0]), Some((1_000, unit::HOUR)));
    let errors_before = s.rls.metrics().sum(CONFIG_LOAD_ERROR, &[]);

    // Line 6 of the file holds the bad unit.
    let bad = "\
domain: broken
descriptors:
  - key: k
    rate_limit:
      requests_per_unit: 5
      unit: fortnight
";
    s.runtime.write("broken.yaml", bad);
    let mut last_log = String::new();
    wait_until("a log line naming the bad file", || {
        last_log = s.rls.log_text();
        last_log
            .lines()
            .any(|l| l.contains("broken.yaml:6") && l.contains("fortnight"))
    });
    wait_until("the load error counted", || {
        s.rls.metrics().sum(CONFIG_LOAD_ERROR, &[]) > errors_before
    });
    // Calls go on under the old configuration.
    for remaining in [998, 997] {
        let r = ok(&mut c, probe()).await;
        assert_eq!(
            st(&r.statuses[0]),
            (Code::Ok, Some((1_000, unit::HOUR)), remaining)
        );
    }
    let r = ok(&mut c, request("broken", vec![desc(&[("k", "x")])])).await;
    assert_eq!(
        limit_of(&r.statuses[0]),
        None,
        "the bad file's domain is not loaded"
    );
    let h = s.rls.http("GET", "/healthcheck", "");
    assert_eq!(h.status, 200, "still healthy on the old configuration");
}

/// A server without the module: the service refuses to start, clearly.
#[test]
fn start_up_against_a_server_without_the_module_fails_clearly() {
    let server = Server::start_bare(Kind::Redis);
    let runtime = Runtime::new(&[("atom.yaml", ATOMIC)]);
    let env = base_env(&server.addr(), &runtime);
    let (status, out) = Rls::run_to_exit(&env);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("has no ratelimit module"), "{out}");
    assert!(out.contains("--loadmodule"), "{out}");
}

// ---------------------------------------------- the reference's examples

/// The reference's example configurations (the CONFIG helper's fixtures,
/// copied as documented), loaded together, with the behaviours its README
/// and integration tests describe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_references_example_configurations() {
    let names = [
        "examples/example.yaml",
        "examples/config.yaml",
        "readme/example2.yaml",
        "readme/example3.yaml",
        "readme/example5.yaml",
        "readme/example6.yaml",
        "readme/example7.yaml",
        "readme/example9.yaml",
        "readme/example11_a.yaml",
    ];
    let texts: Vec<(String, String)> = names
        .iter()
        .map(|n| (n.replace('/', "_"), fixture(n)))
        .collect();
    let files: Vec<(&str, &str)> = texts
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    let s = Single::start(Kind::Redis, &files, &[]);
    let mut c = s.rls.client().await;
    let one = |domain: &str, entries: &[(&str, &str)]| request(domain, vec![desc(entries)]);
    let sec = |n: u32| Some((n, unit::SECOND));
    let min = |n: u32| Some((n, unit::MINUTE));

    // Limits that hold whatever the window: a zero limit (a black list), a
    // shadow-mode limit, `replaces`, unlimited, a wildcard, unmatched.
    let r = ok(
        &mut c,
        one("edge_proxy_per_ip", &[("remote_address", "50.0.0.5")]),
    )
    .await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(st(&r.statuses[0]), (Code::OverLimit, sec(0), 0));
    let r = ok(
        &mut c,
        one("edge_proxy_per_ip", &[("remote_address", "10.0.0.1")]),
    )
    .await;
    assert_eq!(st(&r.statuses[0]), (Code::Ok, sec(10), 9));
    for _ in 0..12 {
        let r = ok(
            &mut c,
            one("example6", &[("service", "s"), ("user", "user-a")]),
        )
        .await;
        assert_eq!(overall(&r), Code::Ok, "shadow mode");
        assert_eq!(limit_of(&r.statuses[0]), sec(10));
    }
    let r = ok(
        &mut c,
        one("example6", &[("service", "s"), ("user", "user-b")]),
    )
    .await;
    assert_eq!(limit_of(&r.statuses[0]), sec(20));
    let r = ok(
        &mut c,
        request(
            "example7",
            vec![
                desc(&[("key_1", "value_1"), ("user", "bkthomps")]),
                desc(&[("key_2", "value_2"), ("user", "bkthomps")]),
            ],
        ),
    )
    .await;
    assert_eq!(st(&r.statuses[0]), (Code::Ok, None, 0), "replaced");
    assert_eq!(limit_of(&r.statuses[1]), sec(10));
    let r = ok(
        &mut c,
        one("example7", &[("key_1", "value_1"), ("user", "bkthomps")]),
    )
    .await;
    assert_eq!(limit_of(&r.statuses[0]), sec(5), "not replaced alone");
    let r = ok(&mut c, one("internal", &[("ldap", "x")])).await;
    assert_eq!(st(&r.statuses[0]), (Code::Ok, None, u32::MAX));
    let r = ok(&mut c, one("internal", &[("azure", "x")])).await;
    assert_eq!(limit_of(&r.statuses[0]), min(100));
    let r = ok(&mut c, one("example9", &[("key1", "value123")])).await;
    assert_eq!(limit_of(&r.statuses[0]), min(20));
    let r = ok(&mut c, one("example9", &[("key1", "other")])).await;
    assert_eq!(st(&r.statuses[0]), (Code::Ok, None, 0));
    let r = ok(&mut c, one("mongo_cps", &[("database", "users")])).await;
    assert_eq!(limit_of(&r.statuses[0]), sec(500));

    // rl (examples/example.yaml): `banned_limit` (0 per minute) denies,
    // unless a descriptor replacing it comes along.
    let r = ok(&mut c, one("rl", &[("foo", "f"), ("bar", "banned")])).await;
    assert_eq!(st(&r.statuses[0]), (Code::OverLimit, min(0), 0));
    let r = ok(&mut c, one("rl", &[("qux", "q")])).await;
    assert_eq!(st(&r.statuses[0]), (Code::Ok, None, u32::MAX));
    let r = ok(&mut c, one("rl", &[("foo", "f"), ("bay", "y")])).await;
    assert_eq!(st(&r.statuses[0]), (Code::Ok, None, u32::MAX));

    // Counting in hour and day windows (example11_a, example2), then in a
    // minute window (rl): each waits for room in its window.
    settle(&s.server, 3600, 60);
    // share_threshold: every files/* value shares one counter; without it,
    // each value has its own.
    for (value, remaining) in [("files/a", 9), ("files/b", 8), ("files/c", 7)] {
        let r = ok(&mut c, one("example11", &[("files", value)])).await;
        assert_eq!(
            st(&r.statuses[0]),
            (Code::Ok, Some((10, unit::HOUR)), remaining),
            "{value}"
        );
    }
    for value in ["files_no_share/a", "files_no_share/b"] {
        let r = ok(&mut c, one("example11", &[("files_no_share", value)])).await;
        assert_eq!(
            st(&r.statuses[0]),
            (Code::Ok, Some((10, unit::HOUR)), 9),
            "{value}"
        );
    }
    settle(&s.server, 86400, 60);
    for remaining in [4, 3] {
        let r = ok(
            &mut c,
            request(
                "messaging",
                vec![
                    desc(&[("message_type", "marketing"), ("to_number", "2061111111")]),
                    desc(&[("to_number", "2061111111")]),
                ],
            ),
        )
        .await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(
            st(&r.statuses[0]),
            (Code::Ok, Some((5, unit::DAY)), remaining)
        );
        assert_eq!(
            st(&r.statuses[1]),
            (Code::Ok, Some((100, unit::DAY)), remaining + 95)
        );
    }
    settle(&s.server, 60, 15);
    let with_override = || {
        request(
            "rl",
            vec![
                desc(&[
                    ("source_cluster", "proxy"),
                    ("destination_cluster", "override"),
                ]),
                desc(&[("foo", "f"), ("bar", "banned")]),
            ],
        )
    };
    let r = ok(&mut c, with_override()).await;
    assert_eq!(overall(&r), Code::Ok, "banned_limit replaced");
    assert_eq!(st(&r.statuses[0]), (Code::Ok, min(2), 1));
    assert_eq!(st(&r.statuses[1]), (Code::Ok, None, 0));
    let r = ok(&mut c, with_override()).await;
    assert_eq!(st(&r.statuses[0]), (Code::Ok, min(2), 0));
    let r = ok(&mut c, with_override()).await;
    assert_eq!(overall(&r), Code::OverLimit);
    // The shadow-mode descriptor: 3 per minute, never denies.
    for remaining in [2, 1, 0, 0, 0] {
        let r = ok(&mut c, one("rl", &[("foo", "f"), ("baz", "shady")])).await;
        assert_eq!(st(&r.statuses[0]), (Code::Ok, min(3), remaining));
    }
}

// --------------------------------------------------------------- deny cache

/// LOCAL_CACHE_SIZE_IN_BYTES: after a denial, calls on the denied key are
/// denied without reaching Redis, and counted as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_deny_cache_answers_without_redis() {
    let s = Single::start(
        Kind::Redis,
        &[("atom.yaml", ATOMIC)],
        &[("LOCAL_CACHE_SIZE_IN_BYTES", "1048576")],
    );
    settle(&s.server, 3600, 60);
    let mut c = s.rls.client().await;
    let narrow = || request("atom", vec![desc(&[("narrow", "cached")])]);
    assert_eq!(overall(&ok(&mut c, narrow()).await), Code::Ok);
    assert_eq!(overall(&ok(&mut c, narrow()).await), Code::OverLimit);
    let before = s.server.calls("rl.all");
    for _ in 0..5 {
        let r = ok(&mut c, narrow()).await;
        assert_eq!(
            st(&r.statuses[0]),
            (Code::OverLimit, Some((1, unit::HOUR)), 0)
        );
    }
    assert_eq!(s.server.calls("rl.all"), before, "the cache answered");
    let m = s.rls.metrics();
    let labels = [("domain", "atom"), ("key1", "narrow")];
    assert_eq!(
        m.sum(OVER_LIMIT_WITH_LOCAL_CACHE, &labels),
        5.0,
        "{}",
        m.text
    );
    // Another value of the key is another key: it reaches Redis.
    let r = ok(&mut c, request("atom", vec![desc(&[("narrow", "other")])])).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(s.server.calls("rl.all"), before + 1);
}

/// A shadow-mode descriptor never denies, but a request another descriptor
/// denies takes nothing from it either (its units are refunded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_takes_nothing_from_shadow_mode_descriptors() {
    let config = format!(
        "{ATOMIC}  - key: shadowed\n    shadow_mode: true\n    rate_limit:\n      unit: hour\n      requests_per_unit: 10\n"
    );
    let s = Single::start(Kind::Redis, &[("atom.yaml", &config)], &[]);
    settle(&s.server, 3600, 60);
    let mut c = s.rls.client().await;
    let both = || {
        request(
            "atom",
            vec![desc(&[("shadowed", "s")]), desc(&[("narrow", "n")])],
        )
    };
    let r = ok(&mut c, both()).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(st(&r.statuses[0]), (Code::Ok, Some((10, unit::HOUR)), 9));
    for i in 0..3 {
        let r = ok(&mut c, both()).await;
        assert_eq!(overall(&r), Code::OverLimit, "call {i}");
        let r = ok(
            &mut c,
            request("atom", vec![desc_hits(&[("shadowed", "s")], 0)]),
        )
        .await;
        assert_eq!(
            st(&r.statuses[0]),
            (Code::Ok, Some((10, unit::HOUR)), 9),
            "after denial {i}, the shadow-mode descriptor kept its count"
        );
    }
}
