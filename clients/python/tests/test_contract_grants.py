"""Conformance to the contract's `grants` section (clients/contract/contract.json,
format in clients/contract/README.md): UPTO requests, refused words and
commands in the server's words, the replies' fields, the golden UPTO
sequences in process, the batch vectors and options, the share and tag
vectors. The refusals only the server makes are checked against one."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import redis
from test_contract import CONTRACT, DEFAULT_COST, build, golden_step, named

from redis_ratelimit_client import (
    Client,
    Concurrency,
    FixedWindow,
    InvalidArgument,
    LeakyBucket,
    Request,
    ServerError,
    Sliding,
    TokenBucket,
)
from redis_ratelimit_client import algorithms as core
from redis_ratelimit_client import grants as g
from redis_ratelimit_client.decision import Decision
from redis_ratelimit_client.local import LocalLimiter
from redis_ratelimit_client.protocol import all_args, limit_args
from redis_ratelimit_client.request import RequestKind
from redis_ratelimit_client.spec import Rule, _limit_of

GRANTS: dict[str, Any] = CONTRACT["grants"]


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=str(c["request"]["upto"])) for c in GRANTS["requests"]]
)
def test_an_upto_request_is_accepted_or_refused_as_the_server_does(case: dict[str, Any]) -> None:
    units = case["request"]["upto"]
    if case["ok"]:
        req = Request.upto(units)
        assert (req.kind, req.units) == (RequestKind.UPTO, units)
        assert [str(a) for a in req.args()] == case["args"]
    else:
        with pytest.raises(InvalidArgument) as e:
            Request.upto(units)
        assert named(case["names"], e.value.param)
        assert str(e.value).startswith(case["message"].removeprefix("ERR "))


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=" ".join(c["args"])) for c in GRANTS["refused_words"]]
)
def test_words_with_upto_the_server_refuses_cannot_be_built(case: dict[str, Any]) -> None:
    values = {int(a) for a in case["args"] if a.lstrip("-").isdigit()} | {0, 1, 2}
    for kind in RequestKind:
        for units in values:
            try:
                req = Request(kind, units)
            except InvalidArgument:
                continue
            assert ([str(a) for a in req.args()] or DEFAULT_COST) != case["args"]


def test_upto_is_taken_by_the_contracts_commands() -> None:
    up = Request.upto(3)
    specs = {
        "RL.TOKENBUCKET": TokenBucket(10, 1, 1000),
        "RL.FIXEDWINDOW": FixedWindow(10, 1000),
        "RL.SLIDING": Sliding(10, 1000),
        "RL.HASHWINDOW": build("HASHWINDOW", [10, 1000, 100]),
        "RL.QUOTA": build("QUOTA", [10, 0]),
    }
    assert set(GRANTS["commands"]) == {*specs, "RL.HIT", "RL.ALL"}
    for command, spec in specs.items():
        assert limit_args("k", spec, up)[0] == command
        assert limit_args("k", spec, up)[-2:] == ["UPTO", 3]
    assert all_args([("a", specs["RL.SLIDING"])], up)[-2:] == ["UPTO", 3]


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c["command"]) for c in GRANTS["refused_commands"]]
)
def test_upto_is_refused_elsewhere_in_the_servers_words(
    case: dict[str, Any], r: redis.Redis
) -> None:
    words = case["message"].removeprefix("ERR ")
    leaky = LeakyBucket(5, 1, 1000)
    if case["command"] == "RL.HIT":
        # The policy's algorithm is the server's: its own error, word for word.
        c = Client(r)
        c.policy_set("leaky", build(case["policy"], [5, 1, 1000]))
        with pytest.raises(ServerError) as se:
            c.hit("leaky", "k", Request.upto(2))
        assert str(se.value) == words
        return
    with pytest.raises(InvalidArgument) as e:
        if case["command"] == "RL.ALL":
            limits = [("a", Sliding(5, 1000)), ("b", leaky)]
            assert len(limits) == case["spec"]
            all_args(limits, Request.upto(2))
        else:
            spec = leaky if case["command"] == "RL.LEAKYBUCKET" else Concurrency(5, 1000)
            limit_args("k", spec, Request.upto(2))
    assert str(e.value) == words and e.value.param == "UPTO"


@pytest.mark.parametrize("case", [pytest.param(c, id=c["command"]) for c in GRANTS["replies"]])
def test_the_reply_parser_takes_granted_last(case: dict[str, Any]) -> None:
    fields = case["fields"]
    if not isinstance(fields, list):
        assert case["command"] == "RL.HIT"
        return
    assert fields[:5] == CONTRACT["decision_fields"] and fields[-1] == "granted"
    values = list(range(1, len(fields) + 1))
    d = Decision.from_reply(values, all_reply=case["command"] == "RL.ALL", upto=True)
    got = dataclasses.asdict(d)
    for name, value in zip(fields, values):
        if name == "allowed":
            assert got[name] is True
        elif name == "denied_by":
            assert got[name] == value - 1  # 1-based on the wire
        else:
            assert got[name] == value, name
    assert d.lease is None


@pytest.mark.parametrize(
    ("word", "n"),
    [pytest.param(s["word"], n, id=f"{s['word']}-{n}") for n, s in enumerate(GRANTS["golden"])],
)
def test_golden_upto_sequences_in_process(word: str, n: int) -> None:
    seq = GRANTS["golden"][n]
    local = LocalLimiter()
    spec = build(word, seq["params"])
    assert seq["steps"] and any("upto" in s["request"] for s in seq["steps"])
    for i, step in enumerate(seq["steps"]):
        ((kind, units),) = step["request"].items()
        algo, params, state = local._account("golden", "k", spec, _limit_of(spec), step["at_us"])
        cost = (
            core.upto_cost(algo, state, params, units, step["at_us"]) if kind == "upto" else units
        )
        got = golden_step(local, word, {**step, "params": seq["params"]})
        granted = cost if got[0] else 0
        assert (got, granted) == (step["decision"], step["granted"]), f"{word} step {i}"


@pytest.mark.parametrize("v", GRANTS["batched"]["vectors"], ids=lambda v: str(v["batch"]))
def test_batch_vectors(v: dict[str, int]) -> None:
    assert g.batch_size(v["rate_per_s"], v["hold_ms"], v["limit"], v["max_share_pct"]) == v["batch"]


def test_batched_options_and_algorithms_are_the_contracts() -> None:
    b = GRANTS["batched"]
    assert [a.ALGORITHM for a in g.GRANTABLE] == b["algorithms"] == GRANTS["stripes"]["algorithms"]
    fields = {f.name: f.default for f in dataclasses.fields(Rule)}
    assert (g.HOLD_MS, g.MAX_HOLD_MS) == (b["hold_ms"]["default"], b["hold_ms"]["max"])
    assert g.MAX_SHARE_PCT == b["max_share_pct"]["default"]
    for option in ("hold_ms", "max_share_pct"):
        rng = b[option]
        assert fields[option] == rng["default"]
        for ok in (rng["min"], rng["max"]):
            Rule(
                FixedWindow(100, 1000),
                "r",
                fixed_key="k",
                global_=True,
                batched=True,
                **{option: ok},
            )
        for bad in (rng["min"] - 1, rng["max"] + 1):
            with pytest.raises(InvalidArgument) as e:
                Rule(FixedWindow(100, 1000), "r", fixed_key="k", global_=True, **{option: bad})
            assert e.value.param == option
    n = GRANTS["stripes"]["n"]
    assert (n["min"], n["max"]) == (2, g.MAX_STRIPES)
    with pytest.raises(InvalidArgument) as e:
        Rule(FixedWindow(1000, 1000), "r", fixed_key="k", global_=True, striped=n["max"] + 1)
    assert e.value.param == "striped"


@pytest.mark.parametrize(
    "v", GRANTS["stripes"]["share_vectors"], ids=lambda v: f"{v['total']}-{v['n']}"
)
def test_share_vectors(v: dict[str, Any]) -> None:
    shares = g.stripe_specs(FixedWindow(v["total"], 1000), v["n"])
    assert [s.limit for s in shares] == v["shares"]  # type: ignore[union-attr]
    tb = g.stripe_specs(TokenBucket(v["total"], v["total"], 1000), v["n"])
    assert [(s.capacity, s.refill_count) for s in tb] == [(x, x) for x in v["shares"]]  # type: ignore[union-attr]
    if v["total"] > 1:
        with pytest.raises(InvalidArgument) as e:
            g.stripe_specs(FixedWindow(v["n"] - 1, 1000), v["n"])
        assert e.value.param == "striped"


@pytest.mark.parametrize(
    "v", GRANTS["stripes"]["tag_vectors"], ids=lambda v: f"{len(v['masters'])}-{v['n']}"
)
def test_tag_vectors(v: dict[str, Any]) -> None:
    masters = [[(lo, hi) for lo, hi in m] for m in v["masters"]]
    tags = g.stripe_tags(masters, v["n"])
    assert tags == v["tags"]
    assert [g.slot_of(t) for t in tags] == v["slots"]
    if len(masters) == 1:
        assert g.stripe_tags(g.ONE_MASTER, v["n"]) == v["tags"]
