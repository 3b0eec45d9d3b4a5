//! The exporter against real servers (redis-server and valkey-server with the
//! module), scraped over HTTP by a real client, every body checked with
//! `promtool check metrics`.

mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use harness::{wait_until, Exporter, Kind, Scrape, Server, PATIENCE};

/// exporter/metrics.txt: name -> (type, labels, help).
fn metrics_txt() -> BTreeMap<String, (String, Vec<String>, String)> {
    let text = include_str!("../metrics.txt");
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (spec, help) = line.split_once(" # ").expect("name type labels... # help");
        let mut words = spec.split_whitespace();
        let name = words.next().unwrap().to_string();
        let kind = words.next().unwrap().to_string();
        let labels = words.map(String::from).collect();
        assert!(
            out.insert(name.clone(), (kind, labels, help.to_string()))
                .is_none(),
            "{name} twice"
        );
    }
    out
}

/// A policy name from its INFO form (the test's own decoder).
fn decode(escaped: &str) -> String {
    let mut out = Vec::new();
    let b = escaped.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            out.push(u8::from_str_radix(&escaped[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// A series: name, labels after `node`, value.
type Expected = (String, Vec<(&'static str, String)>, f64);

/// What the scrape must hold for `node`, from the server's own INFO: every
/// field the exporter maps, as (series, labels after node, value).
fn expected(info: &BTreeMap<String, String>) -> Vec<Expected> {
    let mut out = Vec::new();
    for (field, value) in info {
        let field = field
            .strip_prefix("ratelimit_")
            .expect("a ratelimit_ field");
        if let Some(escaped) = field.strip_prefix("policy_") {
            let policy = decode(escaped);
            for pair in value.split(',') {
                let (k, v) = pair.split_once('=').unwrap();
                let name = match k {
                    "scale" | "stage" => format!("redis_ratelimit_policy_{k}"),
                    _ => format!("redis_ratelimit_policy_{k}_total"),
                };
                out.push((name, vec![("policy", policy.clone())], v.parse().unwrap()));
            }
            continue;
        }
        let v: f64 = value.parse().unwrap();
        let plain = match field {
            "policies" => "redis_ratelimit_policies",
            "upto_calls" => "redis_ratelimit_upto_calls_total",
            "upto_granted_units" => "redis_ratelimit_upto_granted_units_total",
            "upto_partial" => "redis_ratelimit_upto_partial_total",
            "blocked_now" => "redis_ratelimit_blocked",
            "blocked_total" => "redis_ratelimit_blocked_total",
            "blocked_admitted" => "redis_ratelimit_blocked_admitted_total",
            "blocked_timed_out" => "redis_ratelimit_blocked_timed_out_total",
            "deny_log_len" => "redis_ratelimit_deny_log_length",
            "deny_log_max_len" => "redis_ratelimit_deny_log_max_length",
            "bucket_rates" => "redis_ratelimit_bucket_rates",
            "propagation_pinned" => "redis_ratelimit_propagation_pinned",
            // A diagnostic, not exported (docs/operations.md).
            "module_allocations" => continue,
            _ => "",
        };
        if !plain.is_empty() {
            out.push((plain.to_string(), Vec::new(), v));
            continue;
        }
        let (algorithm, counter) = field.rsplit_once('_').unwrap();
        assert!(
            ["calls", "admitted", "denied", "peeks"].contains(&counter),
            "INFO field ratelimit_{field} the test does not know"
        );
        out.push((
            format!("redis_ratelimit_algorithm_{counter}_total"),
            vec![("algorithm", algorithm.to_string())],
            v,
        ));
    }
    out
}

/// Asserts the scrape holds exactly `info`'s values for `node`.
fn assert_matches_info(scrape: &Scrape, node: &str, info: &BTreeMap<String, String>) {
    let want = expected(info);
    let mut per_family: BTreeMap<&str, usize> = BTreeMap::new();
    for (name, labels, value) in &want {
        let mut all: Vec<(&str, &str)> = vec![("node", node)];
        all.extend(labels.iter().map(|(k, v)| (*k, v.as_str())));
        assert_eq!(scrape.get(name, &all), Some(*value), "{name}{all:?}");
        *per_family.entry(name).or_default() += 1;
    }
    // No series beyond the server's fields.
    for (name, n) in per_family {
        assert_eq!(
            scrape.matching(name, &[("node", node)]).len(),
            n,
            "{name} for {node}"
        );
    }
}

/// A clean comparison: INFO read before and after the scrape are equal, so
/// nothing moved while the exporter read; polled until one is clean.
async fn scrape_matching(exporter: &Exporter, servers: &[&Server]) -> Scrape {
    let start = std::time::Instant::now();
    loop {
        // The module's allocations move with every INFO and RL.POLICY GET
        // (and are not exported): left out of the comparison.
        let read = || -> Vec<BTreeMap<String, String>> {
            servers
                .iter()
                .map(|s| {
                    let mut info = s.info();
                    info.remove("ratelimit_module_allocations");
                    info
                })
                .collect()
        };
        let before = read();
        let scrape = exporter.scrape().await;
        let after = read();
        if before == after {
            for (server, info) in servers.iter().zip(&after) {
                assert_matches_info(&scrape, &server.node(), info);
            }
            return scrape;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the servers' INFO never held still"
        );
    }
}

fn policy_value(info: &BTreeMap<String, String>, escaped: &str, key: &str) -> u64 {
    let line = &info[&format!("ratelimit_policy_{escaped}")];
    line.split(',')
        .find_map(|p| p.strip_prefix(&format!("{key}=")))
        .unwrap()
        .parse()
        .unwrap()
}

/// Policies of every kind of state, hit through real commands; a client is
/// left blocked (BLOCK) in the server.
fn traffic(server: &Server) -> std::thread::JoinHandle<()> {
    let ok = |args: &[&str]| {
        server.call(args);
    };
    ok(&[
        "RL.POLICY",
        "SET",
        "POST:/api/order/create",
        "TOKENBUCKET",
        "20",
        "10",
        "1000",
    ]);
    ok(&[
        "RL.POLICY",
        "SET",
        "q\"uote\\back",
        "FIXEDWINDOW",
        "2",
        "3600000",
    ]);
    ok(&[
        "RL.POLICY",
        "SET",
        "shadow",
        "FIXEDWINDOW",
        "1",
        "3600000",
        "MODE",
        "SHADOW",
    ]);
    ok(&[
        "RL.POLICY",
        "SET",
        "adaptive",
        "TOKENBUCKET",
        "5",
        "5",
        "1000",
        "ADAPT",
        "ERRORS",
        "10",
    ]);
    ok(&["RL.POLICY", "SCALE", "adaptive", "40"]);
    ok(&[
        "RL.POLICY",
        "SET",
        "staged",
        "FIXEDWINDOW",
        "1",
        "3600000",
        "STAGES",
        "10",
        "20",
        "WINDOW",
        "3000",
    ]);
    ok(&["RL.POLICY", "SET", "idle", "QUOTA", "1000", "DAY"]);
    for _ in 0..3 {
        ok(&["RL.HIT", "POST:/api/order/create", "user:1"]);
    }
    ok(&["RL.HIT", "POST:/api/order/create", "user:1", "COST", "0"]);
    for _ in 0..5 {
        ok(&["RL.HIT", "q\"uote\\back", "kq"]);
    }
    for _ in 0..4 {
        ok(&["RL.HIT", "shadow", "ks"]);
    }
    ok(&["RL.HIT", "adaptive", "ka"]);
    for _ in 0..5 {
        ok(&["RL.HIT", "staged", "kst"]);
    }
    ok(&["RL.SLIDING", "s", "3", "1000"]);
    ok(&["RL.LEAKYBUCKET", "l", "2", "1", "1000"]);
    for _ in 0..2 {
        ok(&[
            "RL.ALL",
            "2",
            "{u}a",
            "{u}b",
            "TOKENBUCKET",
            "5",
            "5",
            "1000",
            "FIXEDWINDOW",
            "1",
            "3600000",
        ]);
    }
    // A wait that times out, then one that stays blocked: a concurrency
    // limiter waits for its timeout whenever a lease could ever free room.
    ok(&["RL.CONCURRENCY", "c", "1", "3600000"]);
    ok(&["RL.CONCURRENCY", "c", "1", "3600000", "BLOCK", "20"]);
    let url = server.url();
    let blocked = std::thread::spawn(move || {
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        // Ends with an error when the server is killed at the test's end.
        let _ = redis::cmd("RL.CONCURRENCY")
            .arg("c")
            .arg(1)
            .arg(3_600_000)
            .arg("BLOCK")
            .arg(0)
            .query::<redis::Value>(&mut conn);
    });
    wait_until("a client blocked in the server", || {
        server
            .info()
            .get("ratelimit_blocked_now")
            .map(String::as_str)
            == Some("1")
    });
    wait_until("the staged policy at stage 2", || {
        policy_value(&server.info(), "staged", "stage") == 2
    });
    blocked
}

async fn every_series_equals_the_servers_counters(kind: Kind) {
    let server = Server::start(kind);
    let _blocked = traffic(&server);
    let exporter = Exporter::for_servers(&[&server]);
    let scrape = scrape_matching(&exporter, &[&server]).await;
    let node = server.node();
    let n = node.as_str();

    // The values the commands above must have produced (so the comparison
    // with INFO compared something).
    let p = |policy: &str, name: &str| {
        scrape.get(
            &format!("redis_ratelimit_policy_{name}"),
            &[("node", n), ("policy", policy)],
        )
    };
    assert_eq!(p("q\"uote\\back", "calls_total"), Some(5.0));
    assert_eq!(p("q\"uote\\back", "admitted_total"), Some(2.0));
    assert_eq!(p("q\"uote\\back", "denied_total"), Some(3.0));
    assert_eq!(p("POST:/api/order/create", "calls_total"), Some(4.0));
    assert_eq!(p("POST:/api/order/create", "peeks_total"), Some(1.0));
    assert_eq!(p("shadow", "denied_total"), Some(3.0));
    assert_eq!(p("shadow", "shadow_denied_total"), Some(3.0));
    assert_eq!(p("shadow", "admitted_total"), Some(1.0));
    assert_eq!(p("adaptive", "scale"), Some(40.0));
    assert!(p("staged", "stage").unwrap() >= 1.0);
    assert_eq!(p("idle", "calls_total"), Some(0.0));
    let g = |name: &str| scrape.get(name, &[("node", n)]);
    assert_eq!(g("redis_ratelimit_policies"), Some(6.0));
    assert_eq!(g("redis_ratelimit_blocked"), Some(1.0));
    assert_eq!(g("redis_ratelimit_blocked_timed_out_total"), Some(1.0));
    assert!(g("redis_ratelimit_deny_log_length").unwrap() >= 1.0);
    assert_eq!(g("redis_ratelimit_up"), Some(1.0));
    assert_eq!(g("redis_ratelimit_scrape_errors_total"), Some(0.0));
    assert_eq!(g("redis_ratelimit_info_garbled_lines_total"), Some(0.0));
    assert!(g("redis_ratelimit_scrape_duration_seconds").unwrap() > 0.0);
    let a = |alg: &str, c: &str| {
        scrape.get(
            &format!("redis_ratelimit_algorithm_{c}_total"),
            &[("node", n), ("algorithm", alg)],
        )
    };
    assert_eq!(a("all", "calls"), Some(2.0));
    assert_eq!(a("all", "denied"), Some(1.0));
    assert_eq!(a("sliding", "calls"), Some(1.0));
    assert_eq!(a("leakybucket", "admitted"), Some(1.0));
    for alg in [
        "tokenbucket",
        "fixedwindow",
        "leakybucket",
        "sliding",
        "hashwindow",
    ] {
        assert!(a(alg, "calls").is_some(), "{alg}");
    }

    // One fingerprint per policy, 16 hex digits.
    let infos = scrape.matching("redis_ratelimit_policy_info", &[("node", n)]);
    let policies: BTreeSet<&str> = infos
        .iter()
        .map(|(labels, value)| {
            assert_eq!(*value, 1.0);
            let fp = &labels.iter().find(|(k, _)| k == "fingerprint").unwrap().1;
            assert!(
                fp.len() == 16 && fp.bytes().all(|b| b.is_ascii_hexdigit()),
                "{fp}"
            );
            labels
                .iter()
                .find(|(k, _)| k == "policy")
                .unwrap()
                .1
                .as_str()
        })
        .collect();
    let names: BTreeSet<&str> = [
        "POST:/api/order/create",
        "q\"uote\\back",
        "shadow",
        "adaptive",
        "staged",
        "idle",
    ]
    .into();
    assert_eq!(policies, names);
    assert_eq!(infos.len(), 6);

    // Exactly the families of exporter/metrics.txt, with their types, help
    // and labels, each with samples here.
    let listed = metrics_txt();
    let served: BTreeSet<&String> = scrape.families.keys().collect();
    assert_eq!(served, listed.keys().collect::<BTreeSet<_>>());
    for (name, (kind, labels, help)) in &listed {
        let described = &scrape.families[name];
        assert_eq!(&described.kind, kind, "{name}");
        assert_eq!(&described.help, help, "{name}");
        let samples = &scrape.samples[name];
        assert!(!samples.is_empty(), "{name} has no sample");
        for (got, _) in samples {
            let keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
            let want: Vec<&str> = labels.iter().map(String::as_str).collect();
            assert_eq!(keys, want, "{name}");
        }
    }
    assert_eq!(scrape.samples.keys().collect::<BTreeSet<_>>(), served);

    // The counters move with the traffic between scrapes.
    server.call(&["RL.HIT", "q\"uote\\back", "kq"]);
    let again = scrape_matching(&exporter, &[&server]).await;
    assert_eq!(
        again.get(
            "redis_ratelimit_policy_denied_total",
            &[("node", n), ("policy", "q\"uote\\back")]
        ),
        Some(4.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_every_series_equals_the_servers_counters() {
    every_series_equals_the_servers_counters(Kind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_every_series_equals_the_servers_counters() {
    every_series_equals_the_servers_counters(Kind::Valkey).await;
}

fn fingerprints(scrape: &Scrape, policy: &str) -> BTreeMap<String, String> {
    scrape
        .matching("redis_ratelimit_policy_info", &[("policy", policy)])
        .into_iter()
        .map(|(labels, _)| {
            let get = |k: &str| labels.iter().find(|(n, _)| n == k).unwrap().1.clone();
            (get("node"), get("fingerprint"))
        })
        .collect()
}

/// Two nodes (Redis and Valkey, given through RL_EXPORTER_REDIS_URLS): a
/// policy defined differently shows two fingerprints, one defined alike one;
/// then one node is killed and the other is still exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differing_policies_and_a_dead_node() {
    let a = Server::start(Kind::Redis);
    let mut b = Server::start(Kind::Valkey);
    for s in [&a, &b] {
        s.call(&[
            "RL.POLICY",
            "SET",
            "same",
            "FIXEDWINDOW",
            "10",
            "1000",
            "MODE",
            "SHADOW",
        ]);
    }
    a.call(&[
        "RL.POLICY",
        "SET",
        "differs",
        "TOKENBUCKET",
        "20",
        "10",
        "1000",
    ]);
    b.call(&[
        "RL.POLICY",
        "SET",
        "differs",
        "TOKENBUCKET",
        "20",
        "10",
        "2000",
    ]);
    a.call(&[
        "RL.POLICY",
        "SET",
        "rolled",
        "FIXEDWINDOW",
        "5",
        "1000",
        "ROLLOUT",
        "10",
    ]);
    b.call(&[
        "RL.POLICY",
        "SET",
        "rolled",
        "FIXEDWINDOW",
        "5",
        "1000",
        "ROLLOUT",
        "20",
    ]);
    a.call(&["RL.POLICY", "SET", "only-a", "SLIDING", "5", "1000"]);
    // Different traffic and scale on the alike policy: not its definition.
    for _ in 0..3 {
        a.call(&["RL.HIT", "same", "k"]);
    }
    b.call(&["RL.POLICY", "SCALE", "same", "50"]);

    let urls = format!("{}, {}", a.url(), b.url());
    let exporter = Exporter::start(&[], &[("RL_EXPORTER_REDIS_URLS", &urls)]);
    let scrape = scrape_matching(&exporter, &[&a, &b]).await;
    let same = fingerprints(&scrape, "same");
    assert_eq!(same.len(), 2);
    assert_eq!(same.values().collect::<BTreeSet<_>>().len(), 1, "{same:?}");
    for policy in ["differs", "rolled"] {
        let fps = fingerprints(&scrape, policy);
        assert_eq!(fps.len(), 2, "{policy}");
        assert_eq!(
            fps.values().collect::<BTreeSet<_>>().len(),
            2,
            "{policy}: {fps:?}"
        );
    }
    assert_eq!(
        fingerprints(&scrape, "only-a").keys().collect::<Vec<_>>(),
        vec![&a.node()]
    );
    // Setting it alike makes one fingerprint again.
    b.call(&[
        "RL.POLICY",
        "SET",
        "differs",
        "TOKENBUCKET",
        "20",
        "10",
        "1000",
    ]);
    let scrape = scrape_matching(&exporter, &[&a, &b]).await;
    let fps = fingerprints(&scrape, "differs");
    assert_eq!(fps.values().collect::<BTreeSet<_>>().len(), 1, "{fps:?}");

    // A real process kill.
    let (an, bn) = (a.node(), b.node());
    b.kill9();
    let scrape = scrape_matching(&exporter, &[&a]).await;
    let up = |node: &str| scrape.get("redis_ratelimit_up", &[("node", node)]);
    assert_eq!(up(&bn), Some(0.0));
    assert_eq!(up(&an), Some(1.0));
    assert_eq!(
        scrape.get("redis_ratelimit_scrape_errors_total", &[("node", &bn)]),
        Some(1.0)
    );
    assert_eq!(
        scrape.get("redis_ratelimit_scrape_errors_total", &[("node", &an)]),
        Some(0.0)
    );
    assert!(scrape
        .get("redis_ratelimit_scrape_duration_seconds", &[("node", &bn)])
        .is_some());
    // Of the dead node only up and the scrape's own series remain.
    let dead: BTreeSet<&str> = scrape
        .samples
        .iter()
        .filter(|(_, samples)| {
            samples
                .iter()
                .any(|(l, _)| l.iter().any(|(k, v)| k == "node" && *v == bn))
        })
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(
        dead,
        BTreeSet::from([
            "redis_ratelimit_up",
            "redis_ratelimit_scrape_errors_total",
            "redis_ratelimit_scrape_duration_seconds",
            "redis_ratelimit_info_garbled_lines_total",
        ])
    );
    assert_eq!(
        scrape.get(
            "redis_ratelimit_policy_calls_total",
            &[("node", &an), ("policy", "same")]
        ),
        Some(3.0)
    );
    // Errors count per scrape.
    let scrape = exporter.scrape().await;
    assert_eq!(
        scrape.get("redis_ratelimit_scrape_errors_total", &[("node", &bn)]),
        Some(2.0)
    );
}

/// A server without the module is a failed scrape (up 0), not an empty one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_the_module_is_down() {
    let bare = Server::start_bare(Kind::Redis);
    let with = Server::start(Kind::Redis);
    with.call(&["RL.POLICY", "SET", "p", "FIXEDWINDOW", "1", "1000"]);
    let exporter = Exporter::for_servers(&[&bare, &with]);
    let scrape = exporter.scrape().await;
    let node = bare.node();
    assert_eq!(
        scrape.get("redis_ratelimit_up", &[("node", &node)]),
        Some(0.0)
    );
    assert_eq!(
        scrape.get("redis_ratelimit_scrape_errors_total", &[("node", &node)]),
        Some(1.0)
    );
    assert_eq!(
        scrape.get("redis_ratelimit_up", &[("node", &with.node())]),
        Some(1.0)
    );
    assert_eq!(
        scrape.get("redis_ratelimit_policies", &[("node", &with.node())]),
        Some(1.0)
    );

    // Without policy info: no fingerprints, and no RL.POLICY calls.
    let exporter = Exporter::start(
        &["--no-policy-info".into(), "--redis-url".into(), with.url()],
        &[],
    );
    let scrape = exporter.scrape().await;
    assert!(scrape
        .matching("redis_ratelimit_policy_info", &[])
        .is_empty());
    assert_eq!(
        scrape.get("redis_ratelimit_policies", &[("node", &with.node())]),
        Some(1.0)
    );

    // The other routes.
    let (status, _, body) = exporter.get("/").await;
    assert_eq!(status, 200);
    assert!(body.contains("/metrics"));
    assert_eq!(exporter.get("/nope").await.0, 404);
}

/// A node that hangs (SIGSTOP: it accepts nothing, answers nothing) is down
/// after the scrape timeout while the other is exported; once it runs again
/// the next scrape reconnects. The exporter reads as a user with only the
/// ACL permissions docs/operations.md gives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_node_times_out_and_recovers() {
    let hung = Server::start(Kind::Redis);
    let fine = Server::start(Kind::Valkey);
    for s in [&hung, &fine] {
        s.call(&[
            "ACL",
            "SETUSER",
            "exporter",
            "on",
            ">s3cret",
            "+info",
            "+rl.policy|list",
            "+rl.policy|get",
        ]);
        s.call(&["RL.POLICY", "SET", "p", "FIXEDWINDOW", "1", "1000"]);
    }
    let url = |s: &Server| format!("redis://exporter:s3cret@127.0.0.1:{}/", s.port);
    let exporter = Exporter::start(
        &[
            "--scrape-timeout".into(),
            "300ms".into(),
            "--redis-url".into(),
            url(&hung),
            "--redis-url".into(),
            url(&fine),
        ],
        &[],
    );
    let (h, f) = (hung.node(), fine.node());
    let scrape = scrape_matching(&exporter, &[&hung, &fine]).await;
    assert_eq!(
        scrape
            .matching("redis_ratelimit_policy_info", &[("policy", "p")])
            .len(),
        2
    );
    assert_eq!(
        scrape.get("redis_ratelimit_scrape_errors_total", &[("node", &h)]),
        Some(0.0)
    );
    // The password is in no label.
    let body = exporter.get("/metrics").await.2;
    assert!(
        !body.contains("s3cret") && !body.contains("exporter@"),
        "{body}"
    );

    hung.signal("STOP");
    let scrape = exporter.scrape().await;
    hung.signal("CONT");
    assert_eq!(scrape.get("redis_ratelimit_up", &[("node", &h)]), Some(0.0));
    assert_eq!(
        scrape.get("redis_ratelimit_scrape_errors_total", &[("node", &h)]),
        Some(1.0)
    );
    assert_eq!(scrape.get("redis_ratelimit_up", &[("node", &f)]), Some(1.0));
    assert_eq!(
        scrape.get("redis_ratelimit_policies", &[("node", &f)]),
        Some(1.0)
    );
    assert!(scrape
        .get("redis_ratelimit_policies", &[("node", &h)])
        .is_none());

    let scrape = scrape_matching(&exporter, &[&hung, &fine]).await;
    assert_eq!(scrape.get("redis_ratelimit_up", &[("node", &h)]), Some(1.0));
    assert_eq!(
        scrape.get("redis_ratelimit_scrape_errors_total", &[("node", &h)]),
        Some(1.0)
    );
}

/// Bad flags and variables stop the exporter at once with status 2 and an
/// error naming them.
#[test]
fn bad_configuration_is_refused() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(harness::exporter_binary())
            .args(args)
            .env_remove("RL_EXPORTER_REDIS_URLS")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, err, _) = run(&["--listen", "nowhere"], &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--listen \"nowhere\""), "{err}");
    let (code, err, _) = run(&["--redis-url", "http://x"], &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--redis-url"), "{err}");
    let (code, err, _) = run(&[], &[("RL_EXPORTER_SCRAPE_TIMEOUT", "0s")]);
    assert_eq!(code, Some(2));
    assert!(err.contains("RL_EXPORTER_SCRAPE_TIMEOUT"), "{err}");
    let (code, _, out) = run(&["--help"], &[]);
    assert_eq!(code, Some(0));
    assert!(out.contains("--redis-url URL"), "{out}");
    // A port already taken is an error naming --listen, not a panic.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, err, _) = run(&["--listen", &addr], &[]);
    assert_eq!(code, Some(1));
    assert!(err.contains(&format!("--listen {addr}")), "{err}");
}

/// `total_connections_received` of a server, read over `admin` (one
/// connection kept for it, so reading does not count itself).
fn connections_received(admin: &mut redis::Connection) -> u64 {
    let stats: String = redis::cmd("INFO").arg("stats").query(admin).unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_connections_received in INFO stats")
}

/// An error reply (a node without the module, a user the ACL does not let
/// run RL.POLICY) is a failed scrape, but the connection it came on is fine:
/// the exporter keeps it instead of reconnecting (and authenticating) at
/// every scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_replies_keep_the_connection() {
    let bare = Server::start_bare(Kind::Redis);
    let limited = Server::start(Kind::Valkey);
    limited.call(&["ACL", "SETUSER", "infoonly", "on", ">pw", "+info"]);
    limited.call(&["RL.POLICY", "SET", "p", "FIXEDWINDOW", "1", "1000"]);
    let exporter = Exporter::start(
        &[
            "--redis-url".into(),
            bare.url(),
            "--redis-url".into(),
            format!("redis://infoonly:pw@127.0.0.1:{}/", limited.port),
        ],
        &[],
    );
    let (b, l) = (bare.node(), limited.node());
    let mut admins = [bare.conn(), limited.conn()];
    let first = exporter.scrape().await;
    assert_eq!(first.get("redis_ratelimit_up", &[("node", &b)]), Some(0.0));
    // INFO answered; RL.POLICY refused: up, no fingerprints, an error.
    assert_eq!(first.get("redis_ratelimit_up", &[("node", &l)]), Some(1.0));
    assert_eq!(
        first.get("redis_ratelimit_policies", &[("node", &l)]),
        Some(1.0)
    );
    assert!(first
        .matching("redis_ratelimit_policy_info", &[])
        .is_empty());
    let before: Vec<u64> = admins.iter_mut().map(connections_received).collect();
    for _ in 0..3 {
        exporter.scrape().await;
    }
    let after: Vec<u64> = admins.iter_mut().map(connections_received).collect();
    assert_eq!(
        after, before,
        "connections opened by 3 scrapes (bare, limited)"
    );
    let last = exporter.scrape().await;
    for node in [&b, &l] {
        assert_eq!(
            last.get("redis_ratelimit_scrape_errors_total", &[("node", node)]),
            Some(5.0),
            "{node}"
        );
    }
}
