"""The kit against the contract file (clients/contract/contract.json, format in
clients/contract/README.md): every algorithm's parameter rules, the zones,
the `RateLimit-Policy` windows and the HTTP answer's header and body vectors.

Nothing here needs a server: the checks are the kit's own, before sending.
Every golden decision sequence runs through the local limiter's accounts
(`LocalLimiter.run`, the core's algorithms in `algorithms.py`) at a share
equal to the limit: each decision must be the vector's, exactly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from redis_ratelimit_client import algorithms
from redis_ratelimit_client.aio import AsyncClient
from redis_ratelimit_client.asgi import (
    LocalLimiter,
    Micros,
    RateLimitMiddleware,
    Rule,
    _limit_of,
    share_of,
)
from redis_ratelimit_client.errors import ProtocolError
from redis_ratelimit_client.model import (
    MAX_PARAM,
    Algorithm,
    Concurrency,
    Decision,
    FixedWindow,
    HashWindow,
    InvalidArgument,
    LeakyBucket,
    Quota,
    Sliding,
    Spec,
    TokenBucket,
    check_zone,
)
from redis_ratelimit_client.protocol import block_args
from redis_ratelimit_client.request import Request, RequestKind, RequestLike

CONTRACT_PATH = Path(__file__).resolve().parent / ".." / ".." / "contract" / "contract.json"
CONTRACT: dict[str, Any] = json.loads(CONTRACT_PATH.read_text(encoding="utf-8"))

KIT: dict[str, type[Any]] = {
    "TOKENBUCKET": TokenBucket,
    "LEAKYBUCKET": LeakyBucket,
    "FIXEDWINDOW": FixedWindow,
    "SLIDING": Sliding,
    "HASHWINDOW": HashWindow,
    "QUOTA": Quota,
    "CONCURRENCY": Concurrency,
}
ALGORITHMS: dict[str, dict[str, Any]] = {a["word"]: a for a in CONTRACT["algorithms"]}


def build(word: str, params: list[int]) -> Algorithm:
    """The kit's spec of an algorithm from the contract's integers: a keyword
    parameter (a quota's period) by its word when the index has one, else as
    the integer itself (which the kit must refuse)."""
    words = [p["keywords"] for p in ALGORITHMS[word]["params"]]
    args: list[object] = [kw[v] if kw and 0 <= v < len(kw) else v for kw, v in zip(words, params)]
    spec: Algorithm = KIT[word](*args)
    return spec


def cases(ok: bool) -> list[Any]:
    return [
        pytest.param(a["word"], v, id=f"{a['word']}-{i}-{'-'.join(map(str, v['params']))}")
        for a in CONTRACT["algorithms"]
        for i, v in enumerate(a["validation"])
        if v["ok"] is ok
    ]


def test_the_contract_is_version_1_and_the_bounds_are_the_kits() -> None:
    assert CONTRACT["version"] == 1
    assert CONTRACT["max_param"] == MAX_PARAM
    assert CONTRACT["decision_fields"] == [f.name for f in dataclasses.fields(Decision)][:5]


def test_every_algorithm_has_a_kit_spec_with_its_parameters_in_order() -> None:
    assert sorted(ALGORITHMS) == sorted(KIT)
    for word, algo in ALGORITHMS.items():
        cls = KIT[word]
        assert cls.ALGORITHM == word
        names = [p["name"] for p in algo["params"]]
        # Quota's zone comes after the contract's parameters (a keyword option).
        assert [f.name for f in dataclasses.fields(cls)][: len(names)] == names, word
        # Every algorithm has cases, both ways.
        assert {v["ok"] for v in algo["validation"]} == {True, False}, word


@pytest.mark.parametrize(("word", "case"), cases(True))
def test_the_kit_accepts_what_the_server_accepts(word: str, case: dict[str, Any]) -> None:
    spec = build(word, case["params"])
    assert spec.ALGORITHM == word


@pytest.mark.parametrize(("word", "case"), cases(False))
def test_the_kit_refuses_what_the_server_refuses_naming_the_same_parameter(
    word: str, case: dict[str, Any]
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        build(word, case["params"])
    assert caught.value.param == case["names"], str(caught.value)
    assert str(caught.value).startswith(case["names"]), str(caught.value)


@pytest.mark.parametrize("zone", CONTRACT["zones"]["accepted"])
def test_zones_the_server_accepts_are_accepted(zone: str) -> None:
    check_zone(zone)
    assert Quota(10, "DAY", zone).limit == 10


@pytest.mark.parametrize("zone", CONTRACT["zones"]["refused_by_server_only"])
def test_zones_refused_by_the_server_alone_pass_the_syntax(zone: str) -> None:
    assert check_zone(zone) == zone


@pytest.mark.parametrize("zone", CONTRACT["zones"]["refused"])
def test_zones_refused_on_syntax_are_refused(zone: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_zone(zone)
    assert caught.value.param == "zone"
    with pytest.raises(InvalidArgument):
        Quota(10, "DAY", zone)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=f"{c['algorithm']}-{'-'.join(map(str, c['params']))}")
        for c in CONTRACT["policy_window"]
    ],
)
def test_policy_window(case: dict[str, Any]) -> None:
    assert build(case["algorithm"], case["params"]).window_s() == case["w"]


# -- golden decision sequences, through the local limiter -----------------

#: The algorithms whose golden sequences the local level must reproduce.
GOLDEN_WORDS = ["TOKENBUCKET", "LEAKYBUCKET", "FIXEDWINDOW", "SLIDING", "HASHWINDOW", "QUOTA"]


def golden_step(local: LocalLimiter, word: str, step: dict[str, Any]) -> list[int]:
    """One golden step on the account `("golden", "k")` of `local`, through
    the path the middleware's accounts take, at a share equal to the limit:
    the decision's five integers."""
    spec = build(word, step["params"])
    ((kind, units),) = step["request"].items()
    d = local.run(
        "golden",
        "k",
        spec,
        _limit_of(spec),
        algorithms.Request(kind, units),
        Micros(step["at_us"]),
    )
    return [int(d.allowed), d.limit, d.remaining, d.wait_ms, d.reset_ms]


@pytest.mark.parametrize(
    ("word", "n"),
    [
        pytest.param(w, n, id=f"{w}-{n}")
        for w in GOLDEN_WORDS
        for n in range(len(ALGORITHMS[w]["golden"]))
    ],
)
def test_golden_sequences_through_the_local_limiter(word: str, n: int) -> None:
    steps = ALGORITHMS[word]["golden"][n]["steps"]
    assert steps
    local = LocalLimiter()
    for i, step in enumerate(steps):
        got = golden_step(local, word, step)
        assert got == step["decision"], (
            f"{word} #{n} step {i}: {step['params']} {step['request']} at {step['at_us']} us"
        )


def test_every_golden_algorithm_has_sequences_with_every_request() -> None:
    """The golden check covers each algorithm's COST, FORCE and REFUND, and
    parameter changes (what it would miss otherwise is said here)."""
    for word in GOLDEN_WORDS:
        seqs = ALGORITHMS[word]["golden"]
        kinds = {k for s in seqs for step in s["steps"] for k in step["request"]}
        assert kinds == {"cost", "force", "refund"}, word
        assert any(len({tuple(st["params"]) for st in s["steps"]}) > 1 for s in seqs), word


def test_a_share_scales_the_limit_and_a_buckets_refill_as_the_rust_kit() -> None:
    """`ceil(n * 11 / (instances * 10))`, at least 1, at most `n`: over 2
    instances a bucket of 10 refilled 3 a second is one of 6 refilled 2."""
    assert [share_of(n, 2) for n in (1, 3, 4, 10)] == [1, 2, 3, 6]
    assert share_of(15_000, 20) == 825 and share_of(10, 1) == 10
    local = LocalLimiter(instances=2)
    spec = TokenBucket(10, 3, 1000)
    now = Micros(1_767_225_600_000_000)
    # 6 taken; the next token 500 ms later (2 a second), not 333 ms.
    for _ in range(6):
        assert local.decide("r", "k", spec, 6, now).allowed
    d = local.decide("r", "k", spec, 6, now)
    assert (d.allowed, d.limit, d.remaining, d.wait_ms) == (False, 10, 0, 500)
    assert local.decide("r", "k", spec, 6, Micros(now + 500_000)).allowed


def test_a_refund_gives_units_back_to_the_account() -> None:
    local = LocalLimiter()
    spec = Sliding(3, 1000)
    now = Micros(1_767_225_600_000_000)
    assert local.charge("r", "k", spec, 3, now, units=3).remaining == 0
    assert not local.has_room("r", "k", spec, 3, now)
    d = local.refund("r", "k", spec, 3, now, units=2)
    assert (d.allowed, d.remaining) == (True, 2)
    assert local.has_room("r", "k", spec, 3, now)


# -- the HTTP answer, through the middleware ------------------------------


class _Redis:
    """What the middleware asks of a redis client before deciding."""

    async def ping(self) -> bool:
        return True


class _Client(AsyncClient):
    """Answers every limiter call with one decision: the vector's."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(_Redis())  # type: ignore[arg-type]
        self.decision = decision
        self.calls: list[tuple[object, Spec]] = []

    async def check_module(self) -> int:
        return 1

    async def limit(
        self,
        key: Any,
        spec: Spec,
        request: RequestLike = None,
        *,
        cost: int | None = None,
        force: bool | None = None,
        refund: int | None = None,
    ) -> Decision:
        assert request == Request.cost(1) and (cost, force, refund) == (None, None, None)
        self.calls.append((key, spec))
        return self.decision


def _serve(case: dict[str, Any]) -> tuple[int, dict[str, str], bytes, _Client]:
    """One request through the middleware whose one rule is the vector's."""
    d = case["decision"]
    decision = Decision(bool(d[0]), d[1], d[2], d[3], d[4])
    client = _Client(decision)

    async def app(scope: Any, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"hello"})

    mw = RateLimitMiddleware(
        app,
        client=client,
        rules=[Rule(build(case["algorithm"], case["params"]), case["rule"])],
        key=lambda scope: "alice",
        deny_cache_max=0,
    )
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
    asyncio.run(mw(scope, receive, send))
    start, body = sent[0], sent[-1]
    assert start["type"] == "http.response.start" and body["type"] == "http.response.body"
    headers: dict[str, str] = {}
    for k, v in start["headers"]:
        assert k.decode("latin-1") not in headers, k
        headers[k.decode("latin-1")] = v.decode("latin-1")
    return start["status"], headers, body["body"], client


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=f"{i}-{c['algorithm']}-{c['rule']}")
        for i, c in enumerate(CONTRACT["headers"])
    ],
)
def test_headers_and_problem_body(case: dict[str, Any]) -> None:
    status, headers, body, client = _serve(case)
    assert len(client.calls) == 1 and client.calls[0][0] == f"rl:{case['rule']}:alice"
    assert headers["ratelimit-policy"] == case["ratelimit_policy"]
    assert headers["ratelimit"] == case["ratelimit"]
    assert headers.get("retry-after") == (
        None if case["retry_after"] is None else str(case["retry_after"])
    )
    if case["body"] is None:
        assert case["decision"][0] == 1
        assert status == 200 and body == b"hello"
    else:
        assert status == 429
        assert headers["content-type"] == "application/problem+json"
        assert body == case["body"].encode("utf-8")
        assert headers["content-length"] == str(len(body))


# -- the options (COST, FORCE, REFUND, BLOCK) and the reply fields ----------

OPTIONS: dict[str, Any] = CONTRACT["options"]
WORDS: dict[str, dict[str, Any]] = {w["word"]: w for w in OPTIONS["words"]}
#: The kit's name for an option where it is not the option's word: a
#: blocking call's timeout is the `timeout_ms` argument (`acquire`, `lease`).
KIT_NAMES = {"BLOCK": "timeout_ms"}
#: What `Request.args()` leaves out: the default `COST 1`.
DEFAULT_COST = ["COST", str(WORDS["COST"]["default"])]


def named(word: str, param: str | None) -> bool:
    return param is not None and param.lower() == KIT_NAMES.get(word, word).lower()


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=json.dumps(c["request"])) for c in OPTIONS["requests"]]
)
def test_a_tagged_request_is_accepted_or_refused_as_the_server_does(case: dict[str, Any]) -> None:
    ((kind, units),) = case["request"].items()
    build = {"cost": Request.cost, "force": Request.force, "refund": Request.refund}[kind]
    if case["ok"]:
        req = build(units)
        assert (req.kind.value, req.units) == (kind, units)
        assert ([str(a) for a in req.args()] or DEFAULT_COST) == case["args"]
    else:
        with pytest.raises(InvalidArgument) as e:
            build(units)
        assert named(case["names"], e.value.param), (case["names"], e.value.param)
        assert str(e.value).startswith(case["message"].removeprefix("ERR "))


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=str(c["block_ms"])) for c in OPTIONS["blocks"]]
)
def test_a_blocking_timeout_is_accepted_or_refused_as_the_server_does(case: dict[str, Any]) -> None:
    if case["ok"]:
        assert [str(a) for a in block_args(case["block_ms"])] == case["args"]
    else:
        with pytest.raises(InvalidArgument) as e:
            block_args(case["block_ms"])
        assert named(case["names"], e.value.param), (case["names"], e.value.param)


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=" ".join(c["args"])) for c in OPTIONS["refused_words"]]
)
def test_words_the_server_refuses_cannot_be_built(case: dict[str, Any]) -> None:
    """A request has one kind and its units, so no request of any kind and
    units gives these words (REFUND with FORCE, an option twice, ...)."""
    values = {int(a) for a in case["args"] if a.lstrip("-").isdigit()} | {0, 1, 2}
    for kind in RequestKind:
        for units in values:
            try:
                req = Request(kind, units)
            except InvalidArgument:
                continue
            built = [str(a) for a in req.args()] or DEFAULT_COST
            assert built != case["args"]
    assert set(RequestKind) == {RequestKind(k) for k in ("cost", "force", "refund", "upto")}


@pytest.mark.parametrize("case", [pytest.param(c, id=c["command"]) for c in CONTRACT["replies"]])
def test_the_reply_parser_takes_the_fields_in_their_order(case: dict[str, Any]) -> None:
    fields = case["fields"]
    if not isinstance(fields, list):  # RL.HIT: as its policy's algorithm
        assert case["command"] == "RL.HIT"
        return
    all_reply = case["command"] == "RL.ALL"
    reply = [1, *range(11, 10 + len(fields))]
    d = Decision.from_reply(reply, all_reply=all_reply)
    # The kit's denied_by counts from 0; the reply's from 1.
    expected = {f: v - 1 if f == "denied_by" else v for f, v in zip(fields, reply)}
    expected["allowed"] = True
    assert {f: getattr(d, f) for f in fields} == expected
    # Fewer than the five decision fields, or more than six, is no reply.
    for wrong in (reply[:4], [*reply, *[99] * (7 - len(reply))]):
        with pytest.raises(ProtocolError):
            Decision.from_reply(wrong, all_reply=all_reply)


# -- the protection loop (`protection`) ------------------------------------------

PROTECTION: dict[str, Any] = CONTRACT["protection"]


def test_the_loops_defaults_are_the_contracts() -> None:
    import inspect

    from redis_ratelimit_client import Adapt, AsyncProtection, Protection
    from redis_ratelimit_client import protection as loop
    from redis_ratelimit_client.spec import LOOP_WINDOW_MS

    kits = PROTECTION["kits"]
    assert loop.REPORT_INTERVAL_MS == kits["report_interval_ms"]
    assert loop.STAGE_POLL_MS == kits["stage_poll_ms"]
    assert loop.STAGE_HOLD_MS == kits["stage_hold_ms"]
    assert kits["stage_of_many_masters"] == "the highest"
    for cls in (Protection, AsyncProtection):
        params = inspect.signature(cls).parameters
        assert params["report_interval"].default * 1000 == kits["report_interval_ms"]
        assert params["stage_poll"].default * 1000 == kits["stage_poll_ms"]
        assert params["stage_hold"].default * 1000 == kits["stage_hold_ms"]
    defaults = PROTECTION["defaults"]
    a = Adapt(5)
    assert (a.factor, a.min, a.recover, a.mincalls) == (
        defaults["factor"],
        defaults["min"],
        defaults["recover"],
        defaults["mincalls"],
    )
    assert LOOP_WINDOW_MS == defaults["window_ms"]
    assert [(s["stage"], s["name"]) for s in PROTECTION["stages"]] == [
        (loop.NORMAL, "normal"),
        (loop.DEGRADE, "degrade"),
        (loop.BREAK, "break"),
    ]


def test_the_stats_parser_takes_exactly_the_contracts_fields() -> None:
    from redis_ratelimit_client import PolicyStats
    from redis_ratelimit_client.protection import STATS_FIELDS, WINDOW_FIELDS

    assert list(STATS_FIELDS) == PROTECTION["stats_fields"]
    assert list(WINDOW_FIELDS) == PROTECTION["window_fields"]
    current = [x for i, n in enumerate(PROTECTION["window_fields"]) for x in (n, i + 1)]
    last = [x for i, n in enumerate(PROTECTION["window_fields"]) for x in (n, i + 10)]
    values = {"current": current, "last": last, "adapting": 1}
    reply = [
        x for i, n in enumerate(PROTECTION["stats_fields"]) for x in (n, values.get(n, i + 100))
    ]
    s = PolicyStats.from_reply(reply)
    assert (s.scale, s.stage, s.window_ms, s.window_end_ms, s.adapting) == (
        100,
        101,
        102,
        103,
        True,
    )
    assert dataclasses.astuple(s.current) == (1, 2, 3, 4, 5, 6, 7)
    assert dataclasses.astuple(s.last) == (10, 11, 12, 13, 14, 15, 16)
    with pytest.raises(ProtocolError):
        PolicyStats.from_reply(reply[:-2])
    with pytest.raises(ProtocolError):
        PolicyStats.from_reply([*reply[:8], "last", current, "current", last, *reply[12:]])


@pytest.mark.parametrize("case", PROTECTION["scaled"], ids=lambda c: f"{c['param']}@{c['scale']}")
def test_a_scaled_parameter_is_the_servers(case: dict[str, Any]) -> None:
    from redis_ratelimit_client.protection import scaled, scaled_algorithm

    assert scaled(case["param"], case["scale"]) == case["scaled"]
    if case["param"] <= MAX_PARAM:
        bucket = scaled_algorithm(TokenBucket(case["param"], case["param"], 1000), case["scale"])
        assert (bucket.capacity, bucket.refill_count) == (case["scaled"],) * 2  # type: ignore[union-attr]
        window = scaled_algorithm(FixedWindow(case["param"], 1000), case["scale"])
        assert window.limit == case["scaled"]  # type: ignore[union-attr]


def _loop_argument(name: str) -> Callable[[int], object]:
    from redis_ratelimit_client import Adapt, Stages
    from redis_ratelimit_client.protocol import outcome_args, policy_scale_args
    from redis_ratelimit_client.spec import loop_args

    return {
        "ERRORS": lambda v: Adapt(v),
        "FACTOR": lambda v: Adapt(5, factor=v),
        "MIN": lambda v: Adapt(5, min=v),
        "RECOVER": lambda v: Adapt(5, recover=v),
        "MINCALLS": lambda v: Adapt(5, mincalls=v),
        "WINDOW": lambda v: loop_args(None, None, v),
        "degrade_pct": lambda v: Stages(v, 100),
        "break_pct": lambda v: Stages(0, v),
        "pct": lambda v: policy_scale_args("p", v),
        "ok": lambda v: outcome_args("p", v, 0),
        "errors": lambda v: outcome_args("p", 0, v),
        "DENIED": lambda v: outcome_args("p", 0, 0, v),
    }[name]


@pytest.mark.parametrize("arg", PROTECTION["arguments"], ids=lambda a: a["name"])
def test_the_loops_arguments_are_checked_on_the_contracts_ranges(arg: dict[str, Any]) -> None:
    build = _loop_argument(arg["name"])
    low = arg["min"]
    high = 100 if arg["max"] == "degrade_pct to 100" else arg["max"]
    build(low)
    build(high)
    for bad in (low - 1, high + 1):
        with pytest.raises(InvalidArgument) as e:
            build(bad)
        assert e.value.param == arg["name"]
    if arg["name"] == "break_pct":
        from redis_ratelimit_client import Stages

        Stages(30, 30)
        with pytest.raises(InvalidArgument) as e:
            Stages(30, 29)
        assert e.value.param == "break_pct"


def test_a_policy_with_the_loops_get_fields_is_read_by_name() -> None:
    from redis_ratelimit_client.protocol import parse_policy, spec_from_policy

    values: dict[str, object] = {
        "name": "p",
        "algorithm": "TOKENBUCKET",
        "params": [10, 1, 1000],
        "adapt": [5, 80, 50, 5, 100],
        "stages": [30, 50],
    }
    fields = PROTECTION["get_fields"]
    names = [*fields["always"], *fields["when_set"], *fields["then"]]
    reply = [x for n in names for x in (n, values.get(n, 0))]
    policy = parse_policy(reply)
    assert policy is not None and list(policy) == names
    assert spec_from_policy(policy) == TokenBucket(10, 1, 1000)


# -- observability (issue 26) -------------------------------------------------------

OBSERVABILITY: dict[str, Any] = CONTRACT["observability"]


def test_the_kits_metrics_are_the_contracts() -> None:
    from redis_ratelimit_client.metrics import LEVELS, METRICS, OUTCOMES, REDIS_SECONDS_BUCKETS

    assert [
        {"name": n, "type": t, "help": h, "labels": list(labels)} for n, t, h, labels in METRICS
    ] == [{k: m[k] for k in ("name", "type", "help", "labels")} for m in OBSERVABILITY["metrics"]]
    assert list(REDIS_SECONDS_BUCKETS) == OBSERVABILITY["redis_seconds_buckets"]
    assert list(LEVELS) == [lv["level"] for lv in OBSERVABILITY["levels"]]
    assert list(OUTCOMES) == OBSERVABILITY["outcomes"]


def test_a_scrape_shows_exactly_the_contracts_names_types_labels_and_buckets() -> None:
    """What Prometheus sees: a registry fed one decision at every level and
    outcome, parsed back by prometheus_client's parser."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from redis_ratelimit_client import CircuitBreaker, Metrics, Protection
    from redis_ratelimit_client.metrics import LEVELS, OUTCOMES

    reg = CollectorRegistry()
    m = Metrics.of(reg)
    for level in LEVELS:
        for outcome in OUTCOMES:
            m.decision("rule-a", level, outcome)
    m.redis_seconds(0.003)
    m.remaining("rule-a", 1, 4)
    m.events(dropped=1, shipped=2, sink_errors=3)
    loop = Protection([], ["api"], breakers={"api": CircuitBreaker("backend")}, metrics=reg)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    for spec in OBSERVABILITY["metrics"]:
        name, kind, labels = spec["name"], spec["type"], set(spec["labels"])
        base = name[: -len("_total")] if kind == "counter" else name
        assert base in families, f"{name} missing from the scrape"
        f = families.pop(base)
        assert f.type == kind and f.documentation == spec["help"]
        assert f.samples, f"{name} has no sample"
        for s in f.samples:
            if kind == "histogram":
                assert s.name in {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
                assert set(s.labels) == ({"le"} if s.name.endswith("_bucket") else set())
            else:
                assert s.name == name and set(s.labels) == labels
    assert families == {}, f"series the contract has not: {sorted(families)}"
    text = generate_latest(reg).decode()
    les = [
        s.labels["le"]
        for f in text_string_to_metric_families(text)
        if f.name == "ratelimit_redis_seconds"
        for s in f.samples
        if s.name.endswith("_bucket")
    ]
    assert les == [*(str(float(b)) for b in OBSERVABILITY["redis_seconds_buckets"]), "+Inf"]
    assert loop.policies == ["api"]


def test_the_deny_events_are_the_contracts() -> None:
    from redis_ratelimit_client import BulkSink, DenyEvent, DenyEvents
    from redis_ratelimit_client import events as ev

    spec = OBSERVABILITY["deny_events"]
    assert list(ev.FIELDS) == spec["fields"] and list(ev.OPTIONAL) == spec["optional"]
    shipper = DenyEvents(list.append, start=False)
    assert shipper.capacity == spec["buffer_events"] == ev.BUFFER_EVENTS
    assert shipper.flush_events == spec["flush_events"]
    assert shipper.flush_interval * 1000 == spec["flush_interval_ms"]
    assert shipper.timeout * 1000 == spec["sink_timeout_ms"]
    sink = BulkSink("http://127.0.0.1:9200")
    assert sink.index == spec["bulk_index"] and sink.timeout * 1000 == spec["sink_timeout_ms"]
    assert sink.url == "http://127.0.0.1:9200/_bulk"
    # The contract's timestamp example, and the fields in order.
    example = spec["timestamp"].split("as ")[-1]
    e = DenyEvent(1_796_205_600.123, "k", "r", "redis", "denied", 5, 0, -1, "::1", "ua")
    assert e.timestamp == example == "2026-12-02T10:00:00.123Z"
    assert list(json.loads(e.to_json())) == spec["fields"]
    assert sink.body([e]).decode().splitlines() == [
        json.dumps({"index": {"_index": spec["bulk_index"]}}, separators=(",", ":")),
        e.to_json(),
    ]
    bare = DenyEvent(0.0, "k", "r", "local", "denied", 5, 0, 10)
    assert list(bare.as_dict()) == [f for f in spec["fields"] if f not in spec["optional"]]
    # headers_cut: client_ip and user_agent cut to max_header_bytes of UTF-8,
    # never inside a character, on each path an event is made by.
    assert ev.MAX_HEADER_BYTES == spec["max_header_bytes"] == 512
    m = spec["max_header_bytes"]
    long_ua, long_ip = "ab€" * m, "x" * (m + 1)  # € is 3 bytes: 512 falls inside one
    shipper.deny(
        key="k", rule="r", level="redis", limit=5, remaining=0, retry_after_ms=1,
        client_ip=long_ip, user_agent=long_ua,
    )  # fmt: skip
    shipper.record(e._replace(client_ip=long_ip, user_agent=long_ua))
    shipper.record(e)
    cut, recorded, short = shipper.buffered()
    for got in (cut, recorded):
        assert got.client_ip == "x" * m
        ua = got.user_agent
        assert ua is not None and long_ua.startswith(ua)
        assert m - 3 < len(ua.encode("utf-8")) <= m
    assert (short.client_ip, short.user_agent) == ("::1", "ua")
