//! Limiter commands inside `MULTI`/`EXEC`, Lua scripts (`EVAL`) and functions
//! (`FCALL`): same replies, same atomicity, and exact replication.

use crate::harness::*;

const TB_SLOW: &[&str] = &["RL.TOKENBUCKET", "tb", "5", "1", "1000000"];

/// Runs `words` as one transaction and returns `EXEC`'s reply.
fn transaction(con: &mut Connection, commands: &[&[&str]]) -> Value {
    let _: () = query(con, &["MULTI"]);
    for words in commands {
        let queued: String = query(con, words);
        assert_eq!(queued, "QUEUED", "{words:?}");
    }
    query(con, &["EXEC"])
}

fn items(value: Value) -> Vec<Value> {
    match value {
        Value::Array(items) => items,
        other => panic!("expected an array, got {other:?}"),
    }
}

#[test]
fn calls_inside_multi_exec_apply_in_order() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let fw: &[&str] = &["RL.FIXEDWINDOW", "fw", "2", "1000000"];
        let replies = items(transaction(
            &mut con,
            &[
                TB_SLOW, TB_SLOW, TB_SLOW, TB_SLOW, TB_SLOW, TB_SLOW, fw, fw, fw,
            ],
        ));
        let replies: Vec<Reply> = replies.iter().map(Reply::from_value).collect();
        let allowed: Vec<bool> = replies.iter().map(|r| r.allowed).collect();
        assert_eq!(
            allowed,
            [true, true, true, true, true, false, true, true, false]
        );
        let remaining: Vec<i64> = replies.iter().map(|r| r.remaining).collect();
        assert_eq!(remaining, [4, 3, 2, 1, 0, 0, 1, 0, 0]);
    });
}

#[test]
fn failing_call_inside_multi_changes_nothing_and_the_rest_applies() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let _: () = query(&mut con, &["SET", "string", "x"]);
        let _: () = query(&mut con, &["MULTI"]);
        let _: String = query(&mut con, TB_SLOW);
        let _: String = query(&mut con, &["RL.TOKENBUCKET", "tb", "0", "1", "1000000"]);
        let _: String = query(&mut con, &["RL.FIXEDWINDOW", "string", "5", "1000"]);
        let _: String = query(
            &mut con,
            &["RL.TOKENBUCKET", "bad", "5", "1", "1000", "COST", "-1"],
        );
        let _: String = query(&mut con, TB_SLOW);
        // EXEC's reply holds the errors in place; read it raw.
        let exec = command(&["EXEC"]).query::<Value>(&mut con);
        if let Ok(Value::Array(replies)) = &exec {
            assert_eq!(replies.len(), 5, "{exec:?}");
            assert_eq!(Reply::from_value(&replies[0]).remaining, 4);
            assert!(matches!(replies[1], Value::ServerError(_)), "{exec:?}");
            assert!(matches!(replies[2], Value::ServerError(_)), "{exec:?}");
            assert!(matches!(replies[3], Value::ServerError(_)), "{exec:?}");
            assert_eq!(Reply::from_value(&replies[4]).remaining, 3);
        }
        // Whatever the client made of the reply, the server state is exact.
        let r = rl(
            &mut con,
            &["RL.TOKENBUCKET", "tb", "5", "1", "1000000", "COST", "0"],
        );
        assert_eq!(r.remaining, 3, "EXEC reply: {exec:?}");
        assert!(!exists(&mut con, "bad"));
        let value: String = query(&mut con, &["GET", "string"]);
        assert_eq!(value, "x");
    });
}

#[test]
fn arity_error_inside_multi_aborts_the_transaction() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let _: () = query(&mut con, &["MULTI"]);
        let _: String = query(&mut con, TB_SLOW);
        let err = query_err(&mut con, &["RL.TOKENBUCKET", "tb", "5", "1"]);
        assert!(err.contains("wrong number of arguments"), "{err}");
        let err = query_err(&mut con, &["EXEC"]);
        assert!(err.starts_with("EXECABORT"), "{err}");
        assert!(!exists(&mut con, "tb"));
    });
}

const HIT_SCRIPT: &str = "return redis.call('RL.TOKENBUCKET', KEYS[1], 5, 1, 1000000)";

#[test]
fn calls_inside_eval_reply_as_outside() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for remaining in [4, 3, 2, 1, 0] {
            let r = Reply::from_value(&query(&mut con, &["EVAL", HIT_SCRIPT, "1", "tb"]));
            assert_eq!(
                (r.allowed, r.limit, r.remaining, r.wait_ms),
                (true, 5, remaining, 0)
            );
        }
        let r = Reply::from_value(&query(&mut con, &["EVAL", HIT_SCRIPT, "1", "tb"]));
        assert!(!r.allowed);
        assert_eq!(key_type(&mut con, "tb"), "rl-tokbkt");
        // The same key, outside the script, sees the same state.
        assert!(!rl(&mut con, TB_SLOW).allowed);
    });
}

#[test]
fn script_sees_admission_and_can_act_on_it() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // Count only admitted requests, atomically with the limiter.
        let script = "local r = redis.call('RL.FIXEDWINDOW', KEYS[1], 3, 1000000) \
                      if r[1] == 1 then redis.call('INCR', KEYS[2]) end \
                      return r[3]";
        for _ in 0..5 {
            let _: i64 = query(&mut con, &["EVAL", script, "2", "fw", "admitted"]);
        }
        let admitted: i64 = query(&mut con, &["GET", "admitted"]);
        assert_eq!(admitted, 3);
    });
}

#[test]
fn errors_inside_eval_are_catchable_and_write_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let script = "local r = redis.pcall('RL.TOKENBUCKET', KEYS[1], 0, 1, 1000) \
                      return r['err']";
        let err: String = query(&mut con, &["EVAL", script, "1", "tb"]);
        assert!(err.contains("capacity"), "{err}");
        let script = "local r = redis.pcall('RL.TOKENBUCKET', KEYS[1], 5, 1, 1000, 'AT', 1) \
                      return r['err']";
        let err: String = query(&mut con, &["EVAL", script, "1", "tb"]);
        assert!(err.contains("AT is reserved"), "AT inside a script: {err}");
        let err = query_err(
            &mut con,
            &[
                "EVAL",
                "return redis.call('RL.FIXEDWINDOW', KEYS[1], 5, 0)",
                "1",
                "fw",
            ],
        );
        assert!(err.contains("window_ms"), "{err}");
        assert_eq!(dbsize(&mut con), 0);
    });
}

const LIBRARY: &str = "#!lua name=rltest\n\
    redis.register_function('hit', function(keys, args) \
    return redis.call('RL.TOKENBUCKET', keys[1], args[1], 1, 1000000) end)";

#[test]
fn calls_inside_functions_reply_as_outside() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let _: String = query(&mut con, &["FUNCTION", "LOAD", LIBRARY]);
        for remaining in [2, 1, 0] {
            let r = Reply::from_value(&query(&mut con, &["FCALL", "hit", "1", "tb", "3"]));
            assert_eq!((r.allowed, r.remaining), (true, remaining));
        }
        let r = Reply::from_value(&query(&mut con, &["FCALL", "hit", "1", "tb", "3"]));
        assert!(!r.allowed);
    });
}

#[test]
fn multi_eval_and_fcall_replicate_exactly() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let (mut m, mut r) = (master.conn(), replica.conn());
        let _: String = query(&mut m, &["FUNCTION", "LOAD", LIBRARY]);
        let fw: &[&str] = &["RL.FIXEDWINDOW", "fw", "4", "1000000"];
        for _ in 0..3 {
            transaction(&mut m, &[TB_SLOW, fw, TB_SLOW]);
            let _: Value = query(&mut m, &["EVAL", HIT_SCRIPT, "1", "tb:eval"]);
            let _: Value = query(&mut m, &["FCALL", "hit", "1", "tb:fcall", "4"]);
        }
        wait_for_sync(&master, &replica);
        for key in ["tb", "fw", "tb:eval", "tb:fcall"] {
            let state = dump(&mut m, key);
            assert!(state.is_some(), "{key} missing on the master");
            assert_eq!(dump(&mut r, key), state, "{key} differs on the replica");
        }
    });
}
