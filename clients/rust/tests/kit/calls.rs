//! The typed calls: every command, its reply as a `Decision`, and the three
//! kinds of error (a bad argument caught before sending, a server error, a
//! timeout); the start-up check of `MODULE LIST`.

use std::time::Duration;

use redis_ratelimit_client::{
    Client, Decision, Error, Path, PolicyMode, Request, Rule, RuleKind, Spec,
};

use crate::harness::{Kind, Server};

async fn every_command_answers_typed(kind: Kind) {
    let server = Server::start(kind);
    let client = Client::standalone(&server.url())
        .await
        .unwrap()
        .with_deadline(Duration::from_secs(5));

    let d = client
        .token_bucket("tb", 5, 1, 60_000, Request::Cost(2))
        .await
        .unwrap();
    assert!(d.allowed);
    assert_eq!((d.limit, d.remaining, d.wait_ms), (5, 3, 0));
    assert!(d.reset_after > Duration::from_secs(119) && d.reset_after <= Duration::from_secs(120));
    let d = client
        .token_bucket("tb", 5, 1, 60_000, Request::Cost(4))
        .await
        .unwrap();
    assert!(!d.allowed && d.remaining == 3);
    assert!(d.retry_after > Duration::from_secs(59) && d.retry_after <= Duration::from_secs(60));
    let d = client
        .token_bucket("tb", 5, 1, 60_000, Request::Cost(6))
        .await
        .unwrap();
    assert!(d.never() && d.retry_after_s().is_none());
    let d = client
        .token_bucket("tb", 5, 1, 60_000, Request::Force(4))
        .await
        .unwrap();
    assert!(d.allowed);
    let d = client
        .token_bucket("tb", 5, 1, 60_000, Request::Refund(1))
        .await
        .unwrap();
    assert!(d.allowed && d.remaining == 0, "{d:?}");

    let d = client
        .fixed_window("fw", 3, 60_000, Request::Cost(1))
        .await
        .unwrap();
    assert_eq!((d.allowed, d.limit, d.remaining), (true, 3, 2));
    let d = client
        .leaky_bucket("lb", 3, 1, 1000, Request::Cost(1))
        .await
        .unwrap();
    assert_eq!((d.allowed, d.limit), (true, 3));
    let d = client
        .sliding("sl", 2, 60_000, Request::Cost(2))
        .await
        .unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 0));
    let d = client
        .sliding("sl", 2, 60_000, Request::Cost(1))
        .await
        .unwrap();
    assert!(!d.allowed);
    let d = client
        .hash_window("hw", 10, 60_000, 1000, Request::Cost(3))
        .await
        .unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 7));

    // Policies, RL.HIT and RL.ALL with denied_by.
    let spec = Spec::parse("p", "SLIDING", &[1, 60_000]).unwrap();
    client
        .policy_set("POST:/api/order", &spec, PolicyMode::Enforce, 100)
        .await
        .unwrap();
    let info = client.policy_get("POST:/api/order").await.unwrap().unwrap();
    assert_eq!(
        (info.spec, info.mode.as_str(), info.rollout),
        (Some(spec), "ENFORCE", 100)
    );
    assert_eq!(
        client.policy_list().await.unwrap(),
        vec!["POST:/api/order".to_string()]
    );
    let d = client
        .hit("POST:/api/order", "order:1", Request::Cost(1))
        .await
        .unwrap();
    assert!(d.allowed);
    let d = client
        .hit("POST:/api/order", "order:1", Request::Cost(1))
        .await
        .unwrap();
    assert!(!d.allowed);

    let user = RuleKind::Inline(Spec::parse("u", "FIXEDWINDOW", &[5, 60_000]).unwrap());
    let order = RuleKind::Policy("POST:/api/order".into());
    let d = client
        .all(&[("all:u", &user), ("order:1", &order)], 1)
        .await
        .unwrap();
    assert_eq!((d.allowed, d.denied_by), (false, Some(1)));
    let d = client
        .all(&[("all:u", &user), ("order:2", &order)], 1)
        .await
        .unwrap();
    assert_eq!((d.allowed, d.denied_by), (true, None));

    assert!(client.log_len().await.unwrap() >= 3);
    let log = client.log_get(10).await.unwrap();
    assert!(
        log.iter()
            .any(|e| e.key == "order:1" && e.source == "policy:POST:/api/order"),
        "{log:?}"
    );
    client.log_reset().await.unwrap();
    assert_eq!(client.log_len().await.unwrap(), 0);
    assert!(client.policy_del("POST:/api/order").await.unwrap());
    assert!(client
        .policy_get("POST:/api/order")
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn every_command_answers_typed_on_redis() {
    every_command_answers_typed(Kind::Redis).await;
}

#[tokio::test]
async fn every_command_answers_typed_on_valkey() {
    every_command_answers_typed(Kind::Valkey).await;
}

#[tokio::test]
async fn a_bad_argument_is_refused_before_anything_is_sent() {
    let server = Server::start(Kind::Redis);
    let client = Client::standalone(&server.url()).await.unwrap();
    let cases = [
        (
            client.token_bucket("k", 0, 1, 1000, Request::Cost(1)).await,
            "capacity",
        ),
        (
            client.fixed_window("k", 5, 0, Request::Cost(1)).await,
            "window_ms",
        ),
        (
            client
                .hash_window("k", 5, 1000, 300, Request::Cost(1))
                .await,
            "bucket_ms",
        ),
        (
            client.sliding("k", 5, 1000, Request::Cost(1 << 41)).await,
            "COST",
        ),
        (
            client.hit("has space", "k", Request::Cost(1)).await,
            "policy name",
        ),
    ];
    for (result, arg) in cases {
        match result {
            Err(Error::BadArgument { arg: got, .. }) => assert_eq!(got, arg),
            other => panic!("expected a bad {arg}, got {other:?}"),
        }
    }
    let stats = server.info("commandstats");
    assert!(
        !stats.keys().any(|k| k.starts_with("cmdstat_rl.")),
        "nothing reached the server: {stats:?}"
    );
    assert!(Rule::sliding(0, 1000)
        .check()
        .unwrap_err()
        .to_string()
        .contains("limit"));
}

#[tokio::test]
async fn a_server_error_and_a_timeout_are_typed() {
    let server = Server::start(Kind::Redis);
    let client = Client::standalone(&server.url())
        .await
        .unwrap()
        .with_deadline(Duration::from_millis(100));
    let _: () = redis::cmd("SET")
        .arg("str")
        .arg("x")
        .query(&mut server.conn())
        .unwrap();
    match client.sliding("str", 5, 1000, Request::Cost(1)).await {
        Err(Error::Server(msg)) => assert!(msg.contains("WRONGTYPE"), "{msg}"),
        other => panic!("{other:?}"),
    }
    // The server keeps sleeping 300 ms at a time: a call soon misses its deadline.
    let url = server.url();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = done.clone();
    let sleeper = std::thread::spawn(move || {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let _: redis::Value = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg("0.3")
                .query(&mut c)
                .unwrap();
        }
    });
    let mut timed_out = None;
    for _ in 0..1000 {
        match client
            .fixed_window("t", 1_000_000, 1000, Request::Cost(1))
            .await
        {
            Ok(_) => continue,
            Err(e) => {
                timed_out = Some(e);
                break;
            }
        }
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    sleeper.join().unwrap();
    match timed_out {
        Some(e @ Error::Timeout(_)) => assert!(e.is_unavailable()),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_server_without_the_module_fails_at_start_up_with_a_clear_message() {
    let server = Server::start_bare(Kind::Redis);
    match Client::standalone(&server.url()).await {
        Err(Error::ModuleMissing(msg)) => {
            assert!(
                msg.contains("--loadmodule") && msg.contains("ratelimit"),
                "{msg}"
            )
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("connected to a server without the module"),
    }
}

/// `all_each`: the call's decision as `all` gives it, and every limiter's
/// own, admitted and denied, through a shadowed and an off policy too.
async fn all_each_answers_the_call_and_every_limiter(kind: Kind) {
    let server = Server::start(kind);
    let client = Client::standalone(&server.url())
        .await
        .unwrap()
        .with_deadline(Duration::from_secs(5));
    let user = RuleKind::Inline(Spec::parse("u", "TOKENBUCKET", &[10, 1, 3_600_000]).unwrap());
    let endpoint = RuleKind::Inline(Spec::parse("e", "SLIDING", &[5, 3_600_000]).unwrap());
    let shadow = Spec::parse("s", "SLIDING", &[1, 3_600_000]).unwrap();
    client
        .policy_set("each-shadow", &shadow, PolicyMode::Shadow, 100)
        .await
        .unwrap();
    let off = Spec::parse("o", "TOKENBUCKET", &[7, 1, 1000]).unwrap();
    client
        .policy_set("each-off", &off, PolicyMode::Off, 100)
        .await
        .unwrap();
    let (shadowed, off) = (
        RuleKind::Policy("each-shadow".into()),
        RuleKind::Policy("each-off".into()),
    );
    let limits = [
        ("each:u", &user),
        ("each:e", &endpoint),
        ("each:s", &shadowed),
        ("each:o", &off),
    ];
    let fields = |d: &Decision| (d.allowed, d.limit, d.remaining);

    let (call, each) = client.all_each(&limits, Request::Cost(2)).await.unwrap();
    // The call's fields are its most restrictive limiter's: the shadow's.
    assert_eq!(
        (call.allowed, call.denied_by, call.remaining),
        (true, None, 1)
    );
    assert_eq!(
        each.iter().map(fields).collect::<Vec<_>>(),
        [(true, 10, 8), (true, 5, 3), (true, 1, 1), (true, 7, 7)],
        "the shadow would deny 2 of its 1: answered allowed, nothing taken"
    );
    assert!(each
        .iter()
        .all(|d| d.path == Path::Redis && d.denied_by.is_none()));
    // Each as it answers alone, looked at with COST 0.
    let u = client
        .token_bucket("each:u", 10, 1, 3_600_000, Request::Cost(0))
        .await
        .unwrap();
    let e = client
        .sliding("each:e", 5, 3_600_000, Request::Cost(0))
        .await
        .unwrap();
    assert_eq!(
        (fields(&u), fields(&e)),
        (fields(&each[0]), fields(&each[1]))
    );

    // Denied by the endpoint (3 left, 4 asked): nothing taken; the user
    // would have had 4 left.
    let (call, each) = client.all_each(&limits, Request::Cost(4)).await.unwrap();
    assert_eq!((call.allowed, call.denied_by), (false, Some(1)));
    assert_eq!(
        each.iter().map(fields).collect::<Vec<_>>(),
        [(true, 10, 4), (false, 5, 3), (true, 1, 1), (true, 7, 7)]
    );
    assert!(each[1].retry_after > Duration::ZERO);
    let (call, each) = client.all_each(&limits, Request::Cost(0)).await.unwrap();
    assert!(call.allowed);
    assert_eq!(each[0].remaining, 8, "the denial took nothing");
    // FORCE takes even what is denied: each answers as its own command
    // does (the sliding log, forced past its limit, as before the take).
    let (call, each) = client.all_each(&limits, Request::Force(4)).await.unwrap();
    assert!(call.allowed);
    assert_eq!((each[0].remaining, each[1].remaining), (4, 3));
    let e = client
        .sliding("each:e", 5, 3_600_000, Request::Cost(0))
        .await
        .unwrap();
    assert_eq!(e.remaining, 0, "the 4 were taken");

    // UPTO and REFUND are refused before sending, naming them.
    for (request, arg) in [(Request::UpTo(3), "UPTO"), (Request::Refund(1), "REFUND")] {
        match client.all_each(&limits, request).await {
            Err(Error::BadArgument { arg: got, .. }) => assert_eq!(got, arg),
            other => panic!("expected a bad {arg}, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn all_each_answers_the_call_and_every_limiter_on_redis() {
    all_each_answers_the_call_and_every_limiter(Kind::Redis).await;
}

#[tokio::test]
async fn all_each_answers_the_call_and_every_limiter_on_valkey() {
    all_each_answers_the_call_and_every_limiter(Kind::Valkey).await;
}
