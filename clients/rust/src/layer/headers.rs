//! The header fields (`RateLimit-Policy`, `RateLimit`, `Retry-After`,
//! `X-RateLimit-*`, gRPC's `RESOURCE_EXHAUSTED`) and the problem+json
//! bodies (RFC 9457) of the layer's answers.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::{Either, Full};

use super::{RateLimitBody, Shared};
use crate::decision::Decision;
use crate::rule::Spec;

/// The problem type of a denial.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

impl Shared {
    /// The fields of a response: `RateLimit` has an item per decision (the
    /// rate rules' one, then the concurrency cap's); `X-RateLimit-*` and
    /// `Retry-After` come from the first.
    pub(super) fn add_headers(&self, headers: &mut HeaderMap, items: &[(&str, &Decision)]) {
        headers.insert("ratelimit-policy", self.policy.clone());
        let Some((_, d)) = items.first() else { return };
        let field = items
            .iter()
            .map(|(name, d)| ratelimit_item(name, d))
            .collect::<Vec<_>>()
            .join(", ");
        if let Ok(v) = HeaderValue::from_str(&field) {
            headers.insert("ratelimit", v);
        }
        let reset_s = d.reset_ms().div_ceil(1000);
        if self.x_headers {
            headers.insert("x-ratelimit-limit", HeaderValue::from(d.limit));
            headers.insert("x-ratelimit-remaining", HeaderValue::from(d.remaining));
            headers.insert("x-ratelimit-reset", HeaderValue::from(reset_s));
        }
        if !d.allowed {
            if let Some(s) = d.retry_after_s() {
                headers.insert(http::header::RETRY_AFTER, HeaderValue::from(s));
            }
        }
    }

    /// The answer to a request denied by `rule`: 429 with a problem body, or
    /// gRPC `RESOURCE_EXHAUSTED`.
    pub(super) fn denial<B>(&self, rule: &str, d: &Decision) -> Response<RateLimitBody<B>> {
        let mut response = if self.grpc {
            let mut r = Response::new(Either::Right(Full::new(Bytes::new())));
            let h = r.headers_mut();
            h.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            h.insert("grpc-status", HeaderValue::from_static("8"));
            h.insert(
                "grpc-message",
                HeaderValue::from_static("rate%20limit%20exceeded"),
            );
            if let Ok(v) = HeaderValue::from_str(rule) {
                h.insert("violated-policies", v);
            }
            r
        } else {
            problem_response(StatusCode::TOO_MANY_REQUESTS, denial_body(rule, d))
        };
        self.add_headers(response.headers_mut(), &[(rule, d)]);
        response
    }
}

/// A `RateLimit-Policy` item: `"name";q=<limit>;w=<window s>`, without `w`
/// for concurrency.
pub(crate) fn policy_item(name: &str, spec: &Spec) -> String {
    match spec.window_s() {
        Some(w) => format!("\"{name}\";q={};w={w}", spec.limit()),
        None => format!("\"{name}\";q={}", spec.limit()),
    }
}

/// The `RateLimit` item of a reply: `"name";r=<remaining>;t=<ceil(reset_ms / 1000)>`.
pub(crate) fn ratelimit_item(name: &str, d: &Decision) -> String {
    format!(
        "\"{name}\";r={};t={}",
        d.remaining,
        d.reset_ms().div_ceil(1000)
    )
}

/// The problem+json body of a denial by `rule` (RFC 9457, with the
/// `violated-policies` member of the rate-limit fields draft).
pub(crate) fn denial_body(rule: &str, d: &Decision) -> String {
    let detail = match d.retry_after_s() {
        Some(s) => format!("rate limit {rule:?} exceeded; retry after {s} s"),
        None => format!("rate limit {rule:?} exceeded; this request can never pass"),
    };
    problem_body(
        StatusCode::TOO_MANY_REQUESTS,
        QUOTA_EXCEEDED,
        "Request cannot be satisfied as assigned quota has been exceeded",
        &detail,
        Some(rule),
    )
}

fn problem_body(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
    violated: Option<&str>,
) -> String {
    let mut body = serde_json::json!({
        "type": kind,
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    if let Some(v) = violated {
        body["violated-policies"] = serde_json::json!([v]);
    }
    body.to_string()
}

/// A problem+json response.
pub(super) fn problem<B>(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
    violated: Option<&str>,
) -> Response<RateLimitBody<B>> {
    problem_response(status, problem_body(status, kind, title, detail, violated))
}

fn problem_response<B>(status: StatusCode, body: String) -> Response<RateLimitBody<B>> {
    let mut r = Response::new(Either::Right(Full::new(Bytes::from(body))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Path;

    fn denial(wait_ms: i64, reset_ms: u64) -> Decision {
        Decision::from_fields(false, 10, 0, wait_ms, reset_ms, Path::Redis)
    }

    #[test]
    fn retry_after_is_wait_ms_in_seconds_rounded_up() {
        for (wait_ms, seconds) in [
            (1, 1),
            (999, 1),
            (1000, 1),
            (1001, 2),
            (60_000, 60),
            (60_001, 61),
        ] {
            assert_eq!(
                denial(wait_ms, 0).retry_after_s(),
                Some(seconds),
                "wait_ms {wait_ms}"
            );
        }
        assert_eq!(denial(-1, 0).retry_after_s(), None, "never: no Retry-After");
    }

    #[test]
    fn the_ratelimit_item_rounds_reset_ms_up_to_seconds() {
        assert_eq!(ratelimit_item("u", &denial(1, 1)), "\"u\";r=0;t=1");
        assert_eq!(ratelimit_item("u", &denial(1, 1000)), "\"u\";r=0;t=1");
        assert_eq!(ratelimit_item("u", &denial(1, 1001)), "\"u\";r=0;t=2");
        assert_eq!(ratelimit_item("u", &denial(1, 0)), "\"u\";r=0;t=0");
    }

    #[test]
    fn the_policy_window_of_a_bucket_is_the_time_to_refill_it() {
        let spec = |a: &str, p: &[u64]| Spec::parse("r", a, p).unwrap();
        assert_eq!(spec("TOKENBUCKET", &[5, 1, 1000]).window_s(), Some(5));
        assert_eq!(
            spec("TOKENBUCKET", &[15_000, 15_000, 1000]).window_s(),
            Some(1)
        );
        assert_eq!(
            spec("TOKENBUCKET", &[10, 3, 1000]).window_s(),
            Some(4),
            "3.34 s rounds up"
        );
        assert_eq!(spec("LEAKYBUCKET", &[2, 1, 10_000]).window_s(), Some(20));
        assert_eq!(spec("SLIDING", &[5, 1500]).window_s(), Some(2));
        assert_eq!(spec("FIXEDWINDOW", &[5, 1000]).window_s(), Some(1));
        assert_eq!(spec("HASHWINDOW", &[5, 60_000, 1000]).window_s(), Some(60));
    }
}
