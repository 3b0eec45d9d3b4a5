//! Above `maxmemory` (noeviction), a limiter call that would create a key
//! fails with Redis's OOM error and writes nothing, while limiters that
//! already exist keep working: they are updated in place.

use crate::harness::*;

#[test]
fn above_maxmemory_existing_limiters_work_and_new_ones_get_oom() {
    for_each_server(|kind| {
        let server = Server::start(kind, &["--maxmemory-policy", "noeviction"]);
        let mut con = server.conn();
        rl(&mut con, &["RL.TOKENBUCKET", "tb:old", "100", "1", "60000"]);
        rl(&mut con, &["RL.FIXEDWINDOW", "fw:old", "100", "60000"]);
        let used: u64 = info_field(&server.info("memory"), "used_memory")
            .unwrap()
            .parse()
            .unwrap();
        // Any limit below what is used puts the server out of memory.
        let limit = (used / 2).to_string();
        let _: () = query(&mut con, &["CONFIG", "SET", "maxmemory", &limit]);

        let err = query_err(&mut con, &["RL.TOKENBUCKET", "tb:new", "100", "1", "60000"]);
        assert!(err.starts_with("OOM"), "{err}");
        let err = query_err(&mut con, &["RL.FIXEDWINDOW", "fw:new", "100", "60000"]);
        assert!(err.starts_with("OOM"), "{err}");
        assert!(!exists(&mut con, "tb:new") && !exists(&mut con, "fw:new"));

        let r = rl(&mut con, &["RL.TOKENBUCKET", "tb:old", "100", "1", "60000"]);
        assert!(r.allowed);
        assert_eq!(r.remaining, 98);
        let r = rl(&mut con, &["RL.FIXEDWINDOW", "fw:old", "100", "60000"]);
        assert!(r.allowed);
        // Peeking never allocates, so it works on a new key too.
        let r = rl(
            &mut con,
            &["RL.TOKENBUCKET", "tb:new", "100", "1", "60000", "COST", "0"],
        );
        assert_eq!((r.allowed, r.remaining), (true, 100));
        let _: () = query(&mut con, &["CONFIG", "SET", "maxmemory", "0"]);
        assert!(rl(&mut con, &["RL.TOKENBUCKET", "tb:new", "100", "1", "60000"]).allowed);
    });
}

/// All or nothing holds under `maxmemory` too: an `RL.ALL` that would create
/// a key answers OOM before any limiter changes, so the existing limiters in
/// the call keep every unit (inline specs and policies alike).
#[test]
fn rl_all_that_would_create_a_key_fails_whole_above_maxmemory() {
    for_each_server(|kind| {
        let server = Server::start(kind, &["--maxmemory-policy", "noeviction"]);
        let mut con = server.conn();
        let _: () = query(
            &mut con,
            &["RL.POLICY", "SET", "p", "TOKENBUCKET", "10", "1", "60000"],
        );
        for old in ["{u}a", "{u}c"] {
            rl(&mut con, &["RL.TOKENBUCKET", old, "10", "1", "60000"]);
        }
        let before = (dump(&mut con, "{u}a"), dump(&mut con, "{u}c"));
        let used: u64 = info_field(&server.info("memory"), "used_memory")
            .unwrap()
            .parse()
            .unwrap();
        let limit = (used / 2).to_string();
        let _: () = query(&mut con, &["CONFIG", "SET", "maxmemory", &limit]);

        let calls: [&[&str]; 3] = [
            &[
                "RL.ALL",
                "2",
                "{u}a",
                "{u}b",
                "TOKENBUCKET",
                "10",
                "1",
                "60000",
                "TOKENBUCKET",
                "10",
                "1",
                "60000",
            ],
            &["RL.ALL", "2", "{u}a", "{u}b", "POLICY", "p", "POLICY", "p"],
            &[
                "RL.ALL",
                "3",
                "{u}a",
                "{u}c",
                "{u}b",
                "TOKENBUCKET",
                "10",
                "1",
                "60000",
                "POLICY",
                "p",
                "FIXEDWINDOW",
                "5",
                "60000",
                "COST",
                "2",
                "FORCE",
            ],
        ];
        for words in calls {
            let err = query_err(&mut con, words);
            assert!(err.starts_with("OOM"), "{words:?}: {err}");
        }
        assert!(!exists(&mut con, "{u}b"));
        assert_eq!(
            (dump(&mut con, "{u}a"), dump(&mut con, "{u}c")),
            before,
            "an RL.ALL that failed with OOM changed a limiter"
        );
        let r = rl(
            &mut con,
            &["RL.TOKENBUCKET", "{u}a", "10", "1", "60000", "COST", "0"],
        );
        assert_eq!(r.remaining, 9, "{r:?}");
        // Existing keys only: no allocation, so the call goes through.
        let r: Vec<i64> = query(
            &mut con,
            &[
                "RL.ALL",
                "2",
                "{u}a",
                "{u}c",
                "TOKENBUCKET",
                "10",
                "1",
                "60000",
                "POLICY",
                "p",
            ],
        );
        assert_eq!((r[0], r[2]), (1, 8), "{r:?}");
    });
}
