//! Calendar quotas (`RL.QUOTA`) through the kit: the typed call in UTC, a
//! fixed offset and an IANA zone, checked arguments that name what is wrong
//! (and send nothing), quota policies (in a zone too) through `RL.HIT` and
//! `RL.ALL`, inline quotas in `RL.ALL`,
//! and a quota rule in the limiter and the tower layer (with its `w` of a
//! day, a global quota on the local level, and a zoned rule on its own).
//! Each test starts clear of the ends of the periods it counts in
//! ([`clear_of`]), so that none turns over while it runs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_ratelimit_client::{
    Client, Error, Limiter, Path, Period, PolicyMode, Request, Rule, RuleKind, Spec, Zone,
};

use crate::harness::{by_user, serve, Http, Kind, Server};

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Seconds from now to the end of the day (or ISO week) that contains now,
/// at `offset_s` east of UTC.
fn to_end(period: Period, offset_s: i64) -> i64 {
    let local = now_s() + offset_s;
    let day = local.div_euclid(86_400);
    let next = match period {
        Period::Day => day + 1,
        Period::Week => day + 7 - (day + 3).rem_euclid(7),
        _ => unreachable!("days and weeks only here"),
    };
    next * 86_400 - offset_s - now_s()
}

/// The least time between the start of a test and the end of a period it
/// counts in: a test's spans are seconds, even on a loaded host.
const CLEAR_S: i64 = 60;

/// Polls the clock while the end of one of `periods` (each at its offset
/// east of UTC) is less than [`CLEAR_S`] away, so that no period the test
/// counts in turns over during it (the days and weeks; months and years are
/// only checked against their longest length). At most a minute, and only
/// near a day's end somewhere.
async fn clear_of(periods: &[(Period, i64)]) {
    while periods
        .iter()
        .any(|&(p, offset)| to_end(p, offset) < CLEAR_S)
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `got_ms` is the time to one of the `ends` (seconds), within the clock's
/// second and the call's rounding up.
fn near_end(got_ms: u64, ends: &[i64]) -> bool {
    let got = got_ms as i64;
    ends.iter()
        .any(|e| got >= (e - 2) * 1000 && got <= (e + 1) * 1000)
}

async fn client_of(server: &Server) -> Client {
    Client::standalone(&server.url())
        .await
        .unwrap()
        .with_deadline(Duration::from_secs(5))
}

#[tokio::test]
async fn the_typed_call_counts_per_calendar_period_in_a_zone() {
    let server = Server::start(Kind::Redis);
    let client = client_of(&server).await;
    // UTC, +05:30, and New York's weeks in winter and in summer time.
    clear_of(&[
        (Period::Day, 0),
        (Period::Day, 19_800),
        (Period::Week, -5 * 3600),
        (Period::Week, -4 * 3600),
    ])
    .await;

    // UTC by default: 3 a day.
    let d = client
        .quota("q:utc", 3, Period::Day, None, Request::Cost(2))
        .await
        .unwrap();
    assert_eq!(
        (d.allowed, d.limit, d.remaining, d.wait_ms),
        (true, 3, 1, 0)
    );
    assert!(near_end(d.reset_ms(), &[to_end(Period::Day, 0)]), "{d:?}");
    // Denied until the next day starts.
    let d = client
        .quota("q:utc", 3, Period::Day, None, Request::Cost(2))
        .await
        .unwrap();
    assert!(!d.allowed && d.remaining == 1, "{d:?}");
    assert!(
        near_end(d.wait_ms as u64, &[to_end(Period::Day, 0)]),
        "{d:?}"
    );
    assert_eq!(d.retry_after, Duration::from_millis(d.wait_ms as u64));
    // The key's TTL is the end of the period.
    let ttl: i64 = redis::cmd("PTTL")
        .arg("q:utc")
        .query(&mut server.conn())
        .unwrap();
    assert!(near_end(ttl as u64, &[to_end(Period::Day, 0)]), "{ttl}");

    // More than the limit can never pass; a refund gives units back.
    let d = client
        .quota("q:utc", 3, Period::Day, None, Request::Cost(4))
        .await
        .unwrap();
    assert!(d.never(), "{d:?}");
    let d = client
        .quota("q:utc", 3, Period::Day, None, Request::Refund(2))
        .await
        .unwrap();
    assert!(d.allowed && d.remaining == 3, "{d:?}");

    // A fixed offset and an IANA zone (New York is 5 hours behind UTC in
    // winter, 4 in summer).
    let d = client
        .quota("q:ist", 10, Period::Day, Some("+05:30"), Request::Cost(1))
        .await
        .unwrap();
    assert!(d.allowed && d.remaining == 9);
    assert!(
        near_end(d.reset_ms(), &[to_end(Period::Day, 19_800)]),
        "{d:?}"
    );
    let d = client
        .quota(
            "q:ny",
            10,
            Period::Week,
            Some("America/New_York"),
            Request::Cost(1),
        )
        .await
        .unwrap();
    assert!(d.allowed && d.remaining == 9);
    let ny = [
        to_end(Period::Week, -5 * 3600),
        to_end(Period::Week, -4 * 3600),
    ];
    assert!(near_end(d.reset_ms(), &ny), "{d:?}");
    // Months and years: the end is within their longest length.
    for (period, days) in [(Period::Month, 31), (Period::Year, 366)] {
        let d = client
            .quota("q:long", 5, period, Some("utc"), Request::Cost(0))
            .await
            .unwrap();
        assert!(d.allowed && d.remaining == 5, "{d:?}");
        let d = client
            .quota(&format!("q:{days}"), 5, period, None, Request::Cost(1))
            .await
            .unwrap();
        assert!(d.reset_after <= Duration::from_secs(days * 86_400), "{d:?}");
    }
}

#[tokio::test]
async fn bad_limits_and_zones_are_refused_before_sending_naming_the_argument() {
    let server = Server::start(Kind::Valkey);
    let client = client_of(&server).await;
    let bad = |r: Result<_, Error>| match r {
        Err(Error::BadArgument { arg, reason, .. }) => (arg, reason),
        other => panic!("{other:?}"),
    };
    let (arg, _) = bad(client
        .quota("q", 0, Period::Day, None, Request::Cost(1))
        .await);
    assert_eq!(arg, "limit");
    for zone in [
        "+26:00",
        "+05:60",
        "05:30",
        "",
        "../etc/passwd",
        "/etc/localtime",
        "Europe/Par is",
    ] {
        let (arg, reason) = bad(client
            .quota("q", 5, Period::Day, Some(zone), Request::Cost(1))
            .await);
        assert_eq!(arg, "zone", "{zone:?}");
        assert!(
            reason.contains("TZ must be UTC, a fixed offset"),
            "{reason}"
        );
    }
    assert_eq!(server.calls("rl.quota"), 0, "nothing was sent");
    // A well-formed name the server does not know: the server's error.
    match client
        .quota(
            "q",
            5,
            Period::Day,
            Some("Mars/Olympus_Mons"),
            Request::Cost(1),
        )
        .await
    {
        Err(Error::Server(msg)) => assert!(msg.contains("TZ must be UTC"), "{msg}"),
        other => panic!("{other:?}"),
    }
    // Periods are typed; from words (a policy's, a configuration's) they are checked.
    assert_eq!(
        redis_ratelimit_client::parse_period("month").unwrap(),
        Period::Month
    );
    let Err(Error::BadArgument { arg, reason, .. }) =
        redis_ratelimit_client::parse_period("fortnight")
    else {
        panic!("fortnight is no period")
    };
    assert_eq!(arg, "period");
    assert!(reason.contains("DAY, WEEK, MONTH, YEAR"), "{reason}");
    // A rule with a bad zone fails its check, named after the rule.
    let rule = Rule::quota_in(5, Period::Day, "Nowhere/../x").name("daily");
    match rule.check() {
        Err(Error::BadArgument { rule, arg, .. }) => {
            assert_eq!((rule.as_str(), arg.as_str()), ("daily", "zone"))
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn quota_policies_go_through_rl_hit_and_quotas_through_rl_all() {
    let server = Server::start(Kind::Redis);
    let client = client_of(&server).await;
    clear_of(&[(Period::Day, 0), (Period::Day, 9 * 3600), (Period::Week, 0)]).await;
    let spec = Spec::quota(2, Period::Day, None).unwrap();
    client
        .policy_set("daily", &spec, PolicyMode::Enforce, 100)
        .await
        .unwrap();
    let info = client.policy_get("daily").await.unwrap().unwrap();
    assert_eq!(info.spec, Some(spec), "{info:?}");
    assert_eq!(info.spec.unwrap().args(), ["2", "DAY"]);
    for remaining in [1, 0] {
        let d = client.hit("daily", "u1", Request::Cost(1)).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, remaining));
    }
    let d = client.hit("daily", "u1", Request::Cost(1)).await.unwrap();
    assert!(!d.allowed);
    assert!(
        near_end(d.wait_ms as u64, &[to_end(Period::Day, 0)]),
        "{d:?}"
    );
    // A policy keeps its zone (TZ among its options): RL.HIT counts in it.
    let zoned = Spec::quota(2, Period::Day, Some("Asia/Tokyo")).unwrap();
    client
        .policy_set("tokyo", &zoned, PolicyMode::Enforce, 100)
        .await
        .unwrap();
    let info = client.policy_get("tokyo").await.unwrap().unwrap();
    assert_eq!(info.spec, Some(zoned), "{info:?}");
    let d = client.hit("tokyo", "t1", Request::Cost(2)).await.unwrap();
    assert!(d.allowed);
    assert!(
        near_end(d.reset_ms(), &[to_end(Period::Day, 9 * 3600)]),
        "{d:?}"
    );

    // RL.ALL: a weekly quota inline, beside a sliding window and the policy.
    let weekly = RuleKind::Inline(Spec::quota(3, Period::Week, None).unwrap());
    let sliding = RuleKind::Inline(Spec::parse("s", "SLIDING", &[10, 60_000]).unwrap());
    let daily = RuleKind::Policy("daily".into());
    let d = client
        .all(&[("a:w", &weekly), ("a:s", &sliding)], 3)
        .await
        .unwrap();
    assert!(d.allowed && d.remaining == 0, "{d:?}");
    let d = client
        .all(&[("a:s", &sliding), ("a:w", &weekly)], 1)
        .await
        .unwrap();
    assert_eq!((d.allowed, d.denied_by), (false, Some(1)));
    assert!(
        near_end(d.wait_ms as u64, &[to_end(Period::Week, 0)]),
        "{d:?}"
    );
    let d = client
        .all(&[("a:s", &sliding), ("u1", &daily)], 1)
        .await
        .unwrap();
    assert_eq!((d.allowed, d.denied_by), (false, Some(1)));
    // The zoned policy in RL.ALL counts in its zone; an inline zoned quota
    // is refused there (inline specs count in UTC).
    let tokyo = RuleKind::Policy("tokyo".into());
    let d = client
        .all(&[("a:s", &sliding), ("t1", &tokyo)], 1)
        .await
        .unwrap();
    assert_eq!((d.allowed, d.denied_by), (false, Some(1)));
    assert!(
        near_end(d.wait_ms as u64, &[to_end(Period::Day, 9 * 3600)]),
        "{d:?}"
    );
    let inline = RuleKind::Inline(zoned);
    match client.all(&[("a:t", &inline), ("a:s", &sliding)], 1).await {
        Err(Error::BadArgument { arg, .. }) => assert_eq!(arg, "zone"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_quota_rule_in_the_layer_answers_429_until_the_period_ends() {
    let server = Server::start(Kind::Redis);
    let limiter = |local: bool| {
        let url = server.url();
        async move {
            let client = Client::standalone(&url).await.unwrap();
            Limiter::builder(client)
                .deadline(Duration::from_secs(5))
                .local_level(local)
                .build()
        }
    };
    let http = Http::default();

    // UTC's days, and Paris's weeks in winter and in summer time.
    clear_of(&[
        (Period::Day, 0),
        (Period::Week, 3600),
        (Period::Week, 2 * 3600),
    ])
    .await;

    // A daily quota per user and a sliding window: one RL.ALL; w = 86400.
    let url = serve(
        by_user(limiter(false).await)
            .rule(Rule::quota(2, Period::Day).name("daily"))
            .rule(Rule::sliding(100, 1000).name("burst"))
            .build()
            .await
            .unwrap(),
    )
    .await;
    for _ in 0..2 {
        let r = http.get(&url, &[("x-user", "ann")]).await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("\"daily\";q=2;w=86400, \"burst\";q=100;w=1")
        );
    }
    let r = http.get(&url, &[("x-user", "ann")]).await;
    assert_eq!(r.status, 429);
    let retry: i64 = r.header("retry-after").unwrap().parse().unwrap();
    let end = to_end(Period::Day, 0);
    assert!(
        retry >= end - 2 && retry <= end + 1,
        "Retry-After {retry}, end {end}"
    );
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body["violated-policies"], serde_json::json!(["daily"]));
    assert_eq!(http.get(&url, &[("x-user", "bob")]).await.status, 200);

    // A zoned quota on its own: RL.QUOTA ... TZ, with w of a week.
    let url = serve(
        by_user(limiter(false).await)
            .rule(
                Rule::quota_in(1, Period::Week, "Europe/Paris")
                    .name("weekly")
                    .key_prefix("rl:weekly:"),
            )
            .build()
            .await
            .unwrap(),
    )
    .await;
    let r = http.get(&url, &[("x-user", "ann")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"weekly\";q=1;w=604800")
    );
    assert_eq!(http.get(&url, &[("x-user", "ann")]).await.status, 429);
    assert!(server.calls("rl.quota") >= 2);

    // Beside another rule it would need RL.ALL, which counts in UTC: refused at build.
    let built = by_user(limiter(false).await)
        .rule(Rule::quota_in(1, Period::Week, "Europe/Paris").name("weekly"))
        .rule(Rule::sliding(100, 1000).name("burst"))
        .build()
        .await;
    assert!(
        matches!(built, Err(Error::BadArgument { ref arg, .. }) if arg == "zone"),
        "{:?}",
        built.err()
    );
}

#[tokio::test]
async fn a_global_quota_takes_its_share_on_the_local_level() {
    let server = Server::start(Kind::Valkey);
    let client = Client::standalone(&server.url()).await.unwrap();
    // 10 a day over 5 instances: ceil(10 * 1.1 / 5) = 3 locally.
    clear_of(&[(Period::Day, 9 * 3600)]).await;
    let limiter = Limiter::builder(client)
        .deadline(Duration::from_secs(5))
        .local_level(true)
        .instances(5)
        .build();
    let set = limiter
        .rule_set(vec![Rule::quota_in(10, Period::Day, "+09:00")
            .name("daily")
            .fixed_key("q:global")
            .global()])
        .await
        .unwrap();
    for _ in 0..3 {
        assert!(limiter.check(&set, "x", 1).await.allowed);
    }
    let d = limiter.check(&set, "x", 1).await;
    assert!(!d.allowed && d.path == Path::Local, "{d:?}");
    assert!(
        near_end(d.wait_ms as u64, &[to_end(Period::Day, 9 * 3600)]),
        "{d:?}"
    );
    assert_eq!(
        server.calls("rl.quota"),
        3,
        "the local denial never reached Redis"
    );

    // A named zone cannot be global: the local level reads no tz database.
    let err = limiter
        .rule_set(vec![
            Rule::quota_in(10, Period::Day, "Asia/Kolkata").global()
        ])
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::BadArgument { ref arg, .. } if arg == "zone"),
        "{err}"
    );
    assert!(Zone::new("+1:00")
        .unwrap_err()
        .to_string()
        .contains("bad argument zone"));
    assert_eq!(Zone::new("z").unwrap(), Zone::UTC);
}
