"""`UPTO n` through the typed calls (issue 27), against a real server: all
that fits or nothing, the sixth field `granted`, the errors naming UPTO."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis
from conftest import FIXED_MS, Server

from redis_ratelimit_client import (
    AsyncClient,
    Client,
    Concurrency,
    FixedWindow,
    HashWindow,
    InvalidArgument,
    LeakyBucket,
    Quota,
    Request,
    ServerError,
    Sliding,
    TokenBucket,
)
from redis_ratelimit_client.decision import Decision
from redis_ratelimit_client.errors import ProtocolError

#: The five algorithms that take UPTO, each with a limit of 10 that does not
#: come back during a test (a refill of 1 per hour, day-long windows).
FIVE = [
    TokenBucket(10, 1, 3_600_000),
    FixedWindow(10, FIXED_MS),
    Sliding(10, 3_600_000),
    HashWindow(10, 3_600_000, 60_000),
    Quota(10, "YEAR"),
]


@pytest.mark.parametrize("spec", FIVE, ids=lambda s: s.ALGORITHM)
def test_upto_takes_what_fits_or_nothing(r: redis.Redis, spec: object) -> None:
    c = Client(r)
    first = c.limit("u", spec, Request.upto(4))  # type: ignore[arg-type]
    assert first.allowed and first.granted == 4 and first.remaining == 6 and first.limit == 10
    second = c.limit("u", spec, Request.upto(100))  # type: ignore[arg-type]
    assert second.allowed and second.granted == 6 and second.remaining == 0
    third = c.limit("u", spec, Request.upto(3))  # type: ignore[arg-type]
    # Not even one unit: the denial COST 1 gets (its wait for one unit).
    assert not third.allowed and third.granted == 0 and third.remaining == 0
    assert third.wait_ms > 0
    # A call without UPTO answers as before: no granted field.
    plain = c.limit("other", spec, Request.cost(2))  # type: ignore[arg-type]
    assert plain.allowed and plain.granted is None and plain.remaining == 8


def test_upto_on_every_typed_call_name(r: redis.Redis) -> None:
    c = Client(r)
    assert c.token_bucket("tb", 5, 1, 60_000, Request.upto(9)).granted == 5
    assert c.fixed_window("fw", 5, FIXED_MS, Request.upto(2)).granted == 2
    assert c.sliding("sl", 5, 60_000, Request.upto(7)).granted == 5
    assert c.hash_window("hw", 5, 60_000, 1000, Request.upto(1)).granted == 1
    assert c.quota("q", 5, "DAY", None, Request.upto(3)).granted == 3


def test_upto_through_a_policy_and_rl_all(r: redis.Redis) -> None:
    c = Client(r)
    c.policy_set("grantable", FixedWindow(6, FIXED_MS))
    d = c.hit("grantable", "p", Request.upto(4))
    assert d.allowed and d.granted == 4 and d.remaining == 2
    both = c.all([("a", FixedWindow(3, FIXED_MS)), ("b", Sliding(5, 60_000))], Request.upto(4))
    # The largest number every limiter admits at once: 3.
    assert both.allowed and both.granted == 3 and both.denied_by is None
    again = c.all([("a", FixedWindow(3, FIXED_MS)), ("b", Sliding(5, 60_000))], Request.upto(4))
    assert not again.allowed and again.granted == 0 and again.denied_by == 0


def test_upto_is_refused_on_leaky_bucket_and_concurrency_naming_it(r: redis.Redis) -> None:
    c = Client(r)
    for spec in (LeakyBucket(5, 1, 1000), Concurrency(5, 1000)):
        with pytest.raises(InvalidArgument, match="UPTO is not an option of RL") as e:
            c.limit("x", spec, Request.upto(2))
        assert e.value.param == "UPTO"
    with pytest.raises(InvalidArgument) as e:
        c.all([("x", LeakyBucket(5, 1, 1000))], Request.upto(2))
    assert e.value.param == "UPTO"
    # A policy's algorithm is the server's to know: its own words.
    c.policy_set("leaky", LeakyBucket(5, 1, 1000))
    with pytest.raises(ServerError, match="UPTO is not an option of RL.HIT on a LEAKYBUCKET"):
        c.hit("leaky", "x", Request.upto(2))
    assert r.dbsize() == 0


@pytest.mark.parametrize("units", [0, -1, (1 << 40) + 1, True, 1.5])
def test_upto_units_are_checked_naming_upto(units: object) -> None:
    with pytest.raises(InvalidArgument) as e:
        Request.upto(units)  # type: ignore[arg-type]
    assert e.value.param == "UPTO"
    assert Request.upto(1 << 40).args() == ["UPTO", 1 << 40]


def test_the_server_refuses_upto_with_cost_naming_both(r: redis.Redis) -> None:
    with pytest.raises(redis.ResponseError, match="UPTO cannot be given with COST"):
        r.execute_command("RL.SLIDING", "k", 5, 1000, "UPTO", 2, "COST", 1)


def test_a_reply_without_granted_is_a_protocol_error() -> None:
    assert Decision.from_reply([1, 10, 6, 0, 5, 4], upto=True).granted == 4
    assert Decision.from_reply([0, 10, 0, 9, 5, 1, 0], all_reply=True, upto=True).denied_by == 0
    with pytest.raises(ProtocolError):
        Decision.from_reply([1, 10, 6, 0, 5], upto=True)


def test_blocking_upto_waits_for_the_first_unit(r: redis.Redis) -> None:
    c = Client(r)
    assert c.token_bucket("blk", 2, 1, 100, Request.upto(2)).granted == 2
    d = c.acquire("blk", TokenBucket(2, 1, 100), Request.upto(5), timeout_ms=5000)
    assert d.allowed and d.granted is not None and 1 <= d.granted <= 2


def test_async_upto(server: Server, r: redis.Redis) -> None:
    async def main() -> tuple[Decision, Decision, Decision]:
        ar = aioredis.Redis(host="127.0.0.1", port=server.port)
        try:
            c = await AsyncClient.create(ar)
            one = await c.token_bucket("atb", 10, 1, 3_600_000, Request.upto(7))
            two = await c.limit("atb", TokenBucket(10, 1, 3_600_000), Request.upto(7))
            three = await c.all([("aa", Sliding(2, 60_000))], Request.upto(7))
            with pytest.raises(InvalidArgument):
                await c.limit("x", Concurrency(1, 10), Request.upto(1))
            return one, two, three
        finally:
            await ar.aclose()

    one, two, three = asyncio.run(main())
    assert (one.granted, one.remaining, two.granted, two.remaining) == (7, 3, 3, 0)
    assert three.allowed and three.granted == 2


@pytest.mark.parametrize(
    "word, params",
    [
        ("TOKENBUCKET", (10, 1, 3_600_000)),
        ("FIXEDWINDOW", (10, 3_600_000)),
        ("SLIDING", (10, 3_600_000)),
        ("HASHWINDOW", (10, 3_600_000, 60_000)),
        ("QUOTA", (10, 3, 0)),
    ],
)
def test_in_process_upto_is_the_servers_fits(word: str, params: tuple[int, ...]) -> None:
    from redis_ratelimit_client import algorithms as core

    algo, now = core.BY_WORD[word], 1_700_000_000_000_000
    state = algo.idle(params, now)
    first, changed = core.run(algo, state, params, Request.upto(4).core(), now)
    assert first.allowed and changed and first.remaining == 6
    assert core.upto_cost(algo, state, params, 100, now) == 6
    second, _ = core.run(algo, state, params, Request.upto(100).core(), now)
    assert second.allowed and second.remaining == 0
    third, changed = core.run(algo, state, params, Request.upto(3).core(), now)
    assert not third.allowed and not changed and third.wait_ms > 0


def test_upto_on_valkey(valkey: Server) -> None:
    c = Client(valkey.client())
    valkey.client().delete("vk")
    d = c.sliding("vk", 3, 60_000, Request.upto(5))
    assert d.allowed and d.granted == 3 and d.remaining == 0
    assert c.sliding("vk", 3, 60_000, Request.upto(5)).granted == 0
