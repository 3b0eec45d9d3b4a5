//! Grants (issue 27): typed `UPTO` calls on every algorithm that takes it;
//! batched rules (one limiter with many callers, and several instances as
//! real processes, one of them killed with -9 while it holds units); striped
//! rules on a 3-master cluster. The bounds are read on the server's clock
//! (`TIME`); Redis calls from `INFO commandstats` and the kit's counters.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis_ratelimit_client::key_slot;
use redis_ratelimit_client::{
    Batch, Client, Error, FallbackMode, Limiter, Period, PolicyMode, Request, Rule, RuleKind, Spec,
    MAX_UPTO,
};

use crate::harness::{wait_for, Cluster, Kind, Server};

async fn client_of(server: &Server) -> Client {
    Client::standalone(&server.url())
        .await
        .unwrap()
        .with_deadline(Duration::from_secs(5))
}

/// The server's clock, in microseconds.
fn server_time_us(server: &Server) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut server.conn()).unwrap();
    s * 1_000_000 + us
}

/// A token bucket's tokens left, peeked with `COST 0`.
fn tokens_left(server: &Server, key: &str, params: [u64; 3]) -> u64 {
    let v: Vec<i64> = redis::cmd("RL.TOKENBUCKET")
        .arg(key)
        .arg(&params[..])
        .arg("COST")
        .arg(0)
        .query(&mut server.conn())
        .unwrap();
    v[2] as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upto_takes_what_fits_on_the_five_algorithms() {
    let server = Server::start(Kind::Redis);
    let client = client_of(&server).await;
    let specs = [
        Spec::parse("t", "TOKENBUCKET", &[5, 1, 3_600_000]).unwrap(),
        Spec::parse("t", "FIXEDWINDOW", &[5, 3_600_000]).unwrap(),
        Spec::parse("t", "SLIDING", &[5, 3_600_000]).unwrap(),
        Spec::parse("t", "HASHWINDOW", &[5, 3_600_000, 60_000]).unwrap(),
        Spec::quota(5, Period::Year, None).unwrap(),
    ];
    for spec in &specs {
        let key = format!("upto:{}", spec.algorithm());
        let d = client.apply(&key, spec, Request::UpTo(3)).await.unwrap();
        assert!(d.allowed, "{spec:?}");
        assert_eq!((d.granted, d.remaining), (Some(3), 2), "{spec:?}");
        // At most what fits: 2 of 10.
        let d = client.apply(&key, spec, Request::UpTo(10)).await.unwrap();
        assert_eq!((d.allowed, d.granted, d.remaining), (true, Some(2), 0));
        // Nothing fits: COST 1's denial, granted 0.
        let d = client.apply(&key, spec, Request::UpTo(4)).await.unwrap();
        assert_eq!((d.allowed, d.granted), (false, Some(0)), "{spec:?}");
        assert!(d.wait_ms > 0, "{spec:?}: {d:?}");
        // A call without UPTO has no sixth field.
        let d = client.apply(&key, spec, Request::Cost(0)).await.unwrap();
        assert_eq!(d.granted, None);
    }
    // The typed calls by name take it too.
    let d = client
        .token_bucket("upto:tb2", 4, 1, 1000, Request::UpTo(9))
        .await
        .unwrap();
    assert_eq!(d.granted, Some(4));
    // Refused before sending, naming UPTO.
    for bad in [
        client
            .leaky_bucket("lb", 5, 1, 1000, Request::UpTo(1))
            .await
            .unwrap_err(),
        client
            .concurrency("cc", 5, 1000, Request::UpTo(1))
            .await
            .unwrap_err(),
        client
            .sliding("sl", 5, 1000, Request::UpTo(0))
            .await
            .unwrap_err(),
        client
            .sliding("sl", 5, 1000, Request::UpTo(MAX_UPTO + 1))
            .await
            .unwrap_err(),
    ] {
        assert!(
            matches!(&bad, Error::BadArgument { arg, .. } if arg == "UPTO"),
            "{bad:?}"
        );
    }
    let bad = client
        .leaky_bucket("lb", 5, 1, 1000, Request::UpTo(1))
        .await
        .unwrap_err();
    assert!(
        bad.to_string()
            .contains("UPTO is not an option of RL.LEAKYBUCKET"),
        "{bad}"
    );
    assert_eq!(server.calls("rl.leakybucket"), 0, "refused client-side");
    // The largest UPTO is accepted.
    let d = client
        .sliding("upto:max", 5, 1000, Request::UpTo(MAX_UPTO))
        .await
        .unwrap();
    assert_eq!(d.granted, Some(5));

    // RL.HIT on a policy, and the server's words on a LEAKYBUCKET one.
    let tb = Spec::parse("p", "TOKENBUCKET", &[3, 1, 3_600_000]).unwrap();
    client
        .policy_set("upto-tb", &tb, PolicyMode::Enforce, 100)
        .await
        .unwrap();
    let d = client
        .hit("upto-tb", "hit:1", Request::UpTo(5))
        .await
        .unwrap();
    assert_eq!((d.allowed, d.granted), (true, Some(3)));
    let lb = Spec::parse("p", "LEAKYBUCKET", &[3, 1, 1000]).unwrap();
    client
        .policy_set("upto-lb", &lb, PolicyMode::Enforce, 100)
        .await
        .unwrap();
    let e = client
        .hit("upto-lb", "hit:2", Request::UpTo(5))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("UPTO"), "{e}");

    // RL.ALL: the most every limiter admits at once, in a seventh field.
    let a = RuleKind::Inline(Spec::parse("a", "FIXEDWINDOW", &[4, 3_600_000]).unwrap());
    let b = RuleKind::Inline(Spec::parse("b", "FIXEDWINDOW", &[2, 3_600_000]).unwrap());
    let d = client
        .all_upto(&[("all:a", &a), ("all:b", &b)], 3)
        .await
        .unwrap();
    assert_eq!((d.allowed, d.granted, d.denied_by), (true, Some(2), None));
    let d = client
        .all_upto(&[("all:a", &a), ("all:b", &b)], 3)
        .await
        .unwrap();
    assert_eq!(
        (d.allowed, d.granted, d.denied_by),
        (false, Some(0), Some(1))
    );
}

#[test]
fn batch_and_stripe_options_are_checked_naming_them() {
    let named = |rule: Rule, want: &str| match rule.check() {
        Err(Error::BadArgument { arg, .. }) => assert_eq!(arg, want),
        other => panic!("{want}: {other:?}"),
    };
    let tb = || Rule::token_bucket(100, 10, 1000).fixed_key("g");
    assert!(tb().batched().striped(3).check().is_ok());
    assert!(tb().batched().is_global() && tb().striped(2).is_global());
    named(
        tb().batched_with(Batch {
            hold_ms: 0,
            max_share_pct: 10,
        }),
        "hold_ms",
    );
    named(
        tb().batched_with(Batch {
            hold_ms: 60_001,
            max_share_pct: 10,
        }),
        "hold_ms",
    );
    named(
        tb().batched_with(Batch {
            hold_ms: 50,
            max_share_pct: 101,
        }),
        "max_share_pct",
    );
    named(tb().striped(0), "striped");
    named(tb().striped(65), "striped");
    // Every share at least 1: the refill count 10 splits in at most 10.
    named(tb().striped(11), "striped");
    assert!(tb().striped(10).check().is_ok());
    named(
        Rule::leaky_bucket(10, 1, 1000).fixed_key("g").batched(),
        "batched",
    );
    named(Rule::policy("p").fixed_key("g").striped(2), "striped");
    named(Rule::sliding(10, 1000).batched(), "batched");
    // Shares: 10 over 3 is 4, 3, 3 for every size and rate parameter.
    let spec = Spec::parse("t", "TOKENBUCKET", &[10, 10, 1000]).unwrap();
    let shares: Vec<Vec<u64>> = (0..3)
        .map(|i| spec.stripe("t", 3, i).unwrap().params())
        .collect();
    assert_eq!(
        shares,
        [vec![4, 4, 1000], vec![3, 3, 1000], vec![3, 3, 1000]]
    );
    let hw = Spec::parse("t", "HASHWINDOW", &[7, 60_000, 1000]).unwrap();
    assert_eq!(hw.stripe("t", 2, 1).unwrap().params(), [3, 60_000, 1000]);
}

/// One limiter, 32 callers at once on a batched token bucket with a small
/// refill: never above capacity + refill over the elapsed time (the
/// server's clock), and far fewer calls than decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_rule_never_admits_over_the_bound_with_few_calls() {
    let server = Server::start(Kind::Redis);
    let client = client_of(&server).await;
    let limiter = Limiter::builder(client)
        .fallback(FallbackMode::FailClosed)
        .build();
    let params = [50, 10, 100];
    let set = Arc::new(
        limiter
            .rule_set(vec![Rule::token_bucket(params[0], params[1], params[2])
                .name("global")
                .fixed_key("batched:tb")
                .batched()])
            .await
            .unwrap(),
    );
    let t0 = server_time_us(&server);
    let (decisions, admitted) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (limiter, set) = (limiter.clone(), set.clone());
        let (decisions, admitted) = (decisions.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..400 {
                let d = limiter.check(&set, "", 1).await;
                decisions.fetch_add(1, Ordering::Relaxed);
                if d.allowed {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed_ms = (server_time_us(&server) - t0).div_ceil(1000);
    let bound = params[0] + params[1] * elapsed_ms.div_ceil(params[2]);
    let (decisions, admitted) = (
        decisions.load(Ordering::Relaxed),
        admitted.load(Ordering::Relaxed),
    );
    let calls = server.calls("rl.tokenbucket");
    let stats = limiter.stats();
    println!(
        "batched, 32 callers: {decisions} decisions, {admitted} admitted (bound {bound} over \
         {elapsed_ms} ms), {calls} calls, {} in process",
        stats.grant_admitted + stats.grant_denied
    );
    assert_eq!(decisions, 32 * 400);
    assert!(admitted <= bound, "{admitted} admitted > bound {bound}");
    assert!(admitted > 0);
    assert!(
        calls * 10 <= decisions,
        "{calls} calls for {decisions} decisions"
    );
    assert!(
        stats.grant_admitted > 0 && stats.grant_denied > 0,
        "{stats:?}"
    );
}

/// Held units go back at close, and after `hold_ms` when idle: the
/// server's tokens return to capacity minus what was admitted (no refill to
/// speak of: one token an hour).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_units_go_back_at_close_and_when_idle() {
    let server = Server::start(Kind::Redis);
    let client = client_of(&server).await;
    let params = [100, 1, 3_600_000];
    for (key, hold_ms, by_close) in [("held:close", 60_000, true), ("held:idle", 1000, false)] {
        let limiter = Limiter::builder(client.clone()).build();
        let set = limiter
            .rule_set(vec![Rule::token_bucket(params[0], params[1], params[2])
                .fixed_key(key)
                .batched_with(Batch {
                    hold_ms,
                    max_share_pct: 50,
                })])
            .await
            .unwrap();
        for _ in 0..30 {
            assert!(limiter.check(&set, "", 1).await.allowed);
        }
        let held = limiter.held_units();
        assert!(held > 0, "a burst of 30 leaves units held");
        assert_eq!(tokens_left(&server, key, params), 100 - 30 - held);
        if by_close {
            limiter.close().await;
            assert_eq!(limiter.held_units(), 0);
        }
        wait_for("the held units back on the server", async || {
            tokens_left(&server, key, params) == 70
        })
        .await;
        assert_eq!(limiter.held_units(), 0);
        assert!(limiter.stats().grant_refunded_units >= held);
    }
}

fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("examples").join(name))
        .unwrap();
    assert!(
        bin.exists(),
        "{} missing: cargo test builds the examples",
        bin.display()
    );
    bin
}

fn load(args: &[String]) -> Child {
    Command::new(example("grants_load"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// A number in the example's JSON line.
fn field(line: &str, name: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    v[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} in {line}"))
}

fn output(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "grants_load failed");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Three processes, each offering 2/3 of the limit (twice the limit in
/// all) on one batched token bucket: never over capacity + refill over the
/// run (the server's clock), and few calls per 1000 decisions.
#[test]
fn three_processes_at_twice_the_limit_never_over_admit() {
    let server = Server::start(Kind::Redis);
    // 1500/s: 150 every 100 ms, a bucket of 300; 1000/s offered by each.
    let params = [300, 150, 100];
    let start_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 1500;
    let args: Vec<String> = [
        "--nodes",
        &server.url(),
        "--mode",
        "batched",
        "--key",
        "procs:tb",
        "--capacity",
        &params[0].to_string(),
        "--refill-count",
        &params[1].to_string(),
        "--refill-ms",
        &params[2].to_string(),
        "--rate",
        "1000",
        "--duration-ms",
        "3000",
        "--start-at-ms",
        &start_at.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let t0 = server_time_us(&server);
    let children: Vec<Child> = (0..3).map(|_| load(&args)).collect();
    let lines: Vec<String> = children.into_iter().map(output).collect();
    let elapsed_ms = (server_time_us(&server) - t0).div_ceil(1000);
    let sum = |name: &str| lines.iter().map(|l| field(l, name)).sum::<u64>();
    let (decisions, admitted, calls) = (sum("decisions"), sum("admitted"), sum("redis_calls"));
    let bound = params[0] + params[1] * elapsed_ms.div_ceil(params[2]);
    let per_1000 = calls * 1000 / decisions.max(1);
    println!(
        "3 processes, batched: {decisions} decisions, {admitted} admitted (bound {bound} over \
         {elapsed_ms} ms), {calls} Redis calls: {per_1000} per 1000 decisions"
    );
    for l in &lines {
        println!("  {l}");
    }
    assert!(admitted <= bound, "{admitted} > {bound}");
    assert!(admitted > params[0], "{admitted}");
    assert!(per_1000 <= 100, "{per_1000} calls per 1000 decisions");
    // The server saw no call the processes did not count (a REFUND in
    // flight at exit may not have arrived).
    let seen = server.calls("rl.tokenbucket");
    assert!(
        seen <= calls && seen >= sum("grant_asks"),
        "{seen} calls seen, {calls} counted"
    );
}

/// kill -9 of an instance that holds units: the total never over-admits,
/// and what is lost is at most what it held.
#[test]
fn killing_an_instance_that_holds_units_loses_at_most_what_it_held() {
    let server = Server::start(Kind::Redis);
    // 3000 tokens, one more an hour: what is consumed stays consumed.
    let params = [3000u64, 1, 3_600_000];
    let start_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 1500;
    let base = |extra: &[&str]| -> Vec<String> {
        [
            "--nodes",
            &server.url(),
            "--mode",
            "batched",
            "--key",
            "kill:tb",
            "--capacity",
            &params[0].to_string(),
            "--refill-count",
            &params[1].to_string(),
            "--refill-ms",
            &params[2].to_string(),
            "--rate",
            "600",
            "--duration-ms",
            "3000",
            "--hold-ms",
            "60000",
            "--start-at-ms",
            &start_at.to_string(),
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
    };
    let mut victim = load(&base(&["--pause-after-ms", "1000"]));
    let survivors: Vec<Child> = (0..2).map(|_| load(&base(&[]))).collect();
    let mut reader = BufReader::new(victim.stdout.take().unwrap());
    let mut paused = String::new();
    reader.read_line(&mut paused).unwrap();
    let (victim_admitted, victim_held) = (field(&paused, "admitted"), field(&paused, "held"));
    assert!(victim_held > 0, "the victim holds units: {paused}");
    victim.kill().unwrap();
    victim.wait().unwrap();
    let lines: Vec<String> = survivors.into_iter().map(output).collect();
    let admitted = victim_admitted + lines.iter().map(|l| field(l, "admitted")).sum::<u64>();
    let consumed = params[0] - tokens_left(&server, "kill:tb", params);
    println!(
        "kill -9: victim admitted {victim_admitted}, held {victim_held}; {admitted} admitted in \
         all, {consumed} consumed on the server"
    );
    assert!(admitted <= params[0], "over-admitted: {admitted}");
    assert!(consumed >= admitted, "every admission was taken first");
    assert!(
        consumed - admitted <= victim_held,
        "lost {} > held {victim_held}",
        consumed - admitted
    );
    // The survivors ran out: all 3000 were taken, none given twice.
    assert!(lines.iter().map(|l| field(l, "denied")).sum::<u64>() > 0);
}

/// Which master (0..3, the harness's order: by lowest slot) owns `key`: the
/// one that answers without `MOVED`.
fn owner_of(cluster: &Cluster, key: &str) -> usize {
    (0..3)
        .find(|&i| {
            redis::cmd("EXISTS")
                .arg(key)
                .query::<i64>(&mut cluster.nodes[i].conn())
                .is_ok()
        })
        .unwrap_or_else(|| panic!("no master owns {key}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripes_on_three_masters_sum_to_at_most_the_limit() {
    let cluster = Cluster::start(Kind::Redis);
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let client = Client::cluster(&nodes)
        .await
        .unwrap()
        .with_deadline(Duration::from_secs(5));
    let params = [300, 3, 3_600_000];
    let rule = |key: &str| {
        Rule::token_bucket(params[0], params[1], params[2])
            .name("global")
            .fixed_key(key)
    };
    for batched in [false, true] {
        let key = if batched { "striped:b" } else { "striped:u" };
        let make = || rule(key).striped(3);
        let make = || if batched { make().batched() } else { make() };
        // One instance alone: its own stripe, then the next: 200 of 600.
        let one = Limiter::builder(client.clone())
            .fallback(FallbackMode::FailClosed)
            .build();
        let set = one.rule_set(vec![make()]).await.unwrap();
        let r = &set.rules()[0];
        let tags = r.stripe_tags();
        assert_eq!(tags.len(), 3);
        // Each stripe on its own master: stripe i on master i, by the kit's
        // CRC16 and by the server's CLUSTER KEYSLOT.
        for (i, tag) in tags.iter().enumerate() {
            assert_eq!(owner_of(&cluster, &format!("{{{tag}}}{key}")), i, "{tag}");
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(tag)
                .query(&mut cluster.nodes[0].conn())
                .unwrap();
            let (lo, hi) = [(0, 5460), (5461, 10921), (10922, 16383)][i];
            assert!((lo..=hi).contains(&slot), "{tag}: slot {slot}");
            assert_eq!(i64::from(key_slot(tag)), slot, "{tag}");
        }
        let mut admitted = 0;
        for _ in 0..600 {
            admitted += u64::from(one.check(&set, "", 1).await.allowed);
        }
        one.close().await;
        assert_eq!(
            admitted, 200,
            "own stripe and one spill-over (batched {batched})"
        );
        assert!(one.stats().stripe_spills > 0);
        let keys = r.keys_for(key);
        let own = r.own_stripe().unwrap();
        let specs = r.stripe_specs();
        assert_eq!(specs.iter().map(|s| s.limit()).sum::<u64>(), 300);
        let left = |i: usize| -> u64 {
            let spec = specs[(own + i) % 3];
            let p = spec.params();
            let v: Vec<i64> = redis::cmd("RL.TOKENBUCKET")
                .arg(&keys[i])
                .arg(&p[..])
                .arg("COST")
                .arg(0)
                .query(&mut cluster.nodes[owner_of(&cluster, &keys[i])].conn())
                .unwrap();
            v[2] as u64
        };
        assert_eq!((left(0), left(1)), (0, 0), "both stripes drained");
        assert_eq!(left(2), 100, "the third untouched by this instance");

        // Three instances at twice the limit on a fresh key: never over it.
        let key2 = format!("{key}:3");
        let mut tasks = Vec::new();
        let total = Arc::new(AtomicU64::new(0));
        for _ in 0..3 {
            let lim = Limiter::builder(client.clone())
                .fallback(FallbackMode::FailClosed)
                .build();
            let r = rule(&key2).striped(3);
            let r = if batched { r.batched() } else { r };
            let set = lim.rule_set(vec![r]).await.unwrap();
            let total = total.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..200 {
                    total.fetch_add(
                        u64::from(lim.check(&set, "", 1).await.allowed),
                        Ordering::Relaxed,
                    );
                }
                lim.close().await;
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let total = total.load(Ordering::Relaxed);
        assert!(
            (200..=300).contains(&total),
            "{total} admitted of 300 (batched {batched})"
        );
        // The map has not changed: nothing re-picked.
        assert!(!one.repick_stripes(&set).await.unwrap());
    }
}

#[test]
fn the_kits_crc16_is_the_servers_keyslot() {
    // CLUSTER KEYSLOT needs cluster support; one node, no slots, is enough.
    let server = Server::start_with(
        Kind::Redis,
        &[
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ],
        true,
    );
    let mut conn = server.conn();
    for k in (0..300)
        .map(|i| format!("rl{i}"))
        .chain(["{a}b".into(), "{}x".into(), "x{".into()])
    {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&k)
            .query(&mut conn)
            .unwrap();
        assert_eq!(i64::from(key_slot(&k)), slot, "{k}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_stripes_are_rl0_rl1_rl2_and_batched_striped_holds() {
    let server = Server::start(Kind::Redis);
    let client = client_of(&server).await;
    let limiter = Limiter::builder(client).build();
    let set = limiter
        .rule_set(vec![Rule::token_bucket(90, 3, 3_600_000)
            .fixed_key("sa")
            .striped(3)
            .batched()])
        .await
        .unwrap();
    assert_eq!(set.rules()[0].stripe_tags(), ["rl0", "rl1", "rl2"]);
    let mut admitted = 0;
    for _ in 0..100 {
        admitted += u64::from(limiter.check(&set, "", 1).await.allowed);
    }
    assert_eq!(admitted, 60, "own stripe and the next: 30 + 30");
    limiter.close().await;
    assert_eq!(limiter.held_units(), 0);
}
