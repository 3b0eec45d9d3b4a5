//! Sustained pipelined load on a master with a replica: many clients, deep
//! pipelines, every algorithm, `RL.HIT` and `RL.ALL` over one shared
//! keyspace. Every reply is a well-formed decision, the server counts no
//! failed or rejected call, the replica receives exactly the admitted calls
//! (denials and `COST 0` propagate nothing) over a link that never drops or
//! resynchronises, sends no error back to its master, and ends with the
//! master's dataset, byte for byte.

use std::thread;
use std::time::Instant;

use crate::harness::*;

/// Client connections sending at once.
const CLIENTS: usize = 16;
/// Commands per pipeline.
const PIPELINE: usize = 64;
/// Pipelines each client sends: the load is bounded by a command count
/// (16 * 64 * 300 = 307,200 commands), not by wall time.
const PIPELINES_PER_CLIENT: usize = 300;
/// Limiters per algorithm (and `RL.HIT` keys), shared by every client.
const KEYS_PER_ALGORITHM: usize = 1000;

/// The limiter calls a replica executed: everything `rl.*` but the policy
/// commands.
fn limiter_calls(stats: &[(String, String, u64)]) -> u64 {
    stats
        .iter()
        .filter(|(command, field, _)| field == "calls" && !command.starts_with("rl.policy"))
        .map(|(_, _, calls)| calls)
        .sum()
}

/// `sync_full` from the master's `INFO stats`: the full syncs it has served.
fn full_syncs_via(master: &mut Connection) -> u64 {
    info_field(&info_via(master, "stats"), "sync_full")
        .and_then(|v| v.parse().ok())
        .expect("sync_full in INFO stats")
}

/// Asserts no `rl.*` command failed or was rejected on `server`.
fn assert_no_failed_calls(server: &Server, role: &str) {
    let stats = command_stats(server, "rl.");
    assert!(
        stats.iter().any(|(_, field, _)| field == "failed_calls"),
        "{role}: INFO commandstats reports no failed_calls for RL commands"
    );
    let failures: Vec<_> = stats
        .iter()
        .filter(|(_, field, value)| {
            (field == "failed_calls" || field == "rejected_calls") && *value > 0
        })
        .collect();
    assert!(failures.is_empty(), "{role}: {failures:?}");
}

#[test]
fn sustained_pipelined_load_with_a_replica_has_no_errors_and_no_divergence() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let mut con = master.conn();
        let traffic = MixedTraffic::new(&mut con, KEYS_PER_ALGORITHM);
        let mut tally = Tally::default();
        for calls in traffic.preload().chunks(PIPELINE * 16) {
            send_checked(&mut con, calls, &mut tally);
        }

        // Error replies are counted over connections opened beforehand: a new
        // connection's `CLIENT SETINFO` is itself an error on Redis 7.0.
        let connections: Vec<Connection> = (0..CLIENTS).map(|_| master.conn()).collect();
        let mut r = replica.conn();
        let master_errors = error_replies_via(&mut con);
        let replica_errors = error_replies_via(&mut r);
        let full_syncs = full_syncs_via(&mut con);

        let started = Instant::now();
        thread::scope(|scope| {
            let clients: Vec<_> = connections
                .into_iter()
                .enumerate()
                .map(|(client, mut con)| {
                    let traffic = &traffic;
                    scope.spawn(move || {
                        let mut rng = Xorshift64(0x10ad_0000_0001 + client as u64);
                        let mut tally = Tally::default();
                        for _ in 0..PIPELINES_PER_CLIENT {
                            let calls: Vec<MixedCall> =
                                (0..PIPELINE).map(|_| traffic.random(&mut rng)).collect();
                            send_checked(&mut con, &calls, &mut tally);
                        }
                        tally
                    })
                })
                .collect();
            for client in clients {
                tally.add(&client.join().expect("a client failed"));
            }
        });
        let load_time = started.elapsed();
        assert_eq!(
            error_replies_via(&mut con),
            master_errors,
            "error replies from the master during the load; {}",
            info_via(&mut con, "errorstats")
        );
        let preloaded = traffic.keys().len() as u64;
        let sent = (CLIENTS * PIPELINE * PIPELINES_PER_CLIENT) as u64;
        assert_eq!(
            tally.total(),
            preloaded + sent,
            "one checked reply per command"
        );
        assert!(tally.admitted > 0 && tally.denied > 0, "{tally:?}");

        // The master ran each command exactly once, and none failed.
        let master_stats = command_stats(&master, "rl.");
        for (command, count) in &tally.sent {
            assert_eq!(
                command_stat(&master_stats, command, "calls"),
                *count,
                "calls of {command} in the master's INFO commandstats"
            );
        }
        assert_no_failed_calls(&master, "master");

        wait_for_sync_via(&mut con, &mut r);
        assert_eq!(
            error_replies_via(&mut r),
            replica_errors,
            "error replies on the replica (to its master link) during the load; {}",
            info_via(&mut r, "errorstats")
        );
        assert_no_failed_calls(&replica, "replica");
        // "This replica is sending an error to its master" (Valkey: "... its
        // primary"), logged when a propagated command fails on the replica.
        assert!(
            !replica.log().contains("is sending an error to its"),
            "the replica refused a command of its master; its log:\n{}",
            replica.log()
        );
        // The link held: still up, and no full resync (after an output
        // buffer overflow, for one) sent the dataset again.
        assert_eq!(
            info_field(&info_via(&mut r, "replication"), "master_link_status").as_deref(),
            Some("up"),
            "the replica's link to its master after the load"
        );
        assert_eq!(
            full_syncs_via(&mut con),
            full_syncs,
            "full syncs the master served during the load"
        );
        let keys = traffic.keys();
        assert_eq!(dbsize(&mut con), keys.len() as i64, "every limiter exists");
        assert_same_dataset(&master, &replica, &keys);
        // Denials and COST 0 propagate nothing: the replica ran one limiter
        // call per admitted limiter, no more.
        let replicated = limiter_calls(&command_stats(&replica, "rl."));
        assert!(
            (tally.propagated_exactly..=tally.propagated_exactly + tally.propagated_at_most)
                .contains(&replicated),
            "the replica ran {replicated} limiter calls; expected {} plus at most {} \
             from shadow policies",
            tally.propagated_exactly,
            tally.propagated_at_most
        );
        eprintln!(
            "{kind}: {} commands ({preloaded} to create the keys, then {CLIENTS} clients x \
             {PIPELINES_PER_CLIENT} pipelines x {PIPELINE}) in {load_time:?}: {} admitted, \
             {} denied; the replica ran {replicated} limiter calls (expected {} plus at most \
             {} from shadow policies); by command: {:?}",
            tally.total(),
            tally.admitted,
            tally.denied,
            tally.propagated_exactly,
            tally.propagated_at_most,
            tally.sent
        );
    });
}
