//! Above `maxmemory` (noeviction), a limiter call that would create a key
//! fails with Redis's OOM error and writes nothing, while limiters that
//! already exist keep working: they are updated in place.

mod common;

use common::*;

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
