//! The module skips building pinned calls while nothing can consume the
//! replication stream (see src/replicate.rs). These tests pin that every
//! consumer appearing later still receives an exact stream: a replica attached
//! after traffic, AOF switched on at runtime, and a master restarted from its
//! RDB whose replica resumes with a partial resync.

use crate::harness::*;

const KEYS: usize = 24;

/// Mixed traffic over token buckets and fixed windows of 12 units: each
/// round a key asks for 0 to 12 of them, so every round has admissions and
/// the second and third have denials. Nothing refills or expires for
/// minutes, so that master and replica, or a server before and after a
/// reload, can be compared key by key.
fn traffic(con: &mut Connection, round: usize) {
    for i in 0..KEYS * 4 {
        let key = format!("k:{}", i % KEYS);
        let cost = ((i + round) % 4).to_string();
        if i % KEYS < KEYS / 2 {
            rl(
                con,
                &["RL.TOKENBUCKET", &key, "12", "3", "600000", "COST", &cost],
            );
        } else {
            rl(
                con,
                &["RL.FIXEDWINDOW", &key, "12", "3600000", "COST", &cost],
            );
        }
    }
}

fn dumps(con: &mut Connection) -> Vec<Option<Vec<u8>>> {
    (0..KEYS).map(|i| dump(con, &format!("k:{i}"))).collect()
}

fn assert_same_state(master: &Server, replica: &Server) {
    wait_for_sync(master, replica);
    let (mut m, mut r) = (master.conn(), replica.conn());
    assert_eq!(
        dumps(&mut m),
        dumps(&mut r),
        "replica state differs from master"
    );
}

#[test]
fn a_replica_attached_after_traffic_reaches_the_master_state() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let mut con = master.conn();
        traffic(&mut con, 0);
        let replica = replica_of(&master);
        assert_same_state(&master, &replica);
        traffic(&mut con, 1);
        assert_same_state(&master, &replica);
        assert!(master
            .log()
            .contains("propagated with the master's time pinned"));
    });
}

#[test]
fn aof_switched_on_at_runtime_replays_to_the_same_state() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let mut con = master.conn();
        traffic(&mut con, 0);
        let _: () = query(&mut con, &["CONFIG", "SET", "appendonly", "yes"]);
        poll_until(
            "AOF rewrite done",
            std::time::Duration::from_secs(20),
            || {
                let info = master.info("persistence");
                info_field(&info, "aof_enabled").as_deref() == Some("1")
                    && info_field(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
                    && info_field(&info, "aof_rewrite_scheduled").as_deref() == Some("0")
            },
        );
        traffic(&mut con, 1);
        traffic(&mut con, 2);
        let before = dumps(&mut con);
        let _: () = query(&mut con, &["DEBUG", "LOADAOF"]);
        assert_eq!(dumps(&mut con), before, "AOF replay differs");
    });
}

#[test]
fn a_master_restarted_from_rdb_keeps_its_replica_exact() {
    for_each_server(|kind| {
        let mut master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let mut con = master.conn();
        traffic(&mut con, 0);
        assert_same_state(&master, &replica);
        save(&mut con);
        // Keep the replica busy while the master restarts and takes traffic,
        // so that traffic reaches it only later, from the restored backlog.
        let mut busy = replica.conn();
        let sleeper = std::thread::spawn(move || {
            let _: Value = command(&["DEBUG", "SLEEP", "2"]).query(&mut busy).unwrap();
        });
        master.restart();
        let mut con = master.conn();
        traffic(&mut con, 1);
        traffic(&mut con, 2);
        sleeper.join().unwrap();
        poll_until(
            "replica link up again",
            std::time::Duration::from_secs(20),
            || {
                let info = replica.info("replication");
                info_field(&info, "master_link_status").as_deref() == Some("up")
            },
        );
        assert_same_state(&master, &replica);
        assert!(
            master.log().contains("Partial resynchronization request"),
            "the replica was expected to resume from the backlog"
        );
    });
}
