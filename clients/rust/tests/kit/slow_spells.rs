//! Redis made slow for short spells (`CLIENT PAUSE` shorter and longer than
//! the deadline, `DEBUG SLEEP`) while two instances send bursts for one key,
//! with the kit's defaults (a 100 ms deadline, the local-only fallback).
//! A call that timed out may still be admitted by Redis when it wakes, so
//! the fallback decides against the instance's account, where that call is
//! charged: the instances together admit at most `limit + (N - 1) * s`, each
//! at most `limit`, and a decision the fallback admitted carries its
//! account's fields, not a full quota. What the fallback admits while the
//! breaker is open Redis never saw: it is sent before the key's next call,
//! so the bound holds when Redis answers again within the window.

use std::time::Duration;

use redis_ratelimit_client::{BreakerConfig, Client, Decision, Limiter, Path, Rule, RuleSet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;

use crate::harness::{Server, PATIENCE};

const LIMIT: u64 = 10;
const INSTANCES: u64 = 2;
/// This instance's share: ceil(10 / 2 * 1.1).
const SHARE: u64 = 6;
/// A sliding window far longer than the test: no unit leaves it meanwhile.
const WINDOW_MS: u64 = 600_000;
/// Longer than the default deadline (100 ms); `SHORT_MS` is shorter.
const LONG_MS: u64 = 400;
const SHORT_MS: u64 = 20;

struct Instance {
    limiter: Limiter,
    set: RuleSet,
    admitted: u64,
    decided: u64,
}

impl Instance {
    async fn start(server: &Server) -> Instance {
        Instance::with_breaker(server, BreakerConfig::default()).await
    }

    async fn with_breaker(server: &Server, breaker: BreakerConfig) -> Instance {
        let client = Client::standalone(&server.url()).await.unwrap();
        // Without the deny cache, every request of the burst is decided.
        let limiter = Limiter::builder(client)
            .instances(INSTANCES)
            .deny_cache(false)
            .breaker(breaker)
            .build();
        let set = limiter
            .rule_set(vec![Rule::sliding(LIMIT, WINDOW_MS).name("per-user")])
            .await
            .unwrap();
        Instance {
            limiter,
            set,
            admitted: 0,
            decided: 0,
        }
    }

    fn tally(&mut self, d: &Decision) {
        self.decided += 1;
        self.admitted += d.allowed as u64;
    }

    /// `n` requests of the same user at once.
    fn burst(&self, n: usize) -> JoinSet<Decision> {
        let mut tasks = JoinSet::new();
        for _ in 0..n {
            let (limiter, set) = (self.limiter.clone(), self.set.clone());
            tasks.spawn(async move { limiter.check(&set, "burst", 1).await });
        }
        tasks
    }

    async fn collect(&mut self, mut tasks: JoinSet<Decision>) {
        while let Some(d) = tasks.join_next().await {
            self.tally(&d.unwrap());
        }
    }

    fn timeouts(&self) -> u64 {
        self.limiter.stats().redis_timeouts
    }
}

/// `CLIENT PAUSE ms ALL`: every client's commands wait until it ends.
fn pause(server: &Server, ms: u64) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("ALL")
        .query(&mut server.conn())
        .unwrap();
}

/// Returns once the server answers another client (a pause has ended).
fn answering(server: &Server) {
    let _: String = redis::cmd("PING").query(&mut server.conn()).unwrap();
}

/// `DEBUG SLEEP` sent on a connection of its own, its reply left for
/// [`woken`]: the server sleeps from when it reads it.
async fn debug_sleep(server: &Server, ms: u64) -> tokio::net::TcpStream {
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    let secs = format!("{:.3}", ms as f64 / 1000.0);
    let cmd = format!(
        "*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n${}\r\n{secs}\r\n",
        secs.len()
    );
    conn.write_all(cmd.as_bytes()).await.unwrap();
    conn
}

async fn woken(mut conn: tokio::net::TcpStream) {
    let mut reply = [0u8; 5];
    conn.read_exact(&mut reply).await.unwrap();
    assert_eq!(&reply, b"+OK\r\n");
}

/// Polls with requests (decided, so tallied) until the breaker has closed
/// and Redis decides again.
async fn back_to_redis(inst: &mut Instance) {
    let start = std::time::Instant::now();
    loop {
        let d = inst.limiter.check(&inst.set, "burst", 1).await;
        inst.tally(&d);
        if d.path == Path::Redis {
            return;
        }
        assert!(start.elapsed() < PATIENCE, "the breaker never closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_spells_admit_no_more_than_the_stated_bound() {
    let server = Server::start(crate::harness::Kind::Redis);
    let mut a = Instance::start(&server).await;
    let mut b = Instance::start(&server).await;

    // Healthy: Redis admits 3 for each instance.
    for inst in [&mut a, &mut b] {
        for _ in 0..3 {
            let d = inst.limiter.check(&inst.set, "burst", 1).await;
            assert_eq!(d.path, Path::Redis);
            inst.tally(&d);
        }
    }

    // A pause shorter than the deadline: late answers, still Redis's.
    pause(&server, SHORT_MS);
    let (ta, tb) = (a.burst(1), b.burst(1));
    a.collect(ta).await;
    b.collect(tb).await;
    answering(&server);

    // Pauses longer than the deadline during a burst of 10 per instance,
    // until both instances have seen calls time out (the calls then run
    // when the pause ends). The breaker opens; the fallback decides.
    let mut spells = 0;
    while a.timeouts() == 0 || b.timeouts() == 0 {
        spells += 1;
        assert!(spells <= 20, "no call missed its deadline in 20 spells");
        pause(&server, LONG_MS);
        let (ta, tb) = (a.burst(10), b.burst(10));
        a.collect(ta).await;
        b.collect(tb).await;
        answering(&server);
    }
    back_to_redis(&mut a).await;
    back_to_redis(&mut b).await;

    // The server asleep (`DEBUG SLEEP`) during a burst, the same way.
    let (before_a, before_b) = (a.timeouts(), b.timeouts());
    let mut spells = 0;
    while a.timeouts() == before_a || b.timeouts() == before_b {
        spells += 1;
        assert!(spells <= 20, "no call missed its deadline in 20 sleeps");
        let sleeper = debug_sleep(&server, LONG_MS).await;
        let (ta, tb) = (a.burst(10), b.burst(10));
        a.collect(ta).await;
        b.collect(tb).await;
        woken(sleeper).await;
    }
    back_to_redis(&mut a).await;
    back_to_redis(&mut b).await;

    // Healthy again: one more burst, which Redis decides.
    let (ta, tb) = (a.burst(10), b.burst(10));
    a.collect(ta).await;
    b.collect(tb).await;

    let fallback: u64 = [&a, &b]
        .iter()
        .map(|i| i.limiter.stats().fallback_admitted + i.limiter.stats().fallback_denied)
        .sum();
    assert!(fallback > 0, "the fallback decided some requests");
    let bound = LIMIT + (INSTANCES - 1) * SHARE;
    let (admitted_a, admitted_b) = (a.admitted, b.admitted);
    eprintln!(
        "slow spells: admitted {} + {} = {} of {} decided (limit {LIMIT}, bound {bound}); \
         fallback decided {fallback}",
        admitted_a,
        admitted_b,
        admitted_a + admitted_b,
        a.decided + b.decided
    );
    assert!(
        admitted_a + admitted_b <= bound,
        "{admitted_a} + {admitted_b} admitted: above limit + (N - 1) * s = {bound}"
    );
    assert!(
        admitted_a <= LIMIT && admitted_b <= LIMIT,
        "{admitted_a} and {admitted_b}: one instance above the limit"
    );
}

#[tokio::test]
async fn a_fallback_admission_carries_its_account_fields_not_a_full_quota() {
    let server = Server::start(crate::harness::Kind::Redis);
    let mut inst = Instance::start(&server).await;
    for _ in 0..2 {
        let d = inst.limiter.check(&inst.set, "burst", 1).await;
        assert_eq!((d.path, d.allowed), (Path::Redis, true));
        inst.tally(&d);
    }
    // One request during a pause longer than the deadline (again, should
    // the host stall so long that the pause ends first).
    let fallback = loop {
        assert!(inst.decided < 6, "no call missed its deadline");
        pause(&server, LONG_MS);
        let d = inst.limiter.check(&inst.set, "burst", 1).await;
        inst.tally(&d);
        answering(&server);
        if d.path == Path::Fallback {
            break d;
        }
    };
    // Every unit so far is charged to the account of SHARE: the ones Redis
    // admitted, and this one.
    assert!(fallback.allowed, "{fallback:?}");
    assert_eq!(
        (fallback.limit, fallback.remaining),
        (LIMIT, SHARE - inst.decided),
        "{fallback:?}"
    );
    assert!(
        fallback.reset_after > Duration::ZERO
            && fallback.reset_after <= Duration::from_millis(WINDOW_MS),
        "{fallback:?}"
    );
    // The call that timed out ran when the pause ended: Redis counted it.
    let d = inst.limiter.check(&inst.set, "burst", 1).await;
    inst.tally(&d);
    assert_eq!((d.path, d.allowed), (Path::Redis, true), "{d:?}");
    assert_eq!(d.remaining, LIMIT - inst.decided, "{d:?}");
}

#[tokio::test]
async fn what_the_fallback_admits_without_a_call_is_counted_in_redis_before_the_next_one() {
    let server = Server::start(crate::harness::Kind::Redis);
    // The breaker opens at the first timeout, so the rest of the spell is
    // decided without calls.
    let mut inst = Instance::with_breaker(
        &server,
        BreakerConfig {
            failures: 1,
            open_for: Duration::from_millis(200),
        },
    )
    .await;
    let mut spells = 0;
    while inst.limiter.stats().breaker_skipped == 0 {
        spells += 1;
        assert!(spells <= 20, "the breaker never opened in 20 spells");
        pause(&server, 1000);
        for _ in 0..10 {
            let d = inst.limiter.check(&inst.set, "burst", 1).await;
            inst.tally(&d);
        }
        answering(&server);
        back_to_redis(&mut inst).await;
    }
    // Redis decides again: a burst of twice the limit.
    for _ in 0..2 * LIMIT {
        let d = inst.limiter.check(&inst.set, "burst", 1).await;
        inst.tally(&d);
    }
    let stats = inst.limiter.stats();
    eprintln!(
        "breaker open: admitted {} of {} (limit {LIMIT}, share {SHARE}); {stats:?}",
        inst.admitted, inst.decided
    );
    assert!(stats.fallback_admitted > 0, "{stats:?}");
    assert!(
        inst.admitted <= LIMIT,
        "{} admitted by one instance: above max(limit, s) = {LIMIT}",
        inst.admitted
    );
}
