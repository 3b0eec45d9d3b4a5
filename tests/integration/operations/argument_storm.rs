//! Tens of thousands of random argument vectors against every command on a
//! live server (a tenth of it is binary junk): every reply is an error or a well-formed reply, the server
//! keeps answering, and a call that failed created no key.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::harness::*;

/// A small deterministic generator (xorshift64*), so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

const COMMANDS: &[&str] = &[
    "RL.TOKENBUCKET",
    "RL.FIXEDWINDOW",
    "RL.LEAKYBUCKET",
    "RL.SLIDING",
    "RL.HASHWINDOW",
    "RL.ALL",
    "RL.HIT",
    "RL.POLICY",
    "RL.LOG",
    "RL.SETSTATE",
];

const WORDS: &[&str] = &[
    "",
    "0",
    "1",
    "2",
    "5",
    "60",
    "1000",
    "60000",
    "-1",
    "+1",
    "01",
    "1.5",
    "1e3",
    "0x10",
    "1099511627776",
    "1099511627777",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999999",
    "-9223372036854775808",
    "abc",
    "COST",
    "cost",
    "AT",
    "MODE",
    "ROLLOUT",
    "SHADOW",
    "OFF",
    "ENFORCE",
    "POLICY",
    "TOKENBUCKET",
    "FIXEDWINDOW",
    "LEAKYBUCKET",
    "SLIDING",
    "HASHWINDOW",
    "SET",
    "GET",
    "DEL",
    "LIST",
    "LEN",
    "RESET",
    "HELP",
    "p1",
    " ",
    "\u{0}",
    "\r\n",
    "\u{ff}\u{fe}",
    "😀",
];

/// Well-formed calls, which the storm then mutates now and then.
const TEMPLATES: &[&str] = &[
    "RL.TOKENBUCKET {k} 5 1 1000",
    "RL.FIXEDWINDOW {k} 3 60000 COST 2",
    "RL.LEAKYBUCKET {k} 4 1 100",
    "RL.SLIDING {k} 3 1000",
    "RL.HASHWINDOW {k} 3 6000 1000",
    "RL.ALL 2 {k} {k}:g TOKENBUCKET 5 1 1000 FIXEDWINDOW 10 1000",
    "RL.POLICY SET p1 TOKENBUCKET 3 1 1000 MODE SHADOW",
    "RL.HIT p1 {k}",
    "RL.LOG GET 3",
];

fn random_call(rng: &mut Rng, key: &str) -> Vec<Vec<u8>> {
    if rng.next().is_multiple_of(2) {
        let template = rng.pick(TEMPLATES).replace("{k}", key);
        let mut argv: Vec<Vec<u8>> = template.split(' ').map(|w| w.as_bytes().to_vec()).collect();
        if rng.next().is_multiple_of(3) {
            let at = 1 + (rng.next() as usize) % (argv.len() - 1);
            argv[at] = rng.pick(WORDS).as_bytes().to_vec();
        }
        return argv;
    }
    let mut argv: Vec<Vec<u8>> = vec![rng.pick(COMMANDS).as_bytes().to_vec()];
    // Most calls carry the call's own key where a key usually goes.
    if !rng.next().is_multiple_of(4) {
        argv.push(key.as_bytes().to_vec());
    }
    let extra = rng.next() % 9;
    for _ in 0..extra {
        match rng.next() % 6 {
            0 => argv.push((0..rng.next() % 16).map(|_| rng.next() as u8).collect()),
            1 => argv.push(key.as_bytes().to_vec()),
            _ => argv.push(rng.pick(WORDS).as_bytes().to_vec()),
        }
    }
    argv
}

/// One reply, as much as the test needs of it.
#[derive(Debug)]
enum Reply {
    Error(String),
    Fine,
}

fn read_line(reader: &mut impl BufRead) -> Vec<u8> {
    let mut line = Vec::new();
    reader
        .read_until(b'\n', &mut line)
        .expect("server closed the connection");
    assert!(line.ends_with(b"\r\n"), "malformed reply line {line:?}");
    line.truncate(line.len() - 2);
    line
}

/// Reads one RESP2 reply, checking that it is well formed.
fn read_reply(reader: &mut impl BufRead) -> Reply {
    let line = read_line(reader);
    let (kind, rest) = line.split_first().expect("empty reply line");
    let number = || -> i64 {
        std::str::from_utf8(rest)
            .unwrap()
            .parse()
            .expect("a number")
    };
    match kind {
        b'+' | b':' => Reply::Fine,
        b'-' => Reply::Error(String::from_utf8_lossy(rest).into_owned()),
        b'$' => {
            let len = number();
            if len >= 0 {
                let mut body = vec![0; len as usize + 2];
                reader.read_exact(&mut body).unwrap();
                assert_eq!(&body[len as usize..], b"\r\n");
            }
            Reply::Fine
        }
        b'*' => {
            for _ in 0..number().max(0) {
                if let Reply::Error(e) = read_reply(reader) {
                    panic!("an error nested in an array: {e}");
                }
            }
            Reply::Fine
        }
        other => panic!("unknown reply type {:?}", *other as char),
    }
}

fn encode(argv: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", argv.len()).into_bytes();
    for arg in argv {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

#[test]
fn random_arguments_never_break_the_server_or_write_on_error() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut writer = stream.try_clone().unwrap();
        let mut reader = BufReader::new(stream);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut failed_keys = Vec::new();
        let (mut errors, mut fine) = (0, 0);
        for batch in 0..40 {
            let mut payload = Vec::new();
            let mut keys = Vec::new();
            for i in 0..500 {
                let key = format!("storm:{batch}:{i}");
                payload.extend(encode(&random_call(&mut rng, &key)));
                keys.push(key);
            }
            writer.write_all(&payload).unwrap();
            for key in keys {
                match read_reply(&mut reader) {
                    Reply::Error(_) => {
                        errors += 1;
                        failed_keys.push(key);
                    }
                    Reply::Fine => fine += 1,
                }
            }
        }
        assert!(
            errors > 1000 && fine > 1000,
            "{errors} errors, {fine} replies"
        );
        let mut con = server.conn();
        let _: () = query(&mut con, &["PING"]);
        for chunk in failed_keys.chunks(1000) {
            let mut words = vec!["EXISTS"];
            words.extend(chunk.iter().map(String::as_str));
            let existing: i64 = query(&mut con, &words);
            assert_eq!(existing, 0, "a failed call created a key");
        }
    });
}
