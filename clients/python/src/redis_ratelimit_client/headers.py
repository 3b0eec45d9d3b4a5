"""What the middleware answers over HTTP: the IETF `RateLimit-Policy` and
`RateLimit` fields (and `Retry-After`, optionally the `X-RateLimit-*` ones),
and the `application/problem+json` body of a denial.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence

from .decision import Decision
from .spec import Algorithm, Rule, _limit_of

QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
#: The `title` of a denial's problem body.
DENIED_TITLE = "Request cannot be satisfied as assigned quota has been exceeded"


def denial_detail(rule: str, d: Decision) -> str:
    """The `detail` of a denial's problem body, the same for every algorithm
    (a concurrency cap's too): the rule's name as a JSON string."""
    name = json.dumps(rule, ensure_ascii=False)
    if d.retry_after_s is None:
        return f"rate limit {name} exceeded; this request can never pass"
    return f"rate limit {name} exceeded; retry after {d.retry_after_s} s"


def problem_json(body: dict[str, object]) -> bytes:
    """A problem+json body: compact, its members in name order, UTF-8."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def ratelimit_headers(
    rules: Sequence[Rule],
    algos: Sequence[Algorithm],
    d: Decision,
    index: int,
    x_ratelimit_headers: bool = False,
) -> list[tuple[bytes, bytes]]:
    """The fields of a response about rule `index`'s decision `d`:
    `RateLimit-Policy` (every rule, `q` its limit, `w` its window),
    `RateLimit`, `Retry-After` on a denial that can pass, and with
    `x_ratelimit_headers` the `X-RateLimit-*` trio."""
    policy = ", ".join(
        f'"{r.name}";q={_limit_of(a)}' + ("" if w is None else f";w={w}")
        for r, a in zip(rules, algos)
        for w in [a.window_s()]
    )
    t = -(-d.reset_ms // 1000)
    out = [
        (b"ratelimit-policy", policy.encode()),
        (b"ratelimit", f'"{rules[index].name}";r={d.remaining};t={t}'.encode()),
    ]
    if not d.allowed and d.retry_after_s is not None:
        out.append((b"retry-after", str(d.retry_after_s).encode()))
    if x_ratelimit_headers:
        out += [
            (b"x-ratelimit-limit", str(d.limit).encode()),
            (b"x-ratelimit-remaining", str(d.remaining).encode()),
            # As flask-limiter and slowapi: the Unix time (s) of the reset.
            (b"x-ratelimit-reset", str(math.ceil(time.time() + d.reset_ms / 1000)).encode()),
        ]
    return out


def problem(
    status: int, title: str, detail: str, violated: str | None
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """A problem response's body and its `content-type` and `content-length`
    fields: `type` is quota-exceeded for a 429, else `about:blank`."""
    body: dict[str, object] = {
        "detail": detail,
        "status": status,
        "title": title,
        "type": QUOTA_EXCEEDED if status == 429 else "about:blank",
    }
    if violated is not None:
        body["violated-policies"] = [violated]
    raw = problem_json(body)
    return raw, [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(raw)).encode()),
    ]
