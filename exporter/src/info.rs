//! Parsing `INFO ratelimit` (docs/operations.md, "INFO ratelimit").
//!
//! The parser takes whatever text a node answers and never panics: a line it
//! cannot read is skipped and counted in [`Info::garbled`], a well-formed
//! field it does not know (a newer module's) is ignored.

use std::collections::BTreeMap;

/// The four counters the module keeps per algorithm (and for `RL.ALL` as a
/// whole, algorithm `all`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    pub calls: Option<u64>,
    pub admitted: Option<u64>,
    pub denied: Option<u64>,
    pub peeks: Option<u64>,
}

/// One policy's line: `ratelimit_policy_<escaped>:calls=N,...,scale=N,stage=N`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyLine {
    pub calls: Option<u64>,
    pub admitted: Option<u64>,
    pub denied: Option<u64>,
    pub shadow_denied: Option<u64>,
    pub peeks: Option<u64>,
    pub scale: Option<u64>,
    pub stage: Option<u64>,
}

/// What one `INFO ratelimit` reply says. Fields the reply lacks are `None`
/// (and their series are left out).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Info {
    /// Whether the reply had the `ratelimit` section (a `# ratelimit` header
    /// or any `ratelimit_` field): without it the module is not loaded.
    pub section: bool,
    /// Per algorithm, by INFO's name (`tokenbucket`, ..., `all`).
    pub algorithms: BTreeMap<String, Outcomes>,
    /// `ratelimit_policies`.
    pub policies: Option<u64>,
    /// Per policy, by its decoded name.
    pub policy: BTreeMap<String, PolicyLine>,
    /// `UPTO` calls, the units they were granted, and the grants of fewer
    /// units than asked.
    pub upto_calls: Option<u64>,
    pub upto_granted_units: Option<u64>,
    pub upto_partial: Option<u64>,
    pub blocked_now: Option<u64>,
    pub blocked_total: Option<u64>,
    pub blocked_admitted: Option<u64>,
    pub blocked_timed_out: Option<u64>,
    pub deny_log_len: Option<u64>,
    pub deny_log_max_len: Option<u64>,
    pub bucket_rates: Option<u64>,
    pub propagation_pinned: Option<u64>,
    /// Lines skipped because they could not be read.
    pub garbled: u64,
}

const PREFIX: &str = "ratelimit_";
const POLICY: &str = "policy_";

/// Parses the text of `INFO ratelimit`.
pub fn parse(text: &str) -> Info {
    let mut info = Info::default();
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(header) = line.strip_prefix('#') {
            if header.trim().eq_ignore_ascii_case("ratelimit") {
                info.section = true;
            }
            continue;
        }
        if parse_line(&mut info, line).is_none() {
            info.garbled += 1;
        }
    }
    info
}

/// Reads one field line into `info`; `None` when it is garbled.
fn parse_line(info: &mut Info, line: &str) -> Option<()> {
    let (key, value) = line.split_once(':')?;
    let field = key.strip_prefix(PREFIX)?;
    info.section = true;
    if let Some(escaped) = field.strip_prefix(POLICY) {
        if value.contains('=') {
            let name = decode_name(escaped)?;
            let policy = parse_policy(value)?;
            info.policy.insert(name, policy);
            return Some(());
        }
    }
    let n = parse_u64(value)?;
    let slot = match field {
        "policies" => &mut info.policies,
        "upto_calls" => &mut info.upto_calls,
        "upto_granted_units" => &mut info.upto_granted_units,
        "upto_partial" => &mut info.upto_partial,
        "blocked_now" => &mut info.blocked_now,
        "blocked_total" => &mut info.blocked_total,
        "blocked_admitted" => &mut info.blocked_admitted,
        "blocked_timed_out" => &mut info.blocked_timed_out,
        "deny_log_len" => &mut info.deny_log_len,
        "deny_log_max_len" => &mut info.deny_log_max_len,
        "bucket_rates" => &mut info.bucket_rates,
        "propagation_pinned" => &mut info.propagation_pinned,
        _ => match field.rsplit_once('_') {
            Some((algorithm, counter))
                if is_algorithm(algorithm)
                    && matches!(counter, "calls" | "admitted" | "denied" | "peeks") =>
            {
                let o = info.algorithms.entry(algorithm.to_string()).or_default();
                match counter {
                    "calls" => &mut o.calls,
                    "admitted" => &mut o.admitted,
                    "denied" => &mut o.denied,
                    _ => &mut o.peeks,
                }
            }
            // A well-formed field of a newer module (or module_allocations,
            // a diagnostic): not exported.
            _ => return Some(()),
        },
    };
    *slot = Some(n);
    Some(())
}

/// An algorithm's name in INFO: lower-case letters and digits.
fn is_algorithm(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// A decimal counter as INFO writes it (no sign, no spaces but trailing ones).
fn parse_u64(text: &str) -> Option<u64> {
    let text = text.trim_end();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// `calls=N,admitted=N,...`: every pair must read, unknown keys are ignored.
fn parse_policy(value: &str) -> Option<PolicyLine> {
    let mut p = PolicyLine::default();
    for pair in value.trim_end().split(',') {
        let (k, v) = pair.split_once('=')?;
        let n = parse_u64(v)?;
        match k {
            "calls" => p.calls = Some(n),
            "admitted" => p.admitted = Some(n),
            "denied" => p.denied = Some(n),
            "shadow_denied" => p.shadow_denied = Some(n),
            "peeks" => p.peeks = Some(n),
            "scale" => p.scale = Some(n),
            "stage" => p.stage = Some(n),
            "" => return None,
            _ => {}
        }
    }
    Some(p)
}

/// A policy name from its INFO form: every `%XX` decoded (hex digits of
/// either case). `None` for an empty name, a broken escape or bytes that are
/// not UTF-8 (the module only writes printable ASCII).
pub fn decode_name(escaped: &str) -> Option<String> {
    let bytes = escaped.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hi = (hex[0] as char).to_digit(16)?;
            let lo = (hex[1] as char).to_digit(16)?;
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    if out.is_empty() {
        return None;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real reply (Redis 7.0 with the module, three policies, some traffic).
    const REAL: &str = "# ratelimit\r\n\
ratelimit_tokenbucket_calls:3\r\n\
ratelimit_tokenbucket_admitted:2\r\n\
ratelimit_tokenbucket_denied:0\r\n\
ratelimit_tokenbucket_peeks:1\r\n\
ratelimit_fixedwindow_calls:6\r\n\
ratelimit_fixedwindow_admitted:3\r\n\
ratelimit_fixedwindow_denied:3\r\n\
ratelimit_fixedwindow_peeks:0\r\n\
ratelimit_throttle_calls:0\r\n\
ratelimit_throttle_admitted:0\r\n\
ratelimit_throttle_denied:0\r\n\
ratelimit_throttle_peeks:0\r\n\
ratelimit_all_calls:2\r\n\
ratelimit_all_admitted:1\r\n\
ratelimit_all_denied:1\r\n\
ratelimit_all_peeks:0\r\n\
ratelimit_policies:3\r\n\
ratelimit_policy_POST%3A%2Fapi%2Forder%2Fcreate:calls=1,admitted=1,denied=0,shadow_denied=0,peeks=0,scale=100,stage=0\r\n\
ratelimit_policy_checkout:calls=4,admitted=2,denied=2,shadow_denied=1,peeks=5,scale=40,stage=2\r\n\
ratelimit_policy_q:calls=0,admitted=0,denied=0,shadow_denied=0,peeks=0,scale=100,stage=0\r\n\
ratelimit_blocked_now:7\r\n\
ratelimit_blocked_total:11\r\n\
ratelimit_blocked_admitted:3\r\n\
ratelimit_blocked_timed_out:1\r\n\
ratelimit_deny_log_len:3\r\n\
ratelimit_deny_log_max_len:128\r\n\
ratelimit_propagation_pinned:1\r\n\
ratelimit_module_allocations:6158\r\n\
ratelimit_bucket_rates:2\r\n";

    #[test]
    fn every_field_of_a_real_reply() {
        let info = parse(REAL);
        assert!(info.section);
        assert_eq!(info.garbled, 0);
        let o = |c, a, d, p| Outcomes {
            calls: Some(c),
            admitted: Some(a),
            denied: Some(d),
            peeks: Some(p),
        };
        assert_eq!(info.algorithms["tokenbucket"], o(3, 2, 0, 1));
        assert_eq!(info.algorithms["fixedwindow"], o(6, 3, 3, 0));
        assert_eq!(info.algorithms["throttle"], o(0, 0, 0, 0));
        assert_eq!(info.algorithms["all"], o(2, 1, 1, 0));
        assert_eq!(info.algorithms.len(), 4);
        assert_eq!(info.policies, Some(3));
        assert_eq!(
            info.policy["checkout"],
            PolicyLine {
                calls: Some(4),
                admitted: Some(2),
                denied: Some(2),
                shadow_denied: Some(1),
                peeks: Some(5),
                scale: Some(40),
                stage: Some(2),
            }
        );
        assert_eq!(info.policy["POST:/api/order/create"].calls, Some(1));
        assert_eq!(info.policy["q"].scale, Some(100));
        assert_eq!(info.policy.len(), 3);
        assert_eq!(info.blocked_now, Some(7));
        assert_eq!(info.blocked_total, Some(11));
        assert_eq!(info.blocked_admitted, Some(3));
        assert_eq!(info.blocked_timed_out, Some(1));
        assert_eq!(info.deny_log_len, Some(3));
        assert_eq!(info.deny_log_max_len, Some(128));
        assert_eq!(info.bucket_rates, Some(2));
        assert_eq!(info.propagation_pinned, Some(1));
    }

    #[test]
    fn blocked_admitted_is_not_an_algorithm() {
        let info = parse("ratelimit_blocked_admitted:4\nratelimit_blocked_total:5\n");
        assert!(info.algorithms.is_empty());
        assert_eq!(info.blocked_admitted, Some(4));
    }

    #[test]
    fn escaped_names() {
        assert_eq!(
            decode_name("GET%3A%2Fv2%2F%7Borg%7D%2Fitems").as_deref(),
            Some("GET:/v2/{org}/items")
        );
        assert_eq!(
            decode_name("tenant%3Dacme%3Btier%3Dfree").as_deref(),
            Some("tenant=acme;tier=free")
        );
        // Lower-case hex reads too; quotes and backslashes come back as they are.
        assert_eq!(decode_name("a%22b%5cc").as_deref(), Some("a\"b\\c"));
        assert_eq!(decode_name("%25").as_deref(), Some("%"));
        assert_eq!(decode_name("plain_name_9").as_deref(), Some("plain_name_9"));
        for bad in ["", "%", "%4", "%G1", "ab%zz", "%FF", "%C3"] {
            assert_eq!(decode_name(bad), None, "{bad:?}");
        }
        // Multi-byte UTF-8 written escaped decodes as text.
        assert_eq!(decode_name("%C3%A9").as_deref(), Some("é"));
        let info = parse("ratelimit_policy_a%22%5C%0Ab:calls=1,admitted=1,denied=0,shadow_denied=0,peeks=0,scale=100,stage=0");
        assert_eq!(info.policy["a\"\\\nb"].calls, Some(1));
    }

    #[test]
    fn garbage_is_skipped_and_counted() {
        let text = "# ratelimit\n\
ratelimit_tokenbucket_calls:12\n\
this is not a field\n\
ratelimit_tokenbucket_admitted:-1\n\
ratelimit_tokenbucket_denied:1.5\n\
ratelimit_tokenbucket_peeks:99999999999999999999999\n\
ratelimit_policies:\n\
ratelimit_policy_x%ZZ:calls=1\n\
ratelimit_policy_:calls=1\n\
ratelimit_policy_y:calls=1,admitted\n\
ratelimit_policy_z:calls=1,=2\n\
ratelimit_policy_w:calls=x\n\
other_field:1\n\
:\n\
\u{0}\u{ff}garbage\n\
ratelimit_deny_log_len:4\n\
ratelimit_policy_ok:calls=2\n\
ratelimit_some_future_field:1\n\
ratelimit_newalg_calls:8\n";
        let info = parse(text);
        assert_eq!(info.garbled, 13);
        assert_eq!(info.algorithms["tokenbucket"].calls, Some(12));
        assert_eq!(info.algorithms["tokenbucket"].admitted, None);
        assert_eq!(info.algorithms["tokenbucket"].peeks, None);
        assert_eq!(info.policies, None);
        assert_eq!(info.deny_log_len, Some(4));
        assert_eq!(info.policy.len(), 1);
        assert_eq!(info.policy["ok"].calls, Some(2));
        assert_eq!(info.policy["ok"].denied, None);
        // A well-formed field of a newer module is not garbage; a new
        // algorithm's counters are exported under its name.
        assert!(!info.algorithms.contains_key("some_future"));
        assert!(!info.algorithms.contains_key("some"));
        assert_eq!(info.algorithms["newalg"].calls, Some(8));
    }

    #[test]
    fn empty_reply_has_no_section() {
        let info = parse("");
        assert!(!info.section);
        assert_eq!(info, Info::default());
        assert!(parse("# ratelimit\r\n").section);
        assert!(!parse("# Server\r\nredis_version:7.0.0\r\n").section);
    }

    #[test]
    fn any_input_parses_without_panic() {
        // Every prefix of the real reply and of some garbage, and every byte
        // value after a field's colon.
        for end in 0..=REAL.len() {
            if REAL.is_char_boundary(end) {
                let _ = parse(&REAL[..end]);
            }
        }
        for b in 0..=255u8 {
            let s = format!(
                "ratelimit_policy_a:calls={}\nratelimit_x_calls:{}\n%{}",
                b as char, b as char, b as char
            );
            let _ = parse(&s);
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut s = String::new();
            for _ in 0..64 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                s.push(b"ratelimit_policy_%:=,\r\n0123456789abcAF#"[(seed % 37) as usize] as char);
            }
            let _ = parse(&s);
        }
    }
}
