//! The hot paths allocate nothing: on live keys, every limiter call (admitted,
//! denied, forced, refunded), `RL.HIT`, `RL.ALL` and `CL.THROTTLE`, with a replica attached so
//! that every change is propagated in its pinned form. Measured with the
//! module's own count of the blocks it allocates (`INFO ratelimit`'s
//! `module_allocations`), against what two `INFO` calls alone cost.

use crate::harness::*;

fn allocations(con: &mut Connection) -> u64 {
    info_field(&info_via(con, "ratelimit"), "ratelimit_module_allocations")
        .or_else(|| info_field(&info_via(con, "ratelimit"), "module_allocations"))
        .expect("module_allocations in INFO ratelimit")
        .parse()
        .expect("a count")
}

/// Blocks allocated by `calls`, beyond what reading the count costs.
fn allocated_by(con: &mut Connection, calls: &[Vec<&str>]) -> u64 {
    let a = allocations(con);
    let b = allocations(con);
    let reading = b - a;
    let mut pipe = redis::pipe();
    for words in calls {
        pipe.add_command(command(words)).ignore();
    }
    let _: () = pipe.query(con).expect("the calls");
    let c = allocations(con);
    c - b - reading
}

#[test]
fn hot_paths_allocate_nothing() {
    for_each_server(|kind| {
        let master = Server::start(kind, QUIET_MASTER);
        let _replica = replica_of(&master);
        let mut con = master.conn();
        assert_eq!(
            info_field(
                &info_via(&mut con, "ratelimit"),
                "ratelimit_propagation_pinned"
            )
            .or_else(|| info_field(&info_via(&mut con, "ratelimit"), "propagation_pinned"))
            .as_deref(),
            Some("1"),
            "a replica makes propagation pinned"
        );
        let _: () = query(
            &mut con,
            &[
                "RL.POLICY",
                "SET",
                "api",
                "TOKENBUCKET",
                "1000000",
                "1",
                "1000",
            ],
        );
        let _: () = query(
            &mut con,
            &[
                "RL.POLICY",
                "SET",
                "win",
                "FIXEDWINDOW",
                "1000000",
                "86400000",
            ],
        );
        let calls: Vec<Vec<&str>> = vec![
            vec!["RL.TOKENBUCKET", "tb", "1000000", "1", "1000"],
            vec!["RL.TOKENBUCKET", "tb", "1000000", "1", "1000", "COST", "3"],
            vec![
                "RL.TOKENBUCKET",
                "tb",
                "1000000",
                "1",
                "1000",
                "COST",
                "2",
                "FORCE",
            ],
            vec![
                "RL.TOKENBUCKET",
                "tb",
                "1000000",
                "1",
                "1000",
                "REFUND",
                "2",
            ],
            vec!["RL.TOKENBUCKET", "tb", "1000000", "1", "1000", "COST", "0"],
            vec!["RL.FIXEDWINDOW", "fw", "1000000", "86400000"],
            vec!["RL.LEAKYBUCKET", "lb", "1000000", "1", "1000"],
            vec!["RL.HASHWINDOW", "hw", "1000000", "60000", "1000"],
            vec!["RL.HIT", "api", "user:1"],
            vec!["RL.HIT", "api", "user:1", "COST", "2", "FORCE"],
            vec!["RL.HIT", "api", "user:1", "REFUND", "1"],
            vec!["RL.HIT", "win", "user:3"],
            vec![
                "RL.ALL",
                "2",
                "{a}1",
                "{a}2",
                "POLICY",
                "api",
                "FIXEDWINDOW",
                "1000000",
                "86400000",
            ],
            // CL.THROTTLE: its string rewritten in place, propagated as SET.
            vec!["CL.THROTTLE", "cell", "999999", "1", "1"],
            vec!["RL.THROTTLE", "cell", "999999", "1", "1", "0"],
            // Denials: the deny log is full after the warm-up, and a full
            // ring records in place.
            vec!["RL.TOKENBUCKET", "full", "1", "1", "100000000"],
            vec!["CL.THROTTLE", "cell-full", "0", "1", "100000"],
            vec!["RL.HIT", "api", "user:2", "COST", "2000000"],
        ];
        // Warm up: keys created, the deny log filled, propagation strings made.
        for _ in 0..200 {
            let _: () = calls
                .iter()
                .fold(&mut redis::pipe(), |p, words| {
                    p.add_command(command(words)).ignore()
                })
                .query(&mut con)
                .expect("the warm-up");
        }
        let repeated: Vec<Vec<&str>> = (0..50).flat_map(|_| calls.clone()).collect();
        assert_eq!(
            allocated_by(&mut con, &repeated),
            0,
            "{} calls on live keys allocated",
            repeated.len()
        );
    });
}
