//! The proto3 JSON mapping of RateLimitRequest (read) and
//! RateLimitResponse (written) for the HTTP port's `/json`.
//!
//! prost's messages have no serde support, so the mapping is written here
//! on `serde_json::Value`, following what the reference's `protojson`
//! accepts and writes:
//! - a field under its JSON name (`hitsAddend`) or its proto name
//!   (`hits_addend`); an unknown field, or a key given twice, is an
//!   error; `null` is the default;
//! - integers as JSON numbers (an integral value such as `2.0` or `1e2`
//!   too) or as strings holding one, within the field's range;
//! - enums by name (`"MINUTE"`) or by number;
//! - written: fields at their default are left out, enums by name,
//!   Duration as `"59s"` / `"1.500s"`, Timestamp in RFC 3339 (UTC), bytes
//!   in base64.

use std::fmt;

use serde_json::{Map, Number, Value};

use crate::proto;
use crate::proto::rate_limit_descriptor::{Entry, RateLimitOverride};
use crate::proto::rate_limit_response::{quota, DescriptorStatus, Quota, RateLimit};

/// Why a `/json` body is not a RateLimitRequest: the field's path and what
/// is wrong with it (`descriptors[0].entries[1].key: expected a string`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    /// The field's path from the request (empty: the body itself).
    pub path: String,
    pub message: String,
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for JsonError {}

fn err(path: &str, message: impl Into<String>) -> JsonError {
    JsonError {
        path: path.to_owned(),
        message: message.into(),
    }
}

fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

/// Reads a RateLimitRequest from a `/json` body.
pub fn parse_request(body: &[u8]) -> Result<proto::RateLimitRequest, JsonError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| err("", format!("invalid JSON: {e}")))?;
    // serde_json keeps the last of two equal keys; protojson refuses them.
    if let Some(key) = duplicate_key(body) {
        return Err(err("", format!("key \"{key}\" given twice in one object")));
    }
    request_from_value(&value)
}

/// The first key that one object of `body` (valid JSON) gives twice.
fn duplicate_key(body: &[u8]) -> Option<String> {
    use std::collections::HashSet;
    // Per open container: an object's keys so far, or None for an array.
    let mut open: Vec<Option<HashSet<String>>> = Vec::new();
    let mut expect_key = false;
    let mut i = 0;
    while let Some(&b) = body.get(i) {
        match b {
            b'{' => {
                open.push(Some(HashSet::new()));
                expect_key = true;
            }
            b'[' => {
                open.push(None);
                expect_key = false;
            }
            b'}' | b']' => {
                open.pop();
                expect_key = false;
            }
            b',' => expect_key = matches!(open.last(), Some(Some(_))),
            b'"' => {
                let start = i;
                i += 1;
                while let Some(&c) = body.get(i) {
                    match c {
                        b'"' => break,
                        b'\\' => i += 2,
                        _ => i += 1,
                    }
                }
                if expect_key {
                    // Unescaped, so "a" and "\u0061" are the same key.
                    let key: String = serde_json::from_slice(body.get(start..=i)?).ok()?;
                    if let Some(Some(keys)) = open.last_mut() {
                        if !keys.insert(key.clone()) {
                            return Some(key);
                        }
                    }
                    expect_key = false;
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Reads a RateLimitRequest from its proto3 JSON value.
pub fn request_from_value(value: &Value) -> Result<proto::RateLimitRequest, JsonError> {
    let mut req = proto::RateLimitRequest::default();
    for (field, value, path) in fields(value, "", &["domain", "descriptors", "hits_addend"])? {
        match field {
            "domain" => req.domain = string(value, &path)?,
            "descriptors" => {
                req.descriptors = list(value, &path, descriptor_from_value)?;
            }
            _ => req.hits_addend = uint32(value, &path)?,
        }
    }
    Ok(req)
}

fn descriptor_from_value(
    value: &Value,
    path: &str,
) -> Result<proto::RateLimitDescriptor, JsonError> {
    let mut d = proto::RateLimitDescriptor::default();
    for (field, value, path) in fields(value, path, &["entries", "limit", "hits_addend"])? {
        match field {
            "entries" => d.entries = list(value, &path, entry_from_value)?,
            "limit" => {
                d.limit = if value.is_null() {
                    None
                } else {
                    Some(override_from_value(value, &path)?)
                }
            }
            // google.protobuf.UInt64Value: the bare number; null = unset.
            _ => {
                d.hits_addend = if value.is_null() {
                    None
                } else {
                    Some(uint64(value, &path)?)
                }
            }
        }
    }
    Ok(d)
}

fn entry_from_value(value: &Value, path: &str) -> Result<Entry, JsonError> {
    let mut e = Entry::default();
    for (field, value, path) in fields(value, path, &["key", "value"])? {
        match field {
            "key" => e.key = string(value, &path)?,
            _ => e.value = string(value, &path)?,
        }
    }
    Ok(e)
}

fn override_from_value(value: &Value, path: &str) -> Result<RateLimitOverride, JsonError> {
    let mut o = RateLimitOverride::default();
    for (field, value, path) in fields(value, path, &["requests_per_unit", "unit"])? {
        match field {
            "requests_per_unit" => o.requests_per_unit = uint32(value, &path)?,
            _ => {
                o.unit = enumeration(value, &path, |name| {
                    proto::RateLimitUnit::from_str_name(name).map(|u| u as i32)
                })?
            }
        }
    }
    Ok(o)
}

/// The lowerCamelCase JSON name protoc gives a snake_case field.
fn json_name(proto_name: &str) -> String {
    let mut out = String::with_capacity(proto_name.len());
    let mut upper = false;
    for c in proto_name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The fields of a message object, each under the proto name it was found
/// by (`known` lists them), with its value and path; `null` fields are
/// kept (each reader takes null as its default). A message given as `null`
/// has no fields.
fn fields<'a>(
    value: &'a Value,
    path: &str,
    known: &[&'static str],
) -> Result<Vec<(&'static str, &'a Value, String)>, JsonError> {
    let object = match value {
        Value::Object(o) => o,
        Value::Null if !path.is_empty() => return Ok(Vec::new()),
        _ => return Err(err(path, "expected a JSON object")),
    };
    let mut out: Vec<(&'static str, &'a Value, String)> = Vec::with_capacity(object.len());
    for (name, v) in object {
        let Some(field) = known
            .iter()
            .copied()
            .find(|f| *f == name || json_name(f) == *name)
        else {
            return Err(err(&child(path, name), "unknown field"));
        };
        if out.iter().any(|(f, _, _)| *f == field) {
            return Err(err(
                &child(path, name),
                format!(
                    "field {field} given twice (as {} and {field})",
                    json_name(field)
                ),
            ));
        }
        out.push((field, v, child(path, name)));
    }
    Ok(out)
}

fn string(value: &Value, path: &str) -> Result<String, JsonError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        _ => Err(err(path, "expected a string")),
    }
}

fn list<T>(
    value: &Value,
    path: &str,
    item: impl Fn(&Value, &str) -> Result<T, JsonError>,
) -> Result<Vec<T>, JsonError> {
    match value {
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                if v.is_null() {
                    // protojson refuses null inside a repeated field.
                    Err(err(&format!("{path}[{i}]"), "null in a list"))
                } else {
                    item(v, &format!("{path}[{i}]"))
                }
            })
            .collect(),
        Value::Null => Ok(Vec::new()),
        _ => Err(err(path, "expected a list")),
    }
}

/// An unsigned integer of at most `max`: a JSON number or a string holding
/// one, integral, in range.
fn unsigned(value: &Value, path: &str, max: u64) -> Result<u64, JsonError> {
    let parsed = match value {
        Value::Null => return Ok(0),
        Value::Number(n) => number_to_u64(n),
        Value::String(s) => {
            // The string holds a JSON number, without blanks.
            match serde_json::from_str::<Value>(s) {
                Ok(Value::Number(n)) if s.trim() == s => number_to_u64(&n),
                _ => None,
            }
        }
        _ => return Err(err(path, "expected an unsigned integer")),
    };
    match parsed {
        Some(n) if n <= max => Ok(n),
        _ => Err(err(
            path,
            format!("expected an unsigned integer of at most {max}, got {value}"),
        )),
    }
}

fn number_to_u64(n: &Number) -> Option<u64> {
    if let Some(u) = n.as_u64() {
        return Some(u);
    }
    if n.is_i64() {
        return None; // negative
    }
    let f = n.as_f64()?;
    // 2^64 is exactly representable; anything at or past it is out of range.
    if f.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&f) {
        Some(f as u64)
    } else {
        None
    }
}

fn uint32(value: &Value, path: &str) -> Result<u32, JsonError> {
    unsigned(value, path, u64::from(u32::MAX)).map(|n| n as u32)
}

fn uint64(value: &Value, path: &str) -> Result<u64, JsonError> {
    unsigned(value, path, u64::MAX)
}

/// An enum: its name (exact, as in the .proto) or its number (any int32:
/// proto3 enums are open).
fn enumeration(
    value: &Value,
    path: &str,
    by_name: impl Fn(&str) -> Option<i32>,
) -> Result<i32, JsonError> {
    match value {
        Value::Null => Ok(0),
        Value::String(name) => {
            by_name(name).ok_or_else(|| err(path, format!("unknown enum value \"{name}\"")))
        }
        Value::Number(n) => n
            .as_i64()
            .and_then(|i| i32::try_from(i).ok())
            .ok_or_else(|| err(path, format!("expected an enum number (int32), got {n}"))),
        _ => Err(err(path, "expected an enum name or number")),
    }
}

/// Writes a RateLimitResponse as `/json` answers it (compact JSON).
pub fn write_response(resp: &proto::RateLimitResponse) -> String {
    response_to_value(resp).to_string()
}

/// A RateLimitResponse's proto3 JSON value.
pub fn response_to_value(resp: &proto::RateLimitResponse) -> Value {
    let mut o = Map::new();
    put_enum(&mut o, "overallCode", resp.overall_code, code_name);
    if !resp.statuses.is_empty() {
        let statuses = resp.statuses.iter().map(status_to_value).collect();
        o.insert("statuses".into(), Value::Array(statuses));
    }
    for (name, headers) in [
        ("responseHeadersToAdd", &resp.response_headers_to_add),
        ("requestHeadersToAdd", &resp.request_headers_to_add),
    ] {
        if !headers.is_empty() {
            let list = headers.iter().map(header_to_value).collect();
            o.insert(name.into(), Value::Array(list));
        }
    }
    if !resp.raw_body.is_empty() {
        o.insert("rawBody".into(), Value::String(base64(&resp.raw_body)));
    }
    if let Some(s) = &resp.dynamic_metadata {
        o.insert("dynamicMetadata".into(), struct_to_value(s));
    }
    if let Some(q) = &resp.quota {
        o.insert("quota".into(), quota_to_value(q));
    }
    Value::Object(o)
}

fn code_name(n: i32) -> Option<&'static str> {
    proto::rate_limit_response::Code::try_from(n)
        .ok()
        .map(|c| c.as_str_name())
}

fn unit_name(n: i32) -> Option<&'static str> {
    proto::rate_limit_response::rate_limit::Unit::try_from(n)
        .ok()
        .map(|u| u.as_str_name())
}

/// An enum field unless at its default (0): by name, or by number when the
/// number has no name.
fn put_enum(o: &mut Map<String, Value>, key: &str, n: i32, name: fn(i32) -> Option<&'static str>) {
    if n == 0 {
        return;
    }
    let v = match name(n) {
        Some(s) => Value::String(s.to_owned()),
        None => Value::Number(n.into()),
    };
    o.insert(key.into(), v);
}

fn put_u32(o: &mut Map<String, Value>, key: &str, n: u32) {
    if n != 0 {
        o.insert(key.into(), Value::Number(n.into()));
    }
}

fn put_string(o: &mut Map<String, Value>, key: &str, s: &str) {
    if !s.is_empty() {
        o.insert(key.into(), Value::String(s.to_owned()));
    }
}

fn status_to_value(s: &DescriptorStatus) -> Value {
    let mut o = Map::new();
    put_enum(&mut o, "code", s.code, code_name);
    if let Some(limit) = &s.current_limit {
        o.insert("currentLimit".into(), rate_limit_to_value(limit));
    }
    put_u32(&mut o, "limitRemaining", s.limit_remaining);
    if let Some(d) = &s.duration_until_reset {
        o.insert("durationUntilReset".into(), Value::String(duration(d)));
    }
    if let Some(q) = &s.quota {
        o.insert("quota".into(), quota_to_value(q));
    }
    Value::Object(o)
}

fn rate_limit_to_value(r: &RateLimit) -> Value {
    let mut o = Map::new();
    put_string(&mut o, "name", &r.name);
    put_u32(&mut o, "requestsPerUnit", r.requests_per_unit);
    put_enum(&mut o, "unit", r.unit, unit_name);
    Value::Object(o)
}

fn quota_to_value(q: &Quota) -> Value {
    let mut o = Map::new();
    put_u32(&mut o, "requests", q.requests);
    if let Some(quota::ExpirationSpecifier::ValidUntil(t)) = &q.expiration_specifier {
        o.insert("validUntil".into(), Value::String(timestamp(t)));
    }
    put_string(&mut o, "id", &q.id);
    Value::Object(o)
}

fn header_to_value(h: &proto::HeaderValue) -> Value {
    let mut o = Map::new();
    put_string(&mut o, "key", &h.key);
    put_string(&mut o, "value", &h.value);
    if !h.raw_value.is_empty() {
        o.insert("rawValue".into(), Value::String(base64(&h.raw_value)));
    }
    Value::Object(o)
}

fn struct_to_value(s: &prost_types::Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), struct_value_to_value(v)))
            .collect(),
    )
}

fn struct_value_to_value(v: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        // JSON has no NaN or infinities: those become null.
        Some(Kind::NumberValue(n)) => Number::from_f64(*n).map_or(Value::Null, Value::Number),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_to_value(s),
        Some(Kind::ListValue(l)) => {
            Value::Array(l.values.iter().map(struct_value_to_value).collect())
        }
    }
}

/// Fractional seconds as protojson writes them: none, or 3, 6 or 9 digits.
fn fraction(nanos: u32) -> String {
    if nanos == 0 {
        String::new()
    } else if nanos.is_multiple_of(1_000_000) {
        format!(".{:03}", nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!(".{:06}", nanos / 1_000)
    } else {
        format!(".{nanos:09}")
    }
}

/// A Duration as `"59s"`, `"1.500s"`, `"-0.250s"`.
fn duration(d: &prost_types::Duration) -> String {
    let negative = d.seconds < 0 || d.nanos < 0;
    let seconds = d.seconds.unsigned_abs();
    let nanos = d.nanos.unsigned_abs();
    format!(
        "{}{seconds}{}s",
        if negative { "-" } else { "" },
        fraction(nanos)
    )
}

/// A Timestamp in RFC 3339, UTC (`2026-12-03T07:48:04.500Z`).
pub(crate) fn timestamp(t: &prost_types::Timestamp) -> String {
    let days = t.seconds.div_euclid(86_400);
    let secs = t.seconds.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60,
        fraction(t.nanos.clamp(0, 999_999_999) as u32)
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's days-to-civil algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Standard base64 with padding, as protojson writes bytes.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(key: &str, value: &str) -> Entry {
        Entry {
            key: key.into(),
            value: value.into(),
        }
    }

    /// The reference README's example request.
    #[test]
    fn the_readme_request() {
        let body = br#"{
          "domain": "dummy",
          "descriptors": [
            { "entries": [{ "key": "one_per_day", "value": "something" }] }
          ]
        }"#;
        let req = parse_request(body).unwrap();
        assert_eq!(req.domain, "dummy");
        assert_eq!(req.hits_addend, 0);
        assert_eq!(req.descriptors.len(), 1);
        assert_eq!(
            req.descriptors[0].entries,
            vec![entry("one_per_day", "something")]
        );
        assert_eq!(req.descriptors[0].limit, None);
        assert_eq!(req.descriptors[0].hits_addend, None);
    }

    /// server_impl.go's doc comment: an entry without a value.
    #[test]
    fn an_entry_without_value() {
        let req = parse_request(
            br#"{"domain": "dummy", "descriptors": [{"entries": [{"key": "perday"}]}]}"#,
        )
        .unwrap();
        assert_eq!(req.descriptors[0].entries, vec![entry("perday", "")]);
    }

    #[test]
    fn camel_case_and_proto_names_numbers_and_strings() {
        let camel = json!({
            "domain": "d",
            "hitsAddend": 3,
            "descriptors": [{
                "entries": [{"key": "k", "value": "v"}],
                "limit": {"requestsPerUnit": "10", "unit": "MINUTE"},
                "hitsAddend": "18446744073709551615"
            }, {
                "entries": [],
                "hitsAddend": 0
            }]
        });
        let snake = json!({
            "domain": "d",
            "hits_addend": "3",
            "descriptors": [{
                "entries": [{"key": "k", "value": "v"}],
                "limit": {"requests_per_unit": 10.0, "unit": 2},
                "hits_addend": 18446744073709551615u64
            }, {
                "hits_addend": "0"
            }]
        });
        let a = request_from_value(&camel).unwrap();
        let b = request_from_value(&snake).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.hits_addend, 3);
        let limit = a.descriptors[0].limit.unwrap();
        assert_eq!(limit.requests_per_unit, 10);
        assert_eq!(limit.unit, proto::RateLimitUnit::Minute as i32);
        assert_eq!(a.descriptors[0].hits_addend, Some(u64::MAX));
        // Set to zero is not unset: a check that takes nothing.
        assert_eq!(a.descriptors[1].hits_addend, Some(0));
    }

    /// Integer spellings the reference's /json took (200) side by side.
    #[test]
    fn integer_spellings_the_reference_takes() {
        for spelling in [
            json!(1e0),
            json!(1.0),
            json!("1e0"),
            json!("1.0"),
            json!("1"),
        ] {
            let req = request_from_value(&json!({"hitsAddend": spelling})).unwrap();
            assert_eq!(req.hits_addend, 1, "{spelling}");
        }
        let req: proto::RateLimitRequest = parse_request(br#"{"hitsAddend": -0}"#).unwrap();
        assert_eq!(req.hits_addend, 0);
        // And the ones it refused (400).
        for spelling in [r#"" 1""#, "1.5", r#""0x10""#, r#""-1""#] {
            let body = format!(r#"{{"hitsAddend": {spelling}}}"#);
            assert!(parse_request(body.as_bytes()).is_err(), "{body}");
        }
    }

    #[test]
    fn week_and_unnamed_unit_numbers() {
        let req = request_from_value(&json!({
            "descriptors": [
                {"limit": {"unit": "WEEK"}},
                {"limit": {"unit": 42}}
            ]
        }))
        .unwrap();
        assert_eq!(req.descriptors[0].limit.unwrap().unit, 7);
        assert_eq!(req.descriptors[1].limit.unwrap().unit, 42);
    }

    #[test]
    fn keys_repeated_in_different_objects_are_not_duplicates() {
        let body = br#"{"descriptors": [
            {"entries": [{"key": "a", "value": "x,\"key\":"}, {"key": "b", "value": "y"}]},
            {"entries": [{"key": "a"}], "hitsAddend": 1}
        ], "domain": "d"}"#;
        let req = parse_request(body).unwrap();
        assert_eq!(req.descriptors[0].entries[0].value, "x,\"key\":");
        assert_eq!(req.descriptors.len(), 2);
        assert_eq!(
            duplicate_key(br#"[{"a": 1}, {"a": 2}, [{"a": {"a": 3}}]]"#),
            None
        );
        assert_eq!(
            duplicate_key(br#"{"a": [1, {"b": 1}], "a": 2}"#),
            Some("a".into())
        );
    }

    #[test]
    fn null_is_the_default() {
        let req = request_from_value(&json!({
            "domain": null,
            "hitsAddend": null,
            "descriptors": [{"entries": null, "limit": null, "hitsAddend": null}]
        }))
        .unwrap();
        assert_eq!(req.domain, "");
        assert_eq!(req.descriptors[0], proto::RateLimitDescriptor::default());
        assert_eq!(
            request_from_value(&json!({"descriptors": null}))
                .unwrap()
                .descriptors,
            vec![]
        );
        assert_eq!(
            parse_request(b"{}").unwrap(),
            proto::RateLimitRequest::default()
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let cases: Vec<(&[u8], &str)> = vec![
            (b"", "invalid JSON"),
            (b"}", "invalid JSON"),
            (b"null", "expected a JSON object"),
            (b"[]", "expected a JSON object"),
            (br#"{"domian": "d"}"#, "domian: unknown field"),
            (br#"{"domain": 5}"#, "domain: expected a string"),
            (
                br#"{"domain": "d", "hitsAddend": -1}"#,
                "hitsAddend: expected an unsigned integer of at most 4294967295, got -1",
            ),
            (
                br#"{"hitsAddend": 4294967296}"#,
                "hitsAddend: expected an unsigned integer of at most 4294967295",
            ),
            (br#"{"hitsAddend": 1.5}"#, "hitsAddend: expected an unsigned"),
            (br#"{"hitsAddend": " 1"}"#, "hitsAddend: expected an unsigned"),
            (br#"{"hitsAddend": true}"#, "hitsAddend: expected an unsigned integer"),
            (br#"{"descriptors": {}}"#, "descriptors: expected a list"),
            (br#"{"descriptors": [null]}"#, "descriptors[0]: null in a list"),
            (br#"{"descriptors": [5]}"#, "descriptors[0]: expected a JSON object"),
            (
                br#"{"descriptors": [{}, {"entries": [{"key": "k", "val": "v"}]}]}"#,
                "descriptors[1].entries[0].val: unknown field",
            ),
            (
                br#"{"descriptors": [{"entries": [{"key": ["k"]}]}]}"#,
                "descriptors[0].entries[0].key: expected a string",
            ),
            (
                br#"{"descriptors": [{"limit": {"unit": "minute"}}]}"#,
                "descriptors[0].limit.unit: unknown enum value \"minute\"",
            ),
            (
                br#"{"descriptors": [{"limit": {"unit": 2147483648}}]}"#,
                "descriptors[0].limit.unit: expected an enum number",
            ),
            (
                br#"{"descriptors": [{"hitsAddend": "18446744073709551616"}]}"#,
                "descriptors[0].hitsAddend: expected an unsigned integer of at most 18446744073709551615",
            ),
            (
                br#"{"hitsAddend": 1, "hits_addend": 1}"#,
                "hits_addend: field hits_addend given twice",
            ),
            (
                br#"{"domain": "a", "descriptors": [], "domain": "b"}"#,
                "key \"domain\" given twice in one object",
            ),
            (
                br#"{"descriptors": [{"entries": [{"key": "k", "k\u0065y": "l"}]}]}"#,
                "key \"key\" given twice in one object",
            ),
        ];
        for (body, want) in cases {
            let got = parse_request(body).unwrap_err().to_string();
            assert!(
                got.starts_with(want),
                "{}: got {got:?}, want {want:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    fn status(code: i32, rpu: u32, unit: i32, remaining: u32, reset: i64) -> DescriptorStatus {
        DescriptorStatus {
            code,
            current_limit: Some(RateLimit {
                name: String::new(),
                requests_per_unit: rpu,
                unit,
            }),
            limit_remaining: remaining,
            duration_until_reset: Some(prost_types::Duration {
                seconds: reset,
                nanos: 0,
            }),
            quota: None,
        }
    }

    /// What the reference answered, side by side, for a request over two
    /// one-per-minute descriptors (its bytes differ in spacing only).
    #[test]
    fn the_reference_over_limit_response() {
        let resp = proto::RateLimitResponse {
            overall_code: 2,
            statuses: vec![status(2, 1, 2, 0, 56), status(2, 1, 2, 0, 56)],
            ..Default::default()
        };
        let reference = r#"{"overallCode":"OVER_LIMIT", "statuses":[{"code":"OVER_LIMIT", "currentLimit":{"requestsPerUnit":1, "unit":"MINUTE"}, "durationUntilReset":"56s"}, {"code":"OVER_LIMIT", "currentLimit":{"requestsPerUnit":1, "unit":"MINUTE"}, "durationUntilReset":"56s"}]}"#;
        let reference: Value = serde_json::from_str(reference).unwrap();
        assert_eq!(response_to_value(&resp), reference);
    }

    /// server_impl_test.go's expected bodies.
    #[test]
    fn the_reference_handler_test_bodies() {
        let ok = proto::RateLimitResponse {
            overall_code: 1,
            ..Default::default()
        };
        assert_eq!(write_response(&ok), r#"{"overallCode":"OK"}"#);
        let over = proto::RateLimitResponse {
            overall_code: 2,
            ..Default::default()
        };
        assert_eq!(write_response(&over), r#"{"overallCode":"OVER_LIMIT"}"#);
        assert_eq!(write_response(&proto::RateLimitResponse::default()), "{}");
    }

    /// The reference README's example response, read back field by field.
    #[test]
    fn the_readme_response() {
        let resp = proto::RateLimitResponse {
            overall_code: 2,
            statuses: vec![
                DescriptorStatus {
                    code: 2,
                    current_limit: Some(RateLimit {
                        name: "per_day".into(),
                        requests_per_unit: 1,
                        unit: 4,
                    }),
                    limit_remaining: 0,
                    duration_until_reset: Some(prost_types::Duration {
                        seconds: 86_399,
                        nanos: 0,
                    }),
                    quota: None,
                },
                status(1, 10, 7, 9, 3600),
            ],
            response_headers_to_add: vec![proto::HeaderValue {
                key: "RateLimit-Limit".into(),
                value: "1".into(),
                raw_value: vec![],
            }],
            ..Default::default()
        };
        assert_eq!(
            response_to_value(&resp),
            json!({
                "overallCode": "OVER_LIMIT",
                "statuses": [
                    {
                        "code": "OVER_LIMIT",
                        "currentLimit": {"name": "per_day", "requestsPerUnit": 1, "unit": "DAY"},
                        "durationUntilReset": "86399s"
                    },
                    {
                        "code": "OK",
                        "currentLimit": {"requestsPerUnit": 10, "unit": "WEEK"},
                        "limitRemaining": 9,
                        "durationUntilReset": "3600s"
                    }
                ],
                "responseHeadersToAdd": [{"key": "RateLimit-Limit", "value": "1"}]
            })
        );
    }

    #[test]
    fn unnamed_enums_are_written_as_numbers_and_empty_statuses_as_objects() {
        let resp = proto::RateLimitResponse {
            overall_code: 9,
            statuses: vec![DescriptorStatus::default()],
            ..Default::default()
        };
        assert_eq!(
            write_response(&resp),
            r#"{"overallCode":9,"statuses":[{}]}"#
        );
    }

    #[test]
    fn durations_timestamps_bytes_and_structs() {
        let d = |seconds, nanos| duration(&prost_types::Duration { seconds, nanos });
        assert_eq!(d(59, 0), "59s");
        assert_eq!(d(0, 0), "0s");
        assert_eq!(d(1, 500_000_000), "1.500s");
        assert_eq!(d(1, 1_000), "1.000001s");
        assert_eq!(d(1, 1), "1.000000001s");
        assert_eq!(d(0, -250_000_000), "-0.250s");
        assert_eq!(d(-3, 0), "-3s");
        let t = |seconds, nanos| timestamp(&prost_types::Timestamp { seconds, nanos });
        assert_eq!(t(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(t(1_796_284_084, 500_000_000), "2026-12-03T07:48:04.500Z");
        assert_eq!(t(951_782_400, 0), "2000-02-29T00:00:00Z");
        assert_eq!(t(-1, 0), "1969-12-31T23:59:59Z");
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xff, 0xfe]), "//4=");

        use prost_types::value::Kind;
        let s = prost_types::Struct {
            fields: [
                (
                    "n".to_owned(),
                    prost_types::Value {
                        kind: Some(Kind::NumberValue(1.5)),
                    },
                ),
                (
                    "nan".to_owned(),
                    prost_types::Value {
                        kind: Some(Kind::NumberValue(f64::NAN)),
                    },
                ),
                (
                    "s".to_owned(),
                    prost_types::Value {
                        kind: Some(Kind::StringValue("x".into())),
                    },
                ),
                (
                    "b".to_owned(),
                    prost_types::Value {
                        kind: Some(Kind::BoolValue(true)),
                    },
                ),
                (
                    "z".to_owned(),
                    prost_types::Value {
                        kind: Some(Kind::NullValue(0)),
                    },
                ),
                (
                    "l".to_owned(),
                    prost_types::Value {
                        kind: Some(Kind::ListValue(prost_types::ListValue {
                            values: vec![prost_types::Value {
                                kind: Some(Kind::BoolValue(false)),
                            }],
                        })),
                    },
                ),
            ]
            .into_iter()
            .collect(),
        };
        let resp = proto::RateLimitResponse {
            overall_code: 1,
            raw_body: b"over".to_vec(),
            dynamic_metadata: Some(s),
            quota: Some(Quota {
                requests: 5,
                id: "q".into(),
                expiration_specifier: Some(quota::ExpirationSpecifier::ValidUntil(
                    prost_types::Timestamp {
                        seconds: 0,
                        nanos: 0,
                    },
                )),
            }),
            request_headers_to_add: vec![proto::HeaderValue {
                key: "x".into(),
                value: String::new(),
                raw_value: b"\x00\x01".to_vec(),
            }],
            ..Default::default()
        };
        assert_eq!(
            response_to_value(&resp),
            json!({
                "overallCode": "OK",
                "rawBody": "b3Zlcg==",
                "dynamicMetadata": {"n": 1.5, "nan": null, "s": "x", "b": true, "z": null, "l": [false]},
                "quota": {"requests": 5, "validUntil": "1970-01-01T00:00:00Z", "id": "q"},
                "requestHeadersToAdd": [{"key": "x", "rawValue": "AAE="}]
            })
        );
    }

    /// protoc's JSON names, which the reader accepts beside the proto names.
    #[test]
    fn json_names() {
        assert_eq!(json_name("hits_addend"), "hitsAddend");
        assert_eq!(json_name("requests_per_unit"), "requestsPerUnit");
        assert_eq!(json_name("domain"), "domain");
    }
}
