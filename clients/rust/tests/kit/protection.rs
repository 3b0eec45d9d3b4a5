//! The protection loop end to end: two instances of the example service
//! (real processes, real HTTP) share one redis-server; the policies' scale
//! and stage move with their errors and denials, on both instances, on a
//! replica, and back; non-core routes degrade without a Redis call; a
//! policy at stage 2 forces the named breaker open; outcome reports never
//! hold a request and a lost one is not retried. And the loop alone: its
//! counters, its error predicate, and every master of a cluster read.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use redis_ratelimit_client::{
    Client, Finished, Limiter, PolicyMode, PolicyProtection, PolicyStats, Protection,
    RateLimitLayer, Rule, Spec,
};

use crate::harness::{wait_for, wait_until, Cluster, Http, Kind, Server, Service};

fn cmd(server: &Server, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(&mut server.conn())
}

fn set_policy(server: &Server, spec: &str) {
    let mut args = vec!["RL.POLICY", "SET"];
    args.extend(spec.split_whitespace());
    cmd(server, &args).unwrap_or_else(|e| panic!("{spec}: {e}"));
}

/// `RL.POLICY STATS name` of one server.
fn stats(server: &Server, name: &str) -> Option<(u64, u64)> {
    let reply = cmd(server, &["RL.POLICY", "STATS", name]).ok()?;
    let redis::Value::Array(items) = reply else {
        return None;
    };
    let field = |want: &str| {
        items.chunks(2).find_map(|p| match p {
            [redis::Value::BulkString(k), redis::Value::Int(v)] if k == want.as_bytes() => {
                Some(*v as u64)
            }
            _ => None,
        })
    };
    Some((field("scale")?, field("stage")?))
}

/// The two instances of the example service with the loop on `policy`.
fn two_services(server: &Server, policy: &str, extra: &[(&str, String)]) -> [Service; 2] {
    let env = |_| {
        let mut env = vec![
            ("RL_URL", server.url()),
            ("RL_POLICY", policy.to_string()),
            ("RL_INSTANCES", "2".into()),
            ("RL_DEADLINE_MS", "2000".into()),
            ("RL_REPORT_MS", "200".into()),
            ("RL_POLL_MS", "200".into()),
            ("RL_HOLD_MS", "1500".into()),
            ("RL_PREFIX", format!("{policy}:")),
        ];
        env.extend(extra.iter().cloned());
        Service::start(&env)
    };
    [env(0), env(1)]
}

/// An instance's view of the loop (`GET /protection`).
async fn view(http: &Http, service: &Service) -> serde_json::Value {
    let body = http.get(&service.url("/protection"), &[]).await.body;
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{body}: {e}"))
}

/// Requests to `/api` on both instances until stopped, each from one of
/// 50 users; the number sent.
fn traffic(
    http: &Http,
    services: &[Service; 2],
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    let urls = [services[0].url("/api"), services[1].url("/api")];
    let http = http.clone();
    tokio::spawn(async move {
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let user = format!("u{}", n % 50);
            let r = http
                .get(&urls[(n % 2) as usize], &[("x-user", &user)])
                .await;
            assert!(matches!(r.status, 200 | 500), "{} {}", r.status, r.body);
            n += 1;
        }
        n
    })
}

/// Adapt: the backend behind both instances fails 10% of requests; with
/// `ADAPT ERRORS 5 MIN 80` the policy's scale drops to 80 (seen by both
/// instances and on a replica), then climbs back by RECOVER per window
/// once the failures stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_percent_errors_scale_the_policy_to_80_on_both_instances_and_the_replica() {
    let server = Server::start(Kind::Redis);
    let replica = Server::replica_of(&server, Kind::Redis);
    set_policy(
        &server,
        "adapt TOKENBUCKET 100000 100000 1000 ADAPT ERRORS 5 MIN 80 RECOVER 5 WINDOW 1000 MINCALLS 20",
    );
    let services = two_services(&server, "adapt", &[("RL_FAIL_EVERY", "10".into())]);
    let http = Http::default();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = traffic(&http, &services, stop.clone());

    for s in &services {
        wait_for("the scale at 80 on the instance", async || {
            view(&http, s).await["scale"] == 80
        })
        .await;
    }
    // The server's windows: about 10% errors, the scale at its MIN.
    let (scale, _) = stats(&server, "adapt").unwrap();
    assert_eq!(scale, 80);
    wait_until("the replica at scale 80", || {
        stats(&replica, "adapt").is_some_and(|(scale, _)| scale == 80)
    });

    // The failures stop: +5 per window back to 100, on both.
    for s in &services {
        http.get(&s.url("/control?fail_every=0"), &[]).await;
    }
    let mut seen = Vec::new();
    wait_for("the scale back at 100 on both instances", async || {
        let a = view(&http, &services[0]).await["scale"].as_u64().unwrap();
        let b = view(&http, &services[1]).await["scale"].as_u64().unwrap();
        if seen.last() != Some(&a) {
            seen.push(a);
        }
        a == 100 && b == 100
    })
    .await;
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]) && seen.iter().all(|s| *s >= 80),
        "the scale climbs back step by step: {seen:?}"
    );
    assert!(seen.len() >= 3, "by RECOVER 5 per window: {seen:?}");
    wait_until("the replica back at 100", || {
        stats(&replica, "adapt").is_some_and(|(scale, _)| scale == 100)
    });
    stop.store(true, Ordering::Relaxed);
    assert!(sent.await.unwrap() > 40);
    for s in &services {
        let v = view(&http, s).await;
        assert_eq!(v["reports_failed"], 0, "{v}");
        assert_eq!(v["breaker"], "closed", "{v}");
    }
}

/// Stages: a flood with 40% denials moves the policy to stage 1 (the
/// non-core route answers its degrade handler without a call to Redis),
/// 80% to stage 2 (the breaker the rule names is forced open); when the
/// flood stops the stage steps down one per window and the breaker closes.
/// The deny ratio is set by the keys, not the rate: the policy admits one
/// request per key per minute, so a used key is denied and a fresh one
/// admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_degrades_then_breaks_and_both_step_back_one_window_at_a_time() {
    let server = Server::start(Kind::Redis);
    // The typed call: STAGES 30 50 WINDOW 1000, checked before sending.
    Client::standalone(&server.url())
        .await
        .unwrap()
        .policy_set_protected(
            "stages",
            &Spec::parse("stages", "TOKENBUCKET", &[1, 1, 60000]).unwrap(),
            PolicyMode::Enforce,
            100,
            &PolicyProtection {
                stages: Some((30, 50)),
                window_ms: Some(1000),
                ..PolicyProtection::default()
            },
        )
        .await
        .unwrap();
    // The deny cache on (the default): the hot key's denials are answered
    // mostly in process, and reach the server as RL.OUTCOME ... DENIED n.
    let services = two_services(&server, "stages", &[]);
    let http = Http::default();
    let denied_of_ten = Arc::new(AtomicU64::new(4));
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let (http, stop, denied_of_ten) = (http.clone(), stop.clone(), denied_of_ten.clone());
        let urls = [services[0].url("/api"), services[1].url("/api")];
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let denied = n % 10 < denied_of_ten.load(Ordering::Relaxed);
                let user = if denied {
                    "hot".to_string()
                } else {
                    format!("fresh{n}")
                };
                http.get(&urls[(n % 2) as usize], &[("x-user", &user)])
                    .await;
                n += 1;
            }
        })
    };

    for s in &services {
        wait_for("stage 1 on the instance", async || {
            view(&http, s).await["stage"] == 1
        })
        .await;
    }
    // Stage 1: the non-core route degrades, without a call to Redis.
    for s in &services {
        let before = view(&http, s).await["extra_redis_calls"].clone();
        let r = http.get(&s.url("/extra"), &[("x-user", "someone")]).await;
        let after = view(&http, s).await;
        if after["stage"] == 0 {
            continue; // a window with fewer denials passed meanwhile
        }
        assert_eq!((r.status, r.body.as_str()), (200, "cached\n"));
        assert!(r.header("x-degraded").unwrap().starts_with("stage-"));
        assert_eq!(after["extra_redis_calls"], before, "no call to Redis");
        assert_ne!(after["breaker"], "forced_open", "{after}");
    }

    // 80% denied: stage 2, the breaker forced open on both instances.
    denied_of_ten.store(8, Ordering::Relaxed);
    for s in &services {
        wait_for("stage 2 and the breaker open", async || {
            let v = view(&http, s).await;
            v["stage"] == 2 && v["breaker"] == "forced_open"
        })
        .await;
    }
    stop.store(true, Ordering::Relaxed);
    flood.await.unwrap();
    // The flood's denials were answered mostly from the deny cache: the
    // stages saw them through DENIED.
    for s in &services {
        let v = view(&http, s).await;
        let (hits, redis) = (
            v["deny_cache_hits"].as_u64().unwrap(),
            v["redis_denied"].as_u64().unwrap(),
        );
        assert!(hits > redis, "mostly from the deny cache: {v}");
        assert!(v["denied_sent"].as_u64().unwrap() > 0, "{v}");
    }
    let r = http
        .get(&services[0].url("/api"), &[("x-user", "new-one")])
        .await;
    if view(&http, &services[0]).await["stage"] == 2 {
        assert_eq!(
            (r.status, r.body.as_str()),
            (503, "downstream breaker open")
        );
    }

    // No flood: one step down per window, the breaker released below 2.
    let mut steps: Vec<u64> = vec![2];
    wait_for("stage 0 on the first instance", async || {
        let v = view(&http, &services[0]).await;
        let stage = v["stage"].as_u64().unwrap();
        if steps.last() != Some(&stage) {
            steps.push(stage);
        }
        if stage < 2 {
            assert_eq!(v["breaker"], "closed", "{v}");
        }
        stage == 0
    })
    .await;
    assert_eq!(steps, [2, 1, 0], "one step per window");
    wait_for("stage 0 on the second instance", async || {
        let v = view(&http, &services[1]).await;
        v["stage"] == 0 && v["breaker"] == "closed"
    })
    .await;
    let r = http
        .get(&services[0].url("/extra"), &[("x-user", "later")])
        .await;
    assert_eq!((r.status, r.body.as_str()), (200, "extra\n"));
}

/// A denial on a route with a degrade handler answers with the handler,
/// not 429; a route without one answers 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_on_a_route_with_a_degrade_handler_gets_the_handler_answer() {
    let server = Server::start(Kind::Redis);
    set_policy(&server, "deny TOKENBUCKET 1 1 60000");
    let [service, _] = two_services(&server, "deny", &[]);
    let http = Http::default();
    let first = http.get(&service.url("/extra"), &[("x-user", "x")]).await;
    assert_eq!((first.status, first.body.as_str()), (200, "extra\n"));
    for _ in 0..2 {
        let denied = http.get(&service.url("/extra"), &[("x-user", "x")]).await;
        assert_eq!((denied.status, denied.body.as_str()), (200, "cached\n"));
        assert_eq!(denied.header("x-degraded"), Some("denied"));
    }
    http.get(&service.url("/api"), &[("x-user", "y")]).await;
    let denied = http.get(&service.url("/api"), &[("x-user", "y")]).await;
    assert_eq!(denied.status, 429);
}

/// Redis down: requests still answer (the limiter's fallback decides), the
/// stage falls back to 0 after the hold (the breaker is released), the
/// counts of failed reports are lost rather than kept; Redis back: reports
/// and reads resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_requests_answer_counts_are_dropped_and_reports_resume_after() {
    let mut server = Server::start(Kind::Redis);
    let policy = "down TOKENBUCKET 1 1 60000 STAGES 0 0 WINDOW 3000";
    set_policy(&server, policy);
    let services = two_services(&server, "down", &[]);
    let http = Http::default();
    for n in 0..2 {
        let s = &services[n % 2];
        http.get(&s.url("/api"), &[("x-user", "a")]).await;
        http.get(&s.url("/api"), &[("x-user", "a")]).await;
    }
    for s in &services {
        wait_for("stage 2 on the instance", async || {
            let v = view(&http, s).await;
            v["stage"] == 2 && v["breaker"] == "forced_open"
        })
        .await;
    }

    server.kill9();
    for s in &services {
        wait_for("the stage held, then 0", async || {
            let v = view(&http, s).await;
            v["stage"] == 0 && v["breaker"] == "closed"
        })
        .await;
    }
    for n in 0..100 {
        let s = &services[n % 2];
        let r = http
            .get(&s.url("/api"), &[("x-user", &format!("f{n}"))])
            .await;
        assert_eq!(r.status, 200, "the fallback admits a fresh key: {}", r.body);
    }
    for s in &services {
        wait_for("the counts reported and lost, none kept", async || {
            let v = view(&http, s).await;
            v["outcomes_pending"] == 0 && v["outcomes_lost"].as_u64() >= Some(50)
        })
        .await;
        let v = view(&http, s).await;
        assert!(v["reports_failed"].as_u64().unwrap() >= 1, "{v}");
    }

    server.restart();
    set_policy(&server, policy);
    let before: Vec<u64> = {
        let mut out = Vec::new();
        for s in &services {
            out.push(view(&http, s).await["reports_sent"].as_u64().unwrap());
        }
        out
    };
    let stop = Arc::new(AtomicBool::new(false));
    let users = Arc::new(AtomicU64::new(0));
    let load = {
        let (http, stop, users) = (http.clone(), stop.clone(), users.clone());
        let urls = [services[0].url("/api"), services[1].url("/api")];
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let n = users.fetch_add(1, Ordering::Relaxed);
                http.get(&urls[(n % 2) as usize], &[("x-user", &format!("g{n}"))])
                    .await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    for (s, before) in services.iter().zip(before) {
        wait_for("reports sent again", async || {
            view(&http, s).await["reports_sent"].as_u64().unwrap() > before
        })
        .await;
    }
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    let reply = Client::standalone(&server.url())
        .await
        .unwrap()
        .policy_stats("down")
        .await
        .unwrap();
    assert!(reply[0].current.ok + reply[0].last.ok > 0, "{reply:?}");
}

/// The loop alone, in process: counts leave once per interval and are
/// forgotten; the layer counts an admitted request's outcome with the
/// default predicate (a 5xx, a timeout) or the application's.
/// A stage hold no longer than the poll would drop every read before the
/// next: refused naming `stage_hold`, as in every kit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_hold_no_longer_than_the_poll_is_refused_naming_it() {
    let server = Server::start(Kind::Redis);
    let client = Client::standalone(&server.url()).await.unwrap();
    for (poll, hold) in [(5000, 5000), (1000, 500)] {
        let refused = Protection::builder(client.clone())
            .stage_poll(Duration::from_millis(poll))
            .stage_hold(Duration::from_millis(hold))
            .start()
            .err()
            .expect("refused");
        assert!(
            matches!(&refused, redis_ratelimit_client::Error::BadArgument { arg, .. } if arg == "stage_hold"),
            "{refused:?}"
        );
    }
    // The defaults (1 s poll, 5 s hold) start.
    let loop_ = Protection::builder(client).start().expect("the defaults");
    loop_.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_counts_outcomes_by_its_predicate_and_the_loop_sends_them_once() {
    let server = Server::start(Kind::Redis);
    set_policy(
        &server,
        "plain TOKENBUCKET 1000 1000 1000 STAGES 100 100 WINDOW 60000",
    );
    set_policy(
        &server,
        "lenient TOKENBUCKET 1000 1000 1000 STAGES 100 100 WINDOW 60000",
    );
    let client = Client::standalone(&server.url()).await.unwrap();
    let protection = Protection::builder(client.clone())
        .report_interval(Duration::from_millis(100))
        .stage_poll(Duration::from_millis(100))
        .start()
        .expect("the loop's options");
    let limiter = Limiter::builder(client.clone())
        .deadline(Duration::from_secs(2))
        .build();
    let layer = |policy: &str| {
        RateLimitLayer::builder(limiter.clone())
            .key(|_| Some("k".into()))
            .rule(Rule::policy(policy))
            .protection(protection.clone())
            .handler_timeout(Duration::from_millis(100))
    };
    let plain = layer("plain").build().await.unwrap();
    let lenient = layer("lenient")
        .error_when(|f| matches!(f, Finished::Status(s) if *s == StatusCode::NOT_FOUND))
        .build()
        .await
        .unwrap();
    let routes = || {
        Router::new()
            .route("/ok", get(|| async { "ok" }))
            .route(
                "/fail",
                get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "no") }),
            )
            .route("/missing", get(|| async { (StatusCode::NOT_FOUND, "no") }))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    "late"
                }),
            )
    };
    let app = Router::new()
        .nest("/plain", routes().layer(plain))
        .nest("/lenient", routes().layer(lenient));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = Http::default();
    for (path, status) in [
        ("ok", 200),
        ("ok", 200),
        ("fail", 500),
        ("missing", 404),
        ("slow", 504),
    ] {
        for policy in ["plain", "lenient"] {
            let r = http
                .get(&format!("http://{addr}/{policy}/{path}"), &[])
                .await;
            assert_eq!(r.status, status, "{policy}/{path}");
        }
    }
    let current = async |policy: &str| {
        let masters: Vec<PolicyStats> = client.policy_stats(policy).await.unwrap();
        assert_eq!(masters.len(), 1);
        (masters[0].current.ok, masters[0].current.errors)
    };
    wait_for("the outcomes on the server", async || {
        (current("plain").await, current("lenient").await) == ((3, 2), (4, 1))
    })
    .await;
    let sent = protection.stats();
    assert_eq!(
        (sent.outcomes_sent, sent.outcomes_pending),
        (10, 0),
        "{sent:?}"
    );
    // Nothing new: nothing sent, the counts stay.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(protection.stats().reports_sent, sent.reports_sent);
    assert_eq!(current("plain").await, (3, 2));

    // record() counts in memory; close() sends what is left, once.
    protection.record("plain", false);
    protection.record("plain", true);
    protection.record("plain", true);
    protection.close().await;
    assert_eq!(current("plain").await, (4, 4));
    assert_eq!(protection.stats().outcomes_pending, 0);
    protection.record("plain", false);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(current("plain").await, (4, 4), "closed: nothing more sent");
}

/// Every master of a cluster is read: the highest stage and the lowest
/// scale win, though one master alone has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_highest_stage_and_lowest_scale_of_every_master_win() {
    let cluster = Cluster::start(Kind::Redis);
    let masters = &cluster.nodes[..3];
    for m in masters {
        set_policy(m, "spread TOKENBUCKET 1 1 60000 STAGES 0 0 WINDOW 3000");
    }
    cmd(&masters[1], &["RL.POLICY", "SCALE", "spread", "60"]).unwrap();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let client = Client::cluster(&nodes).await.unwrap();
    assert_eq!(client.policy_stats("spread").await.unwrap().len(), 3);
    let protection = Protection::builder(client)
        .policy("spread")
        .stage_poll(Duration::from_millis(50))
        .start()
        .expect("the loop's options");
    wait_for("the lowest scale", async || {
        protection.scale("spread") == 60
    })
    .await;
    assert_eq!(protection.stage("spread"), 0);

    // Denials on master 2 alone (a key of its slots, twice).
    let key = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| cmd(&masters[2], &["RL.HIT", "spread", k]).is_ok())
        .unwrap();
    cmd(&masters[2], &["RL.HIT", "spread", &key]).unwrap();
    let breaker = protection.breaker("down", "spread");
    wait_for("stage 2 from master 2", async || {
        protection.stage("spread") == 2
    })
    .await;
    let stages: Vec<u64> = masters
        .iter()
        .map(|m| stats(m, "spread").unwrap().1)
        .collect();
    assert_eq!(stages.iter().filter(|&&s| s == 0).count(), 2, "{stages:?}");
    wait_until("the breaker forced open", || {
        breaker.state() == redis_ratelimit_client::BreakerState::ForcedOpen
    });
    assert_eq!(protection.scale("spread"), 60);
    protection.close().await;
}

/// The local-only fallback runs a policy at the scale the loop last read:
/// with Redis down, a policy of 10 at scale 50 admits 5 per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_only_fallback_runs_a_policy_at_its_last_scale() {
    let mut server = Server::start(Kind::Redis);
    set_policy(&server, "halved TOKENBUCKET 10 10 60000");
    cmd(&server, &["RL.POLICY", "SCALE", "halved", "50"]).unwrap();
    let client = Client::standalone(&server.url()).await.unwrap();
    let protection = Protection::builder(client.clone())
        .policy("halved")
        .stage_poll(Duration::from_millis(50))
        .start()
        .expect("the loop's options");
    wait_for("the scale read", async || protection.scale("halved") == 50).await;
    let scaled = Limiter::builder(client.clone())
        .protection(protection.clone())
        .build();
    let plain = Limiter::builder(client).build();
    let (rules_scaled, rules_plain) = (
        scaled.rule_set(vec![Rule::policy("halved")]).await.unwrap(),
        plain.rule_set(vec![Rule::policy("halved")]).await.unwrap(),
    );
    server.kill9();
    let mut counts = Vec::new();
    for (limiter, rules) in [(&scaled, &rules_scaled), (&plain, &rules_plain)] {
        let mut n = 0;
        for _ in 0..20 {
            let d = limiter.check(rules, "someone", 1).await;
            assert_eq!(d.path, redis_ratelimit_client::Path::Fallback);
            n += u64::from(d.allowed);
        }
        counts.push(n);
    }
    assert_eq!(counts, [5, 10], "scaled, then as the rule was read");
}

/// `RL.OUTCOME ... DENIED n`: the calls a policy's limiter denied without
/// asking the server (its deny cache) leave with the next report and the
/// server counts them as calls and denials of the window; a report without
/// local denials is the plain form; a failed send loses them (not retried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_denials_leave_with_the_report_as_denied_and_a_failed_send_loses_them() {
    let mut server = Server::start(Kind::Redis);
    let policy = "cached TOKENBUCKET 1 1 60000 STAGES 100 100 WINDOW 60000";
    set_policy(&server, policy);
    let client = Client::standalone(&server.url()).await.unwrap();
    let protection = Protection::builder(client.clone())
        .report_interval(Duration::from_millis(50))
        .stage_poll(Duration::from_millis(50))
        .start()
        .expect("the loop's options");
    let limiter = Limiter::builder(client.clone())
        .protection(protection.clone())
        .deadline(Duration::from_secs(2))
        .deny_cache_max(Duration::from_secs(60))
        .build();
    let rules = limiter
        .rule_set(vec![Rule::policy("cached")])
        .await
        .unwrap();
    // 1 admitted, 1 denied by Redis (cached), 8 denied from the cache.
    let paths: Vec<_> = {
        let mut out = Vec::new();
        for _ in 0..10 {
            out.push(limiter.check(&rules, "u", 1).await.path);
        }
        out
    };
    use redis_ratelimit_client::Path;
    assert_eq!(paths.iter().filter(|p| **p == Path::DenyCache).count(), 8);
    protection.record("cached", false);
    wait_for("the local denials sent", async || {
        protection.stats().denied_sent == 8
    })
    .await;
    // The minute's window may have turned meanwhile: current plus last.
    let s = client.policy_stats("cached").await.unwrap()[0];
    let (c, l) = (s.current, s.last);
    assert_eq!(
        (
            c.calls + l.calls,
            c.admitted + l.admitted,
            c.denied + l.denied,
            c.ok + l.ok
        ),
        (10, 1, 9, 1),
        "{s:?}"
    );
    assert_eq!(protection.stats().denied_pending, 0);

    // A plain report (no local denials) is still answered.
    protection.record("cached", true);
    wait_for("the plain report", async || {
        protection.stats().outcomes_sent == 2
    })
    .await;
    assert_eq!(protection.stats().denied_sent, 8);

    // Redis down: the local denials of a failed send are lost, not kept.
    server.kill9();
    for _ in 0..5 {
        protection.record_denied("cached");
    }
    wait_for("the failed send's denials lost", async || {
        let s = protection.stats();
        s.denied_lost == 5 && s.denied_pending == 0
    })
    .await;
    server.restart();
    set_policy(&server, policy);
    // (The first send after the restart may still fail, and lose its own.)
    wait_for("sent again, without the lost ones", async || {
        protection.record_denied("cached");
        tokio::time::sleep(Duration::from_millis(100)).await;
        protection.stats().denied_sent > 8
    })
    .await;
    // The server counts exactly what answered reports carried.
    let fresh = Client::standalone(&server.url()).await.unwrap();
    wait_for("the server's counts are the sent ones", async || {
        let s = fresh.policy_stats("cached").await.unwrap()[0];
        let again = protection.stats().denied_sent - 8;
        (
            s.current.calls + s.last.calls,
            s.current.denied + s.last.denied,
        ) == (again, again)
    })
    .await;
    protection.close().await;
}

/// A layer whose limiter was not given the loop still counts its policy
/// rule's deny cache answers (once: not twice when the limiter does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_counts_local_denials_once_whichever_holds_the_loop() {
    let server = Server::start(Kind::Redis);
    set_policy(
        &server,
        "once TOKENBUCKET 1 1 60000 STAGES 100 100 WINDOW 60000",
    );
    let client = Client::standalone(&server.url()).await.unwrap();
    let protection = Protection::builder(client.clone())
        .report_interval(Duration::from_secs(3600))
        .start()
        .expect("the loop's options");
    let mut counted = Vec::new();
    for with_loop in [false, true] {
        let mut limiter = Limiter::builder(client.clone())
            .deadline(Duration::from_secs(2))
            .deny_cache_max(Duration::from_secs(60));
        if with_loop {
            limiter = limiter.protection(protection.clone());
        }
        let layer = RateLimitLayer::builder(limiter.build())
            .key(move |_| Some(format!("k{with_loop}")))
            .rule(Rule::policy("once"))
            .protection(protection.clone())
            .build()
            .await
            .unwrap();
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        let before = protection.stats().denied_pending;
        for _ in 0..6 {
            let req = axum::http::Request::new(axum::body::Body::empty());
            tower::ServiceExt::oneshot(app.clone(), req).await.unwrap();
        }
        counted.push(protection.stats().denied_pending - before);
    }
    assert_eq!(counted, [4, 4], "1 admitted, 1 denied by Redis, 4 cached");
}

/// close() releases the breakers the loop forced open: nothing would
/// release them after (no more polls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_releases_the_breakers_the_loop_forced_open() {
    let server = Server::start(Kind::Redis);
    let client = Client::standalone(&server.url()).await.unwrap();
    let spec = Spec::parse("brk", "TOKENBUCKET", &[1, 1, 60000]).unwrap();
    let options = PolicyProtection {
        adapt: Some(None),
        stages: Some((30, 50)),
        window_ms: Some(200),
    };
    client
        .policy_set_protected("brk", &spec, PolicyMode::Enforce, 100, &options)
        .await
        .unwrap();
    // A bad option is refused before sending, named.
    let bad = PolicyProtection {
        stages: Some((50, 30)),
        ..options
    };
    let refused = client
        .policy_set_protected("brk", &spec, PolicyMode::Enforce, 100, &bad)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("break_pct"), "{refused}");
    let protection = Protection::builder(client.clone())
        .report_interval(Duration::from_millis(50))
        .stage_poll(Duration::from_millis(50))
        .start()
        .expect("the loop's options");
    let breaker = protection.breaker("down", "brk");
    // Denials the server did not see: the kit's, reported.
    for _ in 0..100 {
        protection.record_denied("brk");
    }
    wait_until("the breaker forced open", || {
        breaker.state() == redis_ratelimit_client::BreakerState::ForcedOpen
    });
    protection.close().await;
    assert_eq!(
        breaker.state(),
        redis_ratelimit_client::BreakerState::Closed,
        "released on close"
    );
}

/// An admitted request whose future is dropped before it finishes (an
/// outer timeout, e.g. tower's TimeoutLayer around the layer) counts as an
/// error: it is a timeout the handler did not survive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_request_dropped_unfinished_counts_as_an_error() {
    let server = Server::start(Kind::Redis);
    set_policy(
        &server,
        "dropped TOKENBUCKET 100 100 1000 STAGES 100 100 WINDOW 60000",
    );
    let client = Client::standalone(&server.url()).await.unwrap();
    let protection = Protection::builder(client.clone())
        .report_interval(Duration::from_millis(50))
        .start()
        .expect("the loop's options");
    let layer = RateLimitLayer::builder(
        Limiter::builder(client.clone())
            .deadline(Duration::from_secs(2))
            .build(),
    )
    .key(|_| Some("k".into()))
    .rule(Rule::policy("dropped"))
    .protection(protection.clone())
    .build()
    .await
    .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                "late"
            }),
        )
        .layer(layer);
    let req = axum::http::Request::new(axum::body::Body::empty());
    let outer = tokio::time::timeout(
        Duration::from_millis(300),
        tower::ServiceExt::oneshot(app, req),
    )
    .await;
    assert!(outer.is_err(), "the outer timeout fired");
    wait_for("the error on the server", async || {
        let s = client.policy_stats("dropped").await.unwrap()[0];
        (s.current.ok + s.last.ok, s.current.errors + s.last.errors) == (0, 1)
    })
    .await;
    protection.close().await;
}
