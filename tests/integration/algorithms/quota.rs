//! `RL.QUOTA key limit DAY|WEEK|MONTH|YEAR [TZ zone]` against real servers:
//! the period ends where the calendar of its zone says (checked against an
//! independent computation of today's boundaries with the `jiff` crate),
//! replicas and the AOF agree because the master propagates the end, a
//! change of zone keeps the count, policies and `RL.ALL` take quotas, and
//! bad periods and zones are errors naming the argument. The boundaries of
//! chosen days (23- and 25-hour days, leap days, ISO weeks across a year
//! end) run through the command's step at those instants in the unit tests
//! (`src/commands/tests_steps.rs`), since a client cannot set a server's
//! clock.

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::Timestamp;

use crate::harness::*;

/// Milliseconds from `now_us` until the next start of `period` in `zone`.
fn to_period_end_ms(now_us: u64, period: &str, zone: &str) -> i64 {
    let tz = match zone {
        "UTC" => TimeZone::UTC,
        "+05:30" => TimeZone::fixed(jiff::tz::Offset::from_seconds(5 * 3600 + 1800).unwrap()),
        name => TimeZone::get(name).expect("a zone"),
    };
    let now = Timestamp::from_microsecond(now_us as i64).unwrap();
    let date = now.to_zoned_datetime(tz.clone()).date();
    let next: Date = match period {
        "DAY" => date.tomorrow().unwrap(),
        "WEEK" => {
            let days = 7 - i64::from(date.weekday().to_monday_zero_offset());
            date.checked_add(jiff::Span::new().days(days)).unwrap()
        }
        "MONTH" => date.last_of_month().tomorrow().unwrap(),
        _ => Date::new(date.year() + 1, 1, 1).unwrap(),
    };
    let end_us = next
        .to_zoned_datetime(tz)
        .unwrap()
        .timestamp()
        .as_microsecond();
    (end_us - now_us as i64 + 999) / 1000
}

fn quota(con: &mut Connection, words: &[&str]) -> Reply {
    let mut call = vec!["RL.QUOTA"];
    call.extend_from_slice(words);
    rl(con, &call)
}

#[test]
fn each_period_ends_where_its_zones_calendar_says() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // Calls across a period's end would count in two periods: every
        // zone here starts its days, weeks, months and years on a multiple
        // of 30 minutes UTC, so 20 s clear of one, the test runs in one.
        away_from_window_end(&mut con, 1_800_000, 20_000);
        for (i, (period, zone)) in [
            ("DAY", "UTC"),
            ("DAY", "+05:30"),
            ("DAY", "America/New_York"),
            ("WEEK", "Europe/Paris"),
            ("MONTH", "Asia/Tokyo"),
            ("YEAR", "America/New_York"),
        ]
        .into_iter()
        .enumerate()
        {
            let key = format!("q{i}");
            let before = server_time_us(&mut con);
            let r = quota(&mut con, &[&key, "3", period, "TZ", zone]);
            let after = server_time_us(&mut con);
            assert!(r.allowed && r.limit == 3 && r.remaining == 2, "{r:?}");
            let (latest, earliest) = (
                to_period_end_ms(before, period, zone),
                to_period_end_ms(after, period, zone),
            );
            assert!(
                (earliest..=latest).contains(&r.reset_ms),
                "{period} in {zone}: reset {} not in {earliest}..={latest}",
                r.reset_ms
            );
            let ttl = pttl(&mut con, &key);
            assert!(
                ttl <= r.reset_ms && ttl >= r.reset_ms - 1000,
                "PTTL {ttl}, {r:?}"
            );
            assert_eq!(key_type(&mut con, &key), "rl-quotas");
        }
        // The default zone is UTC.
        let r = quota(&mut con, &["utc", "3", "DAY"]);
        let now = server_time_us(&mut con);
        assert!(
            (r.reset_ms - to_period_end_ms(now, "DAY", "UTC")).abs() <= 1000,
            "{r:?}"
        );
    });
}

#[test]
fn the_limit_holds_until_the_period_ends_and_a_new_zone_keeps_the_count() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // Calls across a period's end would count in two periods: every
        // zone here starts its days, weeks, months and years on a multiple
        // of 30 minutes UTC, so 20 s clear of one, the test runs in one.
        away_from_window_end(&mut con, 1_800_000, 20_000);
        assert!(quota(&mut con, &["k", "2", "MONTH", "COST", "2"]).allowed);
        let denied = quota(&mut con, &["k", "2", "MONTH"]);
        assert!(!denied.allowed, "{denied:?}");
        assert_eq!(denied.wait_ms, denied.reset_ms, "wait until the next month");
        assert_eq!(
            quota(&mut con, &["k", "2", "MONTH", "COST", "3"]).wait_ms,
            -1
        );
        // Another zone and period: the count stays in the month it was in.
        let moved = quota(&mut con, &["k", "2", "DAY", "TZ", "Pacific/Auckland"]);
        assert!(!moved.allowed && moved.remaining == 0, "{moved:?}");
        // A raised limit gives room at once; the count carries over.
        let raised = quota(&mut con, &["k", "5", "MONTH"]);
        assert!(raised.allowed && raised.remaining == 2, "{raised:?}");
        // A refund gives back units of the current period.
        let refunded = quota(&mut con, &["k", "5", "MONTH", "REFUND", "1"]);
        assert_eq!(refunded.remaining, 3);
    });
}

#[test]
fn replicas_and_the_aof_agree_without_their_own_zone_database() {
    for_each_server(|kind| {
        let mut master = Server::start(kind, &["--appendonly", "yes"]);
        let replica = replica_of(&master);
        let mut con = master.conn();
        // Calls across a period's end would count in two periods: every
        // zone here starts its days, weeks, months and years on a multiple
        // of 30 minutes UTC, so 20 s clear of one, the test runs in one.
        away_from_window_end(&mut con, 1_800_000, 20_000);
        let keys: Vec<String> = (0..4).map(|i| format!("r{i}")).collect();
        for (key, (period, zone)) in keys.iter().zip([
            ("DAY", "America/New_York"),
            ("WEEK", "+05:30"),
            ("MONTH", "Australia/Lord_Howe"),
            ("YEAR", "UTC"),
        ]) {
            for _ in 0..3 {
                quota(&mut con, &[key, "2", period, "TZ", zone]);
            }
        }
        let _: String = query(
            &mut con,
            &["RL.POLICY", "SET", "monthly", "QUOTA", "10", "MONTH"],
        );
        assert!(rl(&mut con, &["RL.HIT", "monthly", "r4"]).allowed);
        let mut keys = keys;
        keys.push("r4".to_string());
        wait_for_sync(&master, &replica);
        assert_same_dataset(&master, &replica, &keys);
        let before: Vec<Option<Vec<u8>>> = keys.iter().map(|k| dump(&mut con, k)).collect();
        drop(con);
        master.restart();
        let mut con = master.conn();
        let after: Vec<Option<Vec<u8>>> = keys.iter().map(|k| dump(&mut con, k)).collect();
        assert_eq!(before, after, "the AOF replays the quotas");
        // The master's stream carries the end, never the zone.
        let monitor_free = quota(
            &mut con,
            &["r0", "2", "DAY", "TZ", "America/New_York", "COST", "0"],
        );
        assert_eq!(monitor_free.remaining, 0);
    });
}

#[test]
fn policies_and_rl_all_take_quotas_and_bad_input_is_named() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // Calls across a period's end would count in two periods: every
        // zone here starts its days, weeks, months and years on a multiple
        // of 30 minutes UTC, so 20 s clear of one, the test runs in one.
        away_from_window_end(&mut con, 1_800_000, 20_000);
        let _: String = query(
            &mut con,
            &["RL.POLICY", "SET", "daily", "QUOTA", "1", "DAY"],
        );
        let got: Vec<Value> = query(&mut con, &["RL.POLICY", "GET", "daily"]);
        let params = match &got[5] {
            Value::Array(items) => items.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(params[0], Value::Int(1));
        assert_eq!(
            params[1],
            Value::BulkString(b"DAY".to_vec()),
            "the period as its word"
        );
        assert!(rl(&mut con, &["RL.HIT", "daily", "p"]).allowed);
        assert!(!rl(&mut con, &["RL.HIT", "daily", "p"]).allowed);
        let all: Vec<i64> = query(
            &mut con,
            &[
                "RL.ALL",
                "2",
                "{u}q",
                "{u}t",
                "QUOTA",
                "3",
                "WEEK",
                "TOKENBUCKET",
                "5",
                "1",
                "1000",
            ],
        );
        assert_eq!((all[0], all[1], all[2], all[5]), (1, 3, 2, 0));
        for (call, error) in [
            (
                vec!["RL.QUOTA", "e", "5", "FORTNIGHT"],
                "ERR period must be one of DAY, WEEK, MONTH, YEAR, not 'FORTNIGHT'",
            ),
            (
                vec!["RL.QUOTA", "e", "5", "DAY", "TZ", "Mars/Olympus"],
                "ERR TZ must be UTC, a fixed offset such as +05:30, or a time zone name such as America/New_York, not 'Mars/Olympus'",
            ),
            (
                vec!["RL.QUOTA", "e", "0", "DAY"],
                "ERR limit must be an integer from 1 to 1099511627776",
            ),
            (
                vec!["RL.QUOTA", "e", "5", "DAY", "END", "1"],
                "ERR END is reserved for replication and AOF loading",
            ),
        ] {
            assert_eq!(query_err(&mut con, &call), error, "{call:?}");
        }
        assert!(!exists(&mut con, "e"), "nothing written on an error");
        assert!(query_err(&mut con, &["RL.QUOTA", "e", "5"]).contains("wrong number of arguments"));
    });
}

#[test]
fn a_policy_counts_its_quota_in_its_zone_and_keeps_it_across_a_restart() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &["--appendonly", "yes"]);
        let mut con = server.conn();
        // Calls across a period's end would count in two periods: every
        // zone here starts its days, weeks, months and years on a multiple
        // of 30 minutes UTC, so 20 s clear of one, the test runs in one.
        away_from_window_end(&mut con, 1_800_000, 20_000);
        let set = [
            "RL.POLICY",
            "SET",
            "ny",
            "QUOTA",
            "5",
            "DAY",
            "TZ",
            "America/New_York",
        ];
        let _: String = query(&mut con, &set);
        let got: Vec<Value> = query(&mut con, &["RL.POLICY", "GET", "ny"]);
        let zone = got
            .iter()
            .position(|v| *v == Value::BulkString(b"zone".to_vec()));
        assert_eq!(
            got[zone.expect("a zone field") + 1],
            Value::BulkString(b"America/New_York".to_vec())
        );
        let before = server_time_us(&mut con);
        let hit = rl(&mut con, &["RL.HIT", "ny", "t"]);
        let after = server_time_us(&mut con);
        let (latest, earliest) = (
            to_period_end_ms(before, "DAY", "America/New_York"),
            to_period_end_ms(after, "DAY", "America/New_York"),
        );
        assert!((earliest..=latest).contains(&hit.reset_ms), "{hit:?}");
        // RL.ALL through the policy counts in its zone too, and so does an
        // inline spec that names its zone.
        let all: Vec<i64> = query(&mut con, &["RL.ALL", "1", "t2", "POLICY", "ny"]);
        assert!((earliest - 1000..=latest).contains(&all[4]), "{all:?}");
        let inline: Vec<i64> = query(
            &mut con,
            &[
                "RL.ALL",
                "2",
                "{i}q",
                "{i}t",
                "QUOTA",
                "5",
                "DAY",
                "TZ",
                "America/New_York",
                "TOKENBUCKET",
                "5",
                "1",
                "1000",
            ],
        );
        assert!(
            (earliest - 1000..=latest).contains(&inline[4]),
            "{inline:?}"
        );
        let err = query_err(
            &mut con,
            &["RL.ALL", "1", "{i}z", "QUOTA", "5", "DAY", "TZ", "Mars"],
        );
        assert!(err.starts_with("ERR spec 1: TZ must be"), "{err}");
        // TZ is for quotas only.
        let err = query_err(
            &mut con,
            &[
                "RL.POLICY",
                "SET",
                "x",
                "FIXEDWINDOW",
                "5",
                "1000",
                "TZ",
                "UTC",
            ],
        );
        assert!(err.contains("unknown option 'TZ'"), "{err}");
        // The zone survives an RDB save and a restart (the policies' RDB form).
        save(&mut con);
        drop(con);
        server.restart();
        let mut con = server.conn();
        let got: Vec<Value> = query(&mut con, &["RL.POLICY", "GET", "ny"]);
        assert!(
            got.contains(&Value::BulkString(b"America/New_York".to_vec())),
            "{got:?}"
        );
    });
}

/// A fixed offset goes from -18:00 to +18:00, the range of java.time's
/// `ZoneOffset` (which the Java kit parses zones with): beyond it the
/// command, a policy and an inline spec of `RL.ALL` are errors naming `TZ`,
/// and nothing is written.
#[test]
fn fixed_offsets_beyond_18_hours_are_refused_naming_tz() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for offset in ["+18:00", "-18:00"] {
            let key = format!("in{offset}");
            let r = quota(&mut con, &[&key, "5", "DAY", "TZ", offset]);
            assert_eq!((r.allowed, r.remaining), (true, 4), "{offset}: {r:?}");
            let _: i64 = query(&mut con, &["DEL", &key]);
        }
        for offset in ["+25:00", "-25:00", "+18:01", "-19:00", "+99:00"] {
            let expected =
                format!("ERR TZ offset must be between -18:00 and +18:00, not '{offset}'");
            let call = ["RL.QUOTA", "q", "5", "DAY", "TZ", offset];
            assert_eq!(query_err(&mut con, &call), expected);
            let call = ["RL.POLICY", "SET", "p", "QUOTA", "5", "DAY", "TZ", offset];
            assert_eq!(query_err(&mut con, &call), expected);
            let call = ["RL.ALL", "1", "q", "QUOTA", "5", "DAY", "TZ", offset];
            assert_eq!(
                query_err(&mut con, &call),
                format!("ERR spec 1: {}", &expected[4..])
            );
        }
        let policies: Vec<Value> = query(&mut con, &["RL.POLICY", "LIST"]);
        assert!(policies.is_empty(), "{policies:?}");
        assert_eq!(dbsize(&mut con), 0, "nothing written on an error");
    });
}
