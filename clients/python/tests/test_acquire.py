"""`acquire` on `BLOCK timeout_ms`: waiting in the server, on connections of
its own, against a real redis-server with the module.

These need a module with BLOCK. Against one without it (it answers
`unknown option 'BLOCK'`) they are skipped, unless RL_REQUIRE_BLOCK=1 makes
that a failure.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import pytest
import redis
import redis.asyncio as aioredis
import redis.sentinel
from conftest import FIXED_MS, Cluster, Sentinel, Server, has_block, wait_until

from redis_ratelimit_client import (
    AsyncClient,
    Client,
    Concurrency,
    Decision,
    Denied,
    FixedWindow,
    LeakyBucket,
    Policy,
    Sliding,
    TokenBucket,
)
from redis_ratelimit_client.request import Request


@pytest.fixture
def c(r: redis.Redis) -> Iterator[Client]:
    if not has_block(r):
        if os.environ.get("RL_REQUIRE_BLOCK") == "1":
            pytest.fail(f"the module {os.environ.get('RL_MODULE')} has no BLOCK")
        pytest.skip("the module has no BLOCK yet (RL_MODULE is a build without it)")
    client = Client(r)
    yield client
    client.close()


def blocked(r: redis.Redis, n: int = 1) -> bool:
    """Whether `n` requests are blocked in the module (INFO ratelimit)."""
    return int(r.info("ratelimit")["ratelimit_blocked_now"]) >= n


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(8) as p:
        yield p


def in_thread(pool: ThreadPoolExecutor, fn: Callable[[], Any]) -> Future[Any]:
    return pool.submit(fn)


def test_a_blocked_acquire_is_admitted_when_a_lease_is_released(
    c: Client, r: redis.Redis, pool: ThreadPoolExecutor
) -> None:
    # The server waits when the time until the lease expires (20 s) fits the timeout;
    # the release admits the waiter long before that.
    first = c.concurrency("jobs", 1, 20_000)
    assert first.lease is not None
    waiting = in_thread(pool, lambda: c.acquire("jobs", Concurrency(1, 20_000), timeout_ms=30_000))
    wait_until(lambda: blocked(r), 10, "the acquire to block in the server")
    assert not waiting.done()
    assert c.release("jobs", first.lease)
    d: Decision = waiting.result(10)
    assert d.allowed and d.lease is not None and d.lease != first.lease
    assert c.release("jobs", d.lease)


def test_a_timeout_is_the_denial_at_about_the_timeout(c: Client) -> None:
    # The lease would end in 1 s, within the 1.5 s timeout, but its holder renews it.
    with c.lease("full", Concurrency(1, 1000), renew=True, renew_every=0.1):
        started = time.monotonic()
        d = c.acquire("full", Concurrency(1, 1000), timeout_ms=1500)
        elapsed = time.monotonic() - started
        assert not d.allowed and d.lease is None and d.wait_ms > 0
        assert 1.4 <= elapsed < 6.0
    # A wait longer than the timeout, or one that can never end, answers at once.
    c.concurrency("full", 1, 60_000)
    started = time.monotonic()
    assert not c.acquire("full", Concurrency(1, 60_000), timeout_ms=400).allowed
    assert c.acquire("full", Concurrency(1, 60_000), Request.cost(2), timeout_ms=10_000).never
    assert time.monotonic() - started < 2.0


def test_a_blocked_acquire_does_not_stall_the_other_calls(
    c: Client, r: redis.Redis, pool: ThreadPoolExecutor
) -> None:
    spec = TokenBucket(1, 1, 3000)
    assert c.limit("tb2", spec).allowed
    waiting = in_thread(pool, lambda: c.acquire("tb2", spec, timeout_ms=20_000))
    wait_until(lambda: blocked(r), 10, "the acquire to block")
    started = time.monotonic()
    for i in range(20):
        assert c.sliding(f"other:{i}", 5, 1000).allowed
    assert time.monotonic() - started < 1.5 and not waiting.done()
    assert waiting.result(10).allowed  # at the refill, 3 s after the first unit


def test_an_admitted_leaky_bucket_resolves_after_its_wait(c: Client) -> None:
    spec = LeakyBucket(5, 1, 400)
    assert c.limit("shape", spec).wait_ms == 0
    started = time.monotonic()
    d = c.acquire("shape", spec, timeout_ms=5000)
    elapsed = time.monotonic() - started
    assert d.allowed and d.wait_ms > 0
    assert elapsed >= d.wait_ms / 1000.0 - 0.01


def test_acquire_waits_for_a_token_bucket_refill(c: Client) -> None:
    spec = TokenBucket(1, 1, 300)
    assert c.limit("tb", spec).allowed
    started = time.monotonic()
    d = c.acquire("tb", spec, timeout_ms=5000)
    assert d.allowed and 0.2 <= time.monotonic() - started < 5.0


def test_acquire_on_a_policy_and_on_all(c: Client) -> None:
    c.policy_set("api", FixedWindow(1, FIXED_MS))
    assert c.acquire("p:1", Policy("api"), timeout_ms=1000).allowed
    assert not c.acquire("p:1", Policy("api"), timeout_ms=200).allowed
    rules = [("{o}:a", TokenBucket(1, 1, 300)), ("{o}:b", Sliding(10, 60_000))]
    assert c.acquire_all(rules, timeout_ms=1000).allowed
    d = c.acquire_all(rules, timeout_ms=5000)
    assert d.allowed and d.denied_by is None
    assert c.sliding("{o}:b", 10, 60_000, Request.cost(0)).remaining == 8


def test_block_zero_waits_without_a_limit(
    c: Client, r: redis.Redis, pool: ThreadPoolExecutor
) -> None:
    spec = TokenBucket(1, 1, 500)
    assert c.limit("forever", spec).allowed
    waiting = in_thread(pool, lambda: c.acquire("forever", spec, timeout_ms=0))
    wait_until(lambda: blocked(r), 10, "the acquire to block")
    assert waiting.result(10).allowed


def test_a_lease_can_wait_for_its_units(
    c: Client, r: redis.Redis, pool: ThreadPoolExecutor
) -> None:
    spec = Concurrency(1, 1500)
    crashed = c.concurrency("report", 1, 1500)  # a holder that never releases

    def wait_then_hold() -> tuple[int, int]:
        with c.lease("report", spec, timeout_ms=20_000) as lease:
            return lease.id, c.concurrency("report", 1, 1500, Request.cost(0)).remaining

    entered = in_thread(pool, wait_then_hold)
    wait_until(lambda: blocked(r), 10, "the second lease to wait")
    # Granted when the crashed holder's lease expired; released at the block's end.
    second, remaining = entered.result(10)
    assert crashed.lease is not None and second > crashed.lease and remaining == 0
    assert c.concurrency("report", 1, 1500, Request.cost(0)).remaining == 1
    with c.lease("report", spec):
        with pytest.raises(Denied) as denied:
            with c.lease("report", spec, timeout_ms=300):
                pass
        assert denied.value.decision.wait_ms > 0


def test_asyncio_acquire(server: Server, r: redis.Redis, c: Client) -> None:
    async def go() -> None:
        a = await AsyncClient.create(aioredis.Redis(port=server.port))
        first = await a.concurrency("ajobs", 1, 1500)
        assert first.lease is not None
        waiting = asyncio.ensure_future(a.acquire("ajobs", Concurrency(1, 1500), timeout_ms=20_000))
        while not blocked(r):
            await asyncio.sleep(0.02)
        # The shared connection answers at once while the acquire is blocked.
        for i in range(10):
            d = await asyncio.wait_for(a.sliding(f"aother:{i}", 5, 1000), 2.0)
            assert d.allowed
        assert not waiting.done()
        assert await a.release("ajobs", first.lease)
        got = await asyncio.wait_for(waiting, 10)
        assert got.allowed and got.lease is not None

        async with a.lease("arenewed", Concurrency(1, 1000), renew=True, renew_every=0.1):
            started = time.monotonic()
            denied = await a.acquire("arenewed", Concurrency(1, 1000), timeout_ms=1200)
            assert not denied.allowed and 1.1 <= time.monotonic() - started < 6.0

        # A lease that waits, then holds.
        async def release_soon() -> None:
            while not blocked(r):
                await asyncio.sleep(0.02)
            assert got.lease is not None
            await a.release("ajobs", got.lease)

        releaser = asyncio.ensure_future(release_soon())
        async with a.lease("ajobs", Concurrency(1, 10_000), timeout_ms=20_000) as lease:
            assert lease.id > 0
        await releaser
        assert (await a.concurrency("ajobs", 1, 10_000, Request.cost(0))).remaining == 1

        spec = LeakyBucket(5, 1, 300)
        await a.limit("ashape", spec)
        started = time.monotonic()
        d = await a.acquire("ashape", spec, timeout_ms=5000)
        assert d.allowed and time.monotonic() - started >= d.wait_ms / 1000.0 - 0.01

        # A cancelled acquire is forgotten by the server: nothing consumed.
        await a.concurrency("acancel", 2, 10_000)
        await a.concurrency("acancel", 2, 10_000)
        admitted_before = r.info("ratelimit")["ratelimit_blocked_admitted"]
        task = asyncio.ensure_future(
            a.acquire("acancel", Concurrency(2, 10_000), timeout_ms=20_000)
        )
        while not blocked(r):
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while blocked(r):
            await asyncio.sleep(0.02)
        assert (await a.concurrency("acancel", 2, 10_000, Request.cost(0))).remaining == 0
        assert r.info("ratelimit")["ratelimit_blocked_admitted"] == admitted_before
        await a.close()
        await a.redis.aclose()

    asyncio.run(go())


def test_cluster_acquire_goes_to_the_owner(c: Client, cluster: Cluster) -> None:
    from redis.cluster import ClusterNode, RedisCluster

    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.nodes[0].port)])
    cc = Client(rc)
    before = cluster.moved_errors()
    for i in range(10):
        k = f"acq:{i}"
        assert cc.acquire(k, TokenBucket(1, 1, 200), timeout_ms=1000).allowed
        assert cc.acquire(k, TokenBucket(1, 1, 200), timeout_ms=2000).allowed
        with cc.lease(f"lease:{k}", Concurrency(1, 10_000), timeout_ms=1000):
            pass

    async def go() -> None:
        from redis.asyncio.cluster import ClusterNode as ANode
        from redis.asyncio.cluster import RedisCluster as ARC

        arc = ARC(startup_nodes=[ANode("127.0.0.1", cluster.nodes[1].port)])
        a = await AsyncClient.create(arc)
        for i in range(10):
            assert (await a.acquire(f"aacq:{i}", Sliding(1, 200), timeout_ms=1000)).allowed
            assert (await a.acquire(f"aacq:{i}", Sliding(1, 200), timeout_ms=2000)).allowed
        await a.close()
        await arc.aclose()

    asyncio.run(go())
    assert cluster.moved_errors() == before
    cc.close()
    rc.close()


def test_acquire_through_sentinel(c: Client, sentinel: Sentinel) -> None:
    s = redis.sentinel.Sentinel([("127.0.0.1", sentinel.port)], socket_timeout=2)
    sc = Client(s.master_for("rlmaster", socket_timeout=0.5))
    assert sc.acquire("sen:acq", TokenBucket(1, 1, 300), timeout_ms=1000).allowed
    # The wait outlasts the client's own 0.5 s socket timeout: its deadline is the BLOCK's.
    assert sc.acquire("sen:acq", TokenBucket(1, 1, 1500), timeout_ms=5000).allowed
    sc.close()


def test_acquire_on_valkey(valkey: Server) -> None:
    v = valkey.client()
    if not has_block(v):
        pytest.skip("the module has no BLOCK yet")
    vc = Client(v)
    first = vc.concurrency("vjobs", 1, 1500)
    assert first.lease is not None
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(vc.acquire, "vjobs", Concurrency(1, 1500), timeout_ms=20_000)
        wait_until(lambda: blocked(v), 10, "the acquire to block")
        assert vc.sliding("vother", 5, 1000).allowed and not waiting.done()
        vc.release("vjobs", first.lease)
        assert waiting.result(10).allowed
    vc.close()
