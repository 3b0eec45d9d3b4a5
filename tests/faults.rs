//! Faults a limiter must survive: a replica whose link is cut mid-traffic
//! ends byte-identical to its master, and under `maxmemory` with an eviction
//! policy, limiter keys are evicted like any other key while the server keeps
//! serving.

mod common;

use common::*;

const KEYS: usize = 40;

fn traffic(con: &mut Connection, round: usize) {
    for i in 0..KEYS * 2 {
        let key = format!("f:{}", i % KEYS);
        let cost = ((i + round) % 3).to_string();
        if i % 2 == 0 {
            rl(
                con,
                &["RL.TOKENBUCKET", &key, "5", "1", "60000", "COST", &cost],
            );
        } else {
            rl(con, &["RL.SLIDING", &key, "5", "600000", "COST", &cost]);
        }
    }
}

fn dumps(con: &mut Connection) -> Vec<Option<Vec<u8>>> {
    (0..KEYS).map(|i| dump(con, &format!("f:{i}"))).collect()
}

#[test]
fn a_replica_whose_link_was_cut_ends_byte_identical() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let mut con = master.conn();
        traffic(&mut con, 0);
        // Cut the link from the replica side, keep writing, let it resume.
        let mut r = replica.conn();
        let _: Value = query(&mut r, &["CLIENT", "KILL", "TYPE", "master"]);
        traffic(&mut con, 1);
        poll_until(
            "replica link up again",
            std::time::Duration::from_secs(20),
            || {
                let info = replica.info("replication");
                info_field(&info, "master_link_status").as_deref() == Some("up")
            },
        );
        traffic(&mut con, 2);
        wait_for_sync(&master, &replica);
        assert_eq!(dumps(&mut con), dumps(&mut r));
    });
}

#[test]
fn eviction_removes_limiter_keys_safely() {
    for_each_server(|kind| {
        let server = Server::start(kind, &["--maxmemory-policy", "allkeys-lru"]);
        let mut con = server.conn();
        let used: u64 = info_field(&server.info("memory"), "used_memory")
            .unwrap()
            .parse()
            .unwrap();
        // Room for a few thousand limiters above what the server uses.
        let limit = (used + 600_000).to_string();
        let _: () = query(&mut con, &["CONFIG", "SET", "maxmemory", &limit]);
        for i in 0..20_000 {
            let key = format!("ev:{i}");
            // Never an error: eviction makes room for each new key.
            rl(&mut con, &["RL.TOKENBUCKET", &key, "5", "1", "60000"]);
        }
        let evicted: u64 = info_field(&server.info("stats"), "evicted_keys")
            .unwrap()
            .parse()
            .unwrap();
        assert!(evicted > 0, "the test should have filled memory");
        assert!(dbsize(&mut con) < 20_000);
        // An evicted limiter is an idle one: it starts again full.
        let r = rl(
            &mut con,
            &["RL.TOKENBUCKET", "ev:0", "5", "1", "60000", "COST", "0"],
        );
        assert!(r.remaining == 5 || r.remaining == 4, "{r:?}");
        let _: () = query(&mut con, &["PING"]);
    });
}
