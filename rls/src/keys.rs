//! The Redis key of each limit.
//!
//! The reference's key is `prefix + domain + "_" + (key "_" value "_")* +
//! window start` (a new key per window, expired by a TTL). The module
//! keeps a limiter's window inside its state, so a key here names the
//! limiter instead: the same prefix, domain and entries, then a tag for the
//! algorithm and the period in seconds, e.g. `fw60` for a fixed window of a
//! minute, `sw3600`, `tb1`, `hw86400`. Two limits of one descriptor with
//! the same tag get the later one's position appended (`fw60.1`), so each
//! has a key of its own.
//!
//! With `RLS_HASH_TAG=domain` the domain part is `{domain}`: a cluster
//! stores all of a domain's keys in one slot, and one `RL.ALL` decides a
//! whole request.
use std::fmt::Write as _;

use crate::config::{Algorithm, Limit};
use crate::settings::HashTag;

/// The tag of a limit: the algorithm's two letters and the period in
/// seconds (a period is whole seconds: a unit times a multiplier).
pub fn tag(limit: &Limit) -> (&'static str, u64) {
    let letters = match limit.algorithm {
        Algorithm::FixedWindow => "fw",
        Algorithm::SlidingWindow => "sw",
        Algorithm::TokenBucket { .. } => "tb",
        Algorithm::HashWindow { .. } => "hw",
    };
    (letters, limit.period_ms() / 1000)
}

/// Writes the part every limit of a descriptor shares into `out` (cleared
/// first): `prefix domain _ (key _ value _)*`, with share_threshold's
/// values in place of the request's where `share` has one.
pub fn descriptor_base(
    out: &mut String,
    prefix: &str,
    hash_tag: HashTag,
    domain: &str,
    entries: &[(&str, &str)],
    share: Option<&[Option<String>]>,
) {
    out.clear();
    out.push_str(prefix);
    match hash_tag {
        HashTag::None => out.push_str(domain),
        HashTag::Domain => {
            out.push('{');
            out.push_str(domain);
            out.push('}');
        }
    }
    out.push('_');
    for (i, &(key, value)) in entries.iter().enumerate() {
        out.push_str(key);
        out.push('_');
        let shared = share.and_then(|s| s.get(i)).and_then(Option::as_deref);
        out.push_str(shared.unwrap_or(value));
        out.push('_');
    }
}

/// The key of `limits[index]` on `base` (from [`descriptor_base`]).
pub fn limit_key(base: &str, limits: &[Limit], index: usize) -> String {
    let (letters, seconds) = tag(&limits[index]);
    let mut key = String::with_capacity(base.len() + 16);
    key.push_str(base);
    key.push_str(letters);
    let _ = write!(key, "{seconds}");
    if limits[..index].iter().any(|l| tag(l) == (letters, seconds)) {
        let _ = write!(key, ".{index}");
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Unit;

    fn limit(unit: Unit, algorithm: Algorithm, multiplier: u32) -> Limit {
        Limit {
            unit,
            requests_per_unit: 10,
            unit_multiplier: multiplier,
            algorithm,
        }
    }

    fn base(prefix: &str, tag: HashTag, entries: &[(&str, &str)]) -> String {
        let mut out = String::from("left over");
        descriptor_base(&mut out, prefix, tag, "edge", entries, None);
        out
    }

    #[test]
    fn keys_follow_the_references_shape_with_a_tag() {
        let b = base(
            "",
            HashTag::None,
            &[("remote_address", "10.0.0.1"), ("path", "/a")],
        );
        assert_eq!(b, "edge_remote_address_10.0.0.1_path_/a_");
        let limits = [limit(Unit::Minute, Algorithm::FixedWindow, 1)];
        assert_eq!(
            limit_key(&b, &limits, 0),
            "edge_remote_address_10.0.0.1_path_/a_fw60"
        );
    }

    #[test]
    fn prefix_and_hash_tag() {
        let b = base("rl:", HashTag::Domain, &[("k", "v")]);
        assert_eq!(b, "rl:{edge}_k_v_");
    }

    #[test]
    fn tags_name_algorithm_and_period() {
        let l = [
            limit(Unit::Second, Algorithm::SlidingWindow, 1),
            limit(Unit::Hour, Algorithm::TokenBucket { burst: 5 }, 1),
            limit(Unit::Day, Algorithm::HashWindow { buckets: 10 }, 1),
            limit(Unit::Minute, Algorithm::FixedWindow, 5),
        ];
        let keys: Vec<String> = (0..l.len()).map(|i| limit_key("d_", &l, i)).collect();
        assert_eq!(keys, ["d_sw1", "d_tb3600", "d_hw86400", "d_fw300"]);
    }

    #[test]
    fn the_same_tag_twice_gets_distinct_keys() {
        let mut second = limit(Unit::Minute, Algorithm::FixedWindow, 1);
        second.requests_per_unit = 100;
        let l = [limit(Unit::Minute, Algorithm::FixedWindow, 1), second];
        assert_eq!(limit_key("d_", &l, 0), "d_fw60");
        assert_eq!(limit_key("d_", &l, 1), "d_fw60.1");
    }

    #[test]
    fn share_threshold_values_replace_the_requests() {
        let mut out = String::new();
        let share = [None, Some("user*".to_string())];
        descriptor_base(
            &mut out,
            "",
            HashTag::None,
            "edge",
            &[("path", "/x"), ("user", "user42")],
            Some(&share),
        );
        assert_eq!(out, "edge_path_/x_user_user*_");
    }
}
