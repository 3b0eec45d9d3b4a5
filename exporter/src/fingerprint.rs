//! A policy's fingerprint: a short stable hash of its definition as
//! `RL.POLICY GET` answers it, so that nodes holding different definitions
//! of one policy show different `fingerprint` labels.
//!
//! The definition is every field of the reply but the name, the counters and
//! the protection loop's live state (`scale`, `stage`): `algorithm`, `params`,
//! `mode`, `rollout`, `zone`, `adapt`, `stages`, `window_ms`, and any field a
//! newer module adds. Fields are sorted by name and each value is written
//! with its length, integers and strings alike as text, so RESP2 and RESP3
//! replies give the same hash; the hash is 64-bit FNV-1a, printed as 16
//! lower-case hex digits.

use redis::Value;

/// Fields of `RL.POLICY GET` that are not the definition.
const NOT_DEFINITION: &[&str] = &[
    "name",
    "calls",
    "admitted",
    "denied",
    "shadow_denied",
    "peeks",
    "scale",
    "stage",
];

/// The fingerprint of a `RL.POLICY GET` reply: `Ok(None)` when the policy is
/// gone (nil), `Err` with what was wrong for a reply of another shape.
pub fn of_reply(reply: &Value) -> Result<Option<String>, String> {
    let pairs: Vec<(&Value, &Value)> = match reply {
        Value::Nil => return Ok(None),
        Value::Array(items) => {
            if items.len() % 2 != 0 {
                return Err(format!("RL.POLICY GET: {} items, not pairs", items.len()));
            }
            items.chunks(2).map(|p| (&p[0], &p[1])).collect()
        }
        Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
        other => return Err(format!("RL.POLICY GET: unexpected reply {other:?}")),
    };
    let mut fields = Vec::with_capacity(pairs.len());
    for (k, v) in pairs {
        let key = scalar(k).ok_or_else(|| format!("RL.POLICY GET: field name {k:?}"))?;
        if !NOT_DEFINITION.contains(&key.as_str()) {
            fields.push((key, v));
        }
    }
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    let mut canonical = Vec::new();
    for (key, value) in fields {
        write_text(&mut canonical, key.as_bytes());
        write_value(&mut canonical, value)?;
    }
    Ok(Some(format!("{:016x}", fnv1a(&canonical))))
}

/// A scalar reply as text; `None` for aggregates.
fn scalar(v: &Value) -> Option<String> {
    Some(match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".to_string(),
        Value::Int(i) => i.to_string(),
        Value::Double(d) => d.to_string(),
        Value::Boolean(b) => (if *b { "1" } else { "0" }).to_string(),
        Value::VerbatimString { text, .. } => text.clone(),
        _ => return None,
    })
}

fn write_text(out: &mut Vec<u8>, text: &[u8]) {
    out.extend_from_slice(format!("s{}:", text.len()).as_bytes());
    out.extend_from_slice(text);
}

fn write_value(out: &mut Vec<u8>, v: &Value) -> Result<(), String> {
    match v {
        Value::Nil => out.push(b'n'),
        Value::Array(items) | Value::Set(items) => {
            out.extend_from_slice(format!("a{}:", items.len()).as_bytes());
            for item in items {
                write_value(out, item)?;
            }
        }
        Value::Map(pairs) => {
            out.extend_from_slice(format!("m{}:", pairs.len()).as_bytes());
            for (k, v) in pairs {
                write_value(out, k)?;
                write_value(out, v)?;
            }
        }
        other => match scalar(other) {
            Some(text) => write_text(out, text.as_bytes()),
            None => return Err(format!("RL.POLICY GET: unexpected value {other:?}")),
        },
    }
    Ok(())
}

/// 64-bit FNV-1a: stable across versions and platforms (std's hashers are not).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// `RL.POLICY GET checkout` as RESP2 gives it, with counters and state.
    fn reply(limit: &str, calls: i64, scale: i64) -> Value {
        Value::Array(vec![
            bulk("name"),
            bulk("checkout"),
            bulk("algorithm"),
            bulk("TOKENBUCKET"),
            bulk("params"),
            Value::Array(vec![Value::Int(20), bulk(limit), Value::Int(1000)]),
            bulk("mode"),
            bulk("SHADOW"),
            bulk("rollout"),
            Value::Int(50),
            bulk("calls"),
            Value::Int(calls),
            bulk("admitted"),
            Value::Int(calls),
            bulk("denied"),
            Value::Int(0),
            bulk("shadow_denied"),
            Value::Int(0),
            bulk("adapt"),
            Value::Array(vec![Value::Int(10), Value::Int(80)]),
            bulk("scale"),
            Value::Int(scale),
            bulk("stage"),
            Value::Int(0),
        ])
    }

    #[test]
    fn counters_and_state_do_not_change_it() {
        let a = of_reply(&reply("10", 0, 100)).unwrap().unwrap();
        let b = of_reply(&reply("10", 12345, 40)).unwrap().unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 16);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }

    #[test]
    fn the_definition_does() {
        let a = of_reply(&reply("10", 0, 100)).unwrap().unwrap();
        let b = of_reply(&reply("11", 0, 100)).unwrap().unwrap();
        assert_ne!(a, b);
        // The same value as integer or string, and the fields in another
        // order, give the same hash.
        let Value::Array(mut items) = reply("10", 0, 100) else {
            unreachable!()
        };
        items[5] = Value::Array(vec![bulk("20"), Value::Int(10), bulk("1000")]);
        let (front, back) = items.split_at(12);
        let swapped: Vec<Value> = back.iter().chain(front).cloned().collect();
        assert_eq!(of_reply(&Value::Array(swapped)).unwrap().unwrap(), a);
        // Nesting is part of the hash: [20, 10] 1000 is not [20, 10, 1000].
        let Value::Array(mut items) = reply("10", 0, 100) else {
            unreachable!()
        };
        items[5] = Value::Array(vec![
            Value::Array(vec![Value::Int(20), Value::Int(10)]),
            Value::Int(1000),
        ]);
        assert_ne!(of_reply(&Value::Array(items)).unwrap().unwrap(), a);
    }

    #[test]
    fn stable_value() {
        // Pinned: a change here changes every deployed fingerprint.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        let only = Value::Array(vec![bulk("algorithm"), bulk("FIXEDWINDOW")]);
        let expected = format!("{:016x}", fnv1a(b"s9:algorithms11:FIXEDWINDOW"));
        assert_eq!(of_reply(&only).unwrap().unwrap(), expected);
    }

    #[test]
    fn odd_replies() {
        assert_eq!(of_reply(&Value::Nil).unwrap(), None);
        assert!(of_reply(&Value::Int(1)).is_err());
        assert!(of_reply(&Value::Array(vec![bulk("name")])).is_err());
        assert!(of_reply(&Value::Array(vec![Value::Array(vec![]), bulk("x")])).is_err());
        // RESP3's map gives the same as RESP2's flat array.
        let Value::Array(items) = reply("10", 0, 100) else {
            unreachable!()
        };
        let map = Value::Map(
            items
                .chunks(2)
                .map(|p| (p[0].clone(), p[1].clone()))
                .collect(),
        );
        assert_eq!(of_reply(&map), of_reply(&reply("10", 0, 100)));
    }
}
