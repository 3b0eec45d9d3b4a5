//! The tower layer in a real axum server, over real HTTP: the headers of
//! each algorithm on admitted and denied responses, the problem body, gRPC's
//! answer, rules checked at build, and what a key closure's panic or `None`
//! gives.

use std::time::Duration;

use redis_ratelimit_client::{
    retry_after, Attempt, Client, Error, Limiter, MissingKey, PolicyMode, RateLimitLayer,
    RetryPolicy, Rule, Spec, QUOTA_EXCEEDED,
};

use crate::harness::{by_user, serve, Http, Kind, Server};

async fn limiter(server: &Server) -> Limiter {
    let client = Client::standalone(&server.url()).await.unwrap();
    Limiter::builder(client)
        .deadline(Duration::from_secs(5))
        .build()
}

/// `t` or `r` of a `RateLimit` item.
fn param(field: &str, name: &str) -> u64 {
    field
        .split(';')
        .find_map(|p| p.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {field}"))
        .parse()
        .unwrap()
}

/// Two requests admitted, the third denied: the exact fields of one rule.
/// `late`: the sliding log's entries leave the window a millisecond late
/// (never early), and a hash window's bucket a bucket late, so their
/// `reset_ms` and `wait_ms` may round up to one more second.
async fn headers_of(
    server: &Server,
    rule: Rule,
    policy: &str,
    t_admitted: [u64; 2],
    t_denied: u64,
    retry: u64,
) {
    let late = u64::from(policy.starts_with("\"sl\"") || policy.starts_with("\"hw\""));
    let near = |got: u64, want: u64| got == want || got == want + late;
    let url = serve(
        by_user(limiter(server).await)
            .rule(rule)
            .build()
            .await
            .unwrap(),
    )
    .await;
    let http = Http::default();
    let user = format!("u{}", policy.len() * 7 + t_denied as usize);
    for (n, t) in t_admitted.iter().enumerate() {
        let r = http.get(&url, &[("x-user", &user)]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("ratelimit-policy"), Some(policy));
        let current = r.header("ratelimit").unwrap();
        assert_eq!(param(current, "r"), 1 - n as u64, "{policy}: {current}");
        if *t > 0 {
            assert!(near(param(current, "t"), *t), "{policy}: {current}");
        }
        assert!(r.header("retry-after").is_none());
    }
    let r = http.get(&url, &[("x-user", &user)]).await;
    assert_eq!(r.status, 429, "{policy}");
    assert_eq!(r.header("ratelimit-policy"), Some(policy));
    let current = r.header("ratelimit").unwrap();
    assert_eq!(param(current, "r"), 0, "{policy}: {current}");
    if t_denied > 0 {
        assert!(near(param(current, "t"), t_denied), "{policy}: {current}");
    }
    let retry_after: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(
        near(retry_after, retry),
        "{policy}: Retry-After {retry_after}"
    );
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body["type"], QUOTA_EXCEEDED);
    assert_eq!(body["status"], 429);
    let name = policy.split('"').nth(1).unwrap();
    assert_eq!(body["violated-policies"], serde_json::json!([name]));

    // The deny cache answers the next one: the same fields, Retry-After no later.
    let again = http.get(&url, &[("x-user", &user)]).await;
    assert_eq!(again.status, 429);
    assert_eq!(again.header("ratelimit-policy"), Some(policy));
    let later: u64 = again.header("retry-after").unwrap().parse().unwrap();
    assert!(
        later <= retry_after && later >= 1,
        "{later} after {retry_after}"
    );
}

#[tokio::test]
async fn each_algorithm_maps_to_the_ietf_fields_on_admitted_and_denied_responses() {
    let server = Server::start(Kind::Redis);
    // 2 tokens, one back per 30 s: w = ceil(2 * 30000 / 1 / 1000) = 60.
    headers_of(
        &server,
        Rule::token_bucket(2, 1, 30_000).name("tb"),
        "\"tb\";q=2;w=60",
        [30, 60],
        60,
        30,
    )
    .await;
    // A queue of 2 draining one per 10 s: w = 20; the third is queued too long.
    headers_of(
        &server,
        Rule::leaky_bucket(2, 1, 10_000).name("lb"),
        "\"lb\";q=2;w=20",
        [10, 20],
        20,
        10,
    )
    .await;
    // Exact sliding log of 2 per 20 s: the first unit leaves the window in 20 s.
    headers_of(
        &server,
        Rule::sliding(2, 20_000).name("sl"),
        "\"sl\";q=2;w=20",
        [20, 20],
        20,
        20,
    )
    .await;
    // A hash window of 2 per 60 s in 1 s buckets (its reset depends on where
    // in a bucket the call falls: not checked here).
    headers_of(
        &server,
        Rule::hash_window(2, 60_000, 1000).name("hw"),
        "\"hw\";q=2;w=60",
        [0, 0],
        0,
        60,
    )
    .await;
}

#[tokio::test]
async fn a_fixed_window_resets_at_its_boundary_and_retry_after_says_when() {
    let server = Server::start(Kind::Redis);
    let layer = by_user(limiter(&server).await)
        .rule(Rule::fixed_window(1, 3_600_000).name("hourly"))
        .x_ratelimit_headers(true)
        .build()
        .await
        .unwrap();
    let url = serve(layer).await;
    let http = Http::default();
    // The window is aligned to the hour: should an hour begin between the
    // two requests, the second is admitted in the new window. That is
    // right only if the first said its window was ending (its `t` covered
    // by the time between the requests); then a new user tries again.
    let mut users = ["f0", "f1", "f2"].into_iter();
    let denied = loop {
        let user = users.next().expect("a window turned over at every try");
        let sent = std::time::Instant::now();
        let ok = http.get(&url, &[("x-user", user)]).await;
        assert_eq!(ok.status, 200);
        assert_eq!(ok.header("ratelimit-policy"), Some("\"hourly\";q=1;w=3600"));
        assert_eq!(ok.header("x-ratelimit-limit"), Some("1"));
        assert_eq!(ok.header("x-ratelimit-remaining"), Some("0"));
        let second = http.get(&url, &[("x-user", user)]).await;
        if second.status == 429 {
            break second;
        }
        let t = param(ok.header("ratelimit").unwrap(), "t");
        assert!(
            t <= sent.elapsed().as_secs() + 1,
            "admitted again although the window had {t} s left"
        );
    };
    let t = param(denied.header("ratelimit").unwrap(), "t");
    assert!((1..=3600).contains(&t));
    // The window's end is both when it resets and when the request passes.
    assert_eq!(denied.header("retry-after"), Some(t.to_string().as_str()));
    assert_eq!(
        denied.header("x-ratelimit-reset"),
        Some(t.to_string().as_str())
    );
}

#[tokio::test]
async fn several_rules_go_through_one_rl_all_and_name_the_one_that_denied() {
    let server = Server::start(Kind::Redis);
    // A sliding window: a fixed one, aligned to the minute, would start
    // again should a minute begin during the test.
    let spec = Spec::parse("p", "SLIDING", &[3, 60_000]).unwrap();
    let client = Client::standalone(&server.url()).await.unwrap();
    client
        .policy_set("tenant=acme", &spec, PolicyMode::Enforce, 100)
        .await
        .unwrap();
    let layer = by_user(limiter(&server).await)
        .rule(Rule::sliding(2, 60_000).name("per-user").key_prefix("u:"))
        .rule(Rule::policy("tenant=acme").name("tenant").fixed_key("acme"))
        .build()
        .await
        .unwrap();
    let url = serve(layer).await;
    let http = Http::default();
    let policy = "\"per-user\";q=2;w=60, \"tenant\";q=3;w=60";
    let mut statuses = Vec::new();
    for user in ["a", "a", "a", "b", "c"] {
        let r = http.get(&url, &[("x-user", user)]).await;
        assert_eq!(r.header("ratelimit-policy"), Some(policy));
        statuses.push((r.status, r.body));
    }
    assert_eq!(
        statuses.iter().map(|s| s.0).collect::<Vec<_>>(),
        [200, 200, 429, 200, 429]
    );
    assert!(
        statuses[2].1.contains("[\"per-user\"]"),
        "{}",
        statuses[2].1
    );
    assert!(statuses[4].1.contains("[\"tenant\"]"), "{}", statuses[4].1);
    assert_eq!(server.calls("rl.all"), 5);
}

#[tokio::test]
async fn grpc_denials_are_resource_exhausted_with_the_fields_in_metadata() {
    let server = Server::start(Kind::Redis);
    let layer = by_user(limiter(&server).await)
        .rule(Rule::sliding(1, 60_000).name("rpc"))
        .grpc(true)
        .build()
        .await
        .unwrap();
    let url = serve(layer).await;
    let http = Http::default();
    assert_eq!(http.get(&url, &[("x-user", "g")]).await.status, 200);
    let r = http.get(&url, &[("x-user", "g")]).await;
    assert_eq!(r.status, 200, "gRPC carries its status in grpc-status");
    assert_eq!(r.header("content-type"), Some("application/grpc"));
    assert_eq!(r.header("grpc-status"), Some("8"));
    // 60 s, or 61 when the entry's millisecond leaves late.
    assert!(matches!(r.header("retry-after"), Some("60" | "61")));
    assert_eq!(r.header("ratelimit-policy"), Some("\"rpc\";q=1;w=60"));
    assert_eq!(r.header("violated-policies"), Some("rpc"));
    assert!(r.body.is_empty());
}

#[tokio::test]
async fn bad_rules_fail_when_the_layer_is_built_naming_the_parameter() {
    let server = Server::start(Kind::Redis);
    let cases = [
        (Rule::sliding(0, 1000).name("s"), "limit"),
        (Rule::token_bucket(5, 0, 1000).name("t"), "refill_count"),
        (Rule::hash_window(10, 1000, 300).name("h"), "bucket_ms"),
        (Rule::leaky_bucket(5, 1, 0).name("l"), "leak_ms"),
        (Rule::policy("no-such-policy"), "policy"),
        (Rule::policy("a b"), "policy name"),
        (Rule::policy("p").global(), "global"),
    ];
    for (rule, arg) in cases {
        let built = by_user(limiter(&server).await).rule(rule).build().await;
        match built {
            Err(Error::BadArgument { arg: got, .. }) => assert_eq!(got, arg),
            Err(other) => panic!("{arg}: {other}"),
            Ok(_) => panic!("{arg}: built"),
        }
    }
    let e = by_user(limiter(&server).await)
        .rule(Rule::sliding(0, 1000).name("per-user"))
        .build()
        .await
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        "rule \"per-user\": bad argument limit: limit must be an integer from 1 to 16777215"
    );
}

#[tokio::test]
async fn a_key_closure_that_panics_or_answers_none_has_a_documented_outcome() {
    let server = Server::start(Kind::Redis);
    let lim = limiter(&server).await;
    let layer = RateLimitLayer::builder(lim.clone())
        .key(
            |req| match req.headers.get("x-user").map(|v| v.as_bytes()) {
                Some(b"boom") => panic!("key closure bug"),
                Some(user) => Some(String::from_utf8_lossy(user).into_owned()),
                None => None,
            },
        )
        .rule(Rule::sliding(5, 1000))
        .build()
        .await
        .unwrap();
    let url = serve(layer).await;
    let http = Http::default();
    let none = http.get(&url, &[]).await;
    assert_eq!(none.status, 400);
    assert_eq!(
        none.header("content-type"),
        Some("application/problem+json")
    );
    let boom = http.get(&url, &[("x-user", "boom")]).await;
    assert_eq!(boom.status, 500);
    assert!(boom.body.contains("could not be computed"), "{}", boom.body);
    let stats = lim.stats();
    assert_eq!(
        (stats.key_missing, stats.key_panics, stats.redis_calls),
        (1, 1, 0)
    );

    let allow = RateLimitLayer::builder(lim)
        .key(|_| None)
        .rule(Rule::sliding(5, 1000))
        .on_missing_key(MissingKey::Allow)
        .build()
        .await
        .unwrap();
    let r = Http::default().get(&serve(allow).await, &[]).await;
    assert_eq!(r.status, 200);
    assert!(r.header("ratelimit").is_none());
}

#[tokio::test]
async fn a_policy_raised_in_the_server_applies_to_the_next_request() {
    let server = Server::start(Kind::Redis);
    let client = Client::standalone(&server.url()).await.unwrap();
    let one = Spec::parse("p", "SLIDING", &[1, 60_000]).unwrap();
    client
        .policy_set("GET:/items", &one, PolicyMode::Enforce, 100)
        .await
        .unwrap();
    let lim = Limiter::builder(client.clone())
        .deadline(Duration::from_secs(5))
        .deny_cache(false)
        .build();
    let url = serve(
        by_user(lim)
            .rule(Rule::policy("GET:/items"))
            .build()
            .await
            .unwrap(),
    )
    .await;
    let http = Http::default();
    assert_eq!(http.get(&url, &[("x-user", "p")]).await.status, 200);
    let denied = http.get(&url, &[("x-user", "p")]).await;
    assert_eq!(denied.status, 429);
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"GET:/items\";q=1;w=60")
    );
    let three = Spec::parse("p", "SLIDING", &[3, 60_000]).unwrap();
    client
        .policy_set("GET:/items", &three, PolicyMode::Enforce, 100)
        .await
        .unwrap();
    let r = http.get(&url, &[("x-user", "p")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(param(r.header("ratelimit").unwrap(), "r"), 1);
    assert_eq!(server.calls("rl.hit"), 3);
}

#[tokio::test]
async fn the_retry_helper_waits_for_retry_after_then_gets_through() {
    let server = Server::start(Kind::Redis);
    let lim = Limiter::builder(Client::standalone(&server.url()).await.unwrap())
        .deadline(Duration::from_secs(5))
        .build();
    let layer = by_user(lim).rule(Rule::sliding(1, 1000).name("one-per-second"));
    let url = serve(layer.build().await.unwrap()).await;
    let http = Http::default();
    assert_eq!(http.get(&url, &[("x-user", "r")]).await.status, 200);
    let start = std::time::Instant::now();
    let mut attempts = Vec::new();
    let last = RetryPolicy::default()
        .run(|n| {
            attempts.push(n);
            let (http, url) = (http.clone(), url.clone());
            async move {
                let r = http.get(&url, &[("x-user", "r")]).await;
                if r.status == 429 {
                    let wait = retry_after(&r.headers);
                    Attempt::Limited(r.status, wait)
                } else {
                    Attempt::Done(r.status)
                }
            }
        })
        .await;
    assert_eq!(last, 200);
    assert_eq!(
        attempts,
        [0, 1],
        "one 429, then through after the 1 s backoff"
    );
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "never earlier than Retry-After: 1"
    );
}
