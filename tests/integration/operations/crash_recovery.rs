//! A master killed with SIGKILL in the middle of traffic, with
//! `appendonly yes` and `appendfsync always`: after the restart every limiter
//! (and every policy) is exactly as the last acknowledged call left it.

use crate::harness::*;

const KEYS: usize = 30;

fn traffic(con: &mut Connection, round: usize) {
    for i in 0..KEYS * 3 {
        let key = format!("crash:{}", i % KEYS);
        let cost = ((i + round) % 3).to_string();
        let words: Vec<&str> = match i % KEYS % 6 {
            0 => vec!["RL.TOKENBUCKET", &key, "5", "1", "60000", "COST", &cost],
            1 => vec!["RL.FIXEDWINDOW", &key, "4", "600000", "COST", &cost],
            2 => vec!["RL.LEAKYBUCKET", &key, "6", "1", "60000", "COST", &cost],
            3 => vec!["RL.SLIDING", &key, "5", "600000", "COST", &cost],
            4 => vec!["RL.HASHWINDOW", &key, "5", "600000", "60000", "COST", &cost],
            _ => vec!["RL.HIT", "p", &key, "COST", &cost],
        };
        rl(con, &words);
    }
}

fn dumps(con: &mut Connection) -> Vec<Option<Vec<u8>>> {
    (0..KEYS)
        .map(|i| dump(con, &format!("crash:{i}")))
        .collect()
}

#[test]
fn a_killed_master_restarts_with_every_acknowledged_call() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &["--appendonly", "yes", "--appendfsync", "always"]);
        let mut con = server.conn();
        let _: () = query(
            &mut con,
            &["RL.POLICY", "SET", "p", "TOKENBUCKET", "3", "1", "60000"],
        );
        traffic(&mut con, 0);
        traffic(&mut con, 1);
        let before = dumps(&mut con);
        let policy_before: Value = query(&mut con, &["RL.POLICY", "GET", "p"]);
        assert!(
            before.iter().all(Option::is_some),
            "every key holds a limiter"
        );
        server.kill();
        server.restart();
        let mut con = server.conn();
        assert_eq!(dumps(&mut con), before, "limiters differ after the crash");
        let policy_after: Value = query(&mut con, &["RL.POLICY", "GET", "p"]);
        // The rule survives; its counters are in memory and start again at 0.
        let rule = |v: &Value| match v {
            Value::Array(items) => items[..10].to_vec(),
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(rule(&policy_after), rule(&policy_before));
        // and the limiters go on from there
        traffic(&mut con, 2);
    });
}
