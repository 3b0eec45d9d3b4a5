"""RL.CONCURRENCY, RL.RELEASE and RL.RENEW: the typed calls and the lease
context managers, against a real redis-server with the module."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
import redis.asyncio as aioredis
from conftest import Cluster, Server, wait_until

from redis_ratelimit_client import (
    AsyncClient,
    Client,
    Concurrency,
    Denied,
    InvalidArgument,
    Policy,
    Sliding,
    TokenBucket,
)
from redis_ratelimit_client.request import Request


@pytest.fixture
def c(r: redis.Redis) -> Client:
    return Client(r)


def held(c: Client, key: str, limit: int) -> int:
    """Units held now on `key` (a COST 0 peek)."""
    return limit - c.concurrency(key, limit, 1000, Request.cost(0)).remaining


def test_concurrency_grants_leases_up_to_the_limit(c: Client) -> None:
    a = c.concurrency("jobs", 2, 30_000)
    b = c.concurrency("jobs", 2, 30_000)
    assert (a.allowed, a.limit, a.remaining, a.wait_ms) == (True, 2, 1, 0)
    assert b.allowed and b.remaining == 0
    assert a.lease is not None and b.lease is not None and a.lease != b.lease
    assert a.denied_by is None
    denied = c.concurrency("jobs", 2, 30_000)
    assert not denied.allowed and denied.lease is None
    assert 0 < denied.wait_ms <= 30_000 and denied.retry_after_s == 30
    assert c.concurrency("jobs", 2, 30_000, Request.cost(3)).never
    # A release frees at once, long before the lease's expiry; only once.
    assert c.release("jobs", a.lease) is True
    assert c.release("jobs", a.lease) is False
    again = c.concurrency("jobs", 2, 30_000)
    assert again.allowed and again.lease is not None and again.lease > b.lease
    assert c.renew("jobs", b.lease, 60_000) is True
    assert c.renew("jobs", a.lease, 60_000) is False
    assert c.release("unknown-key", 12345) is False


def test_an_unreleased_lease_ends_by_itself(c: Client) -> None:
    d = c.concurrency("crashed", 1, 200)
    assert d.allowed and not c.concurrency("crashed", 1, 200).allowed
    wait_until(lambda: c.concurrency("crashed", 1, 200).allowed, 5, "the lease to expire")
    assert d.lease is not None and c.renew("crashed", d.lease, 200) is False


def test_a_lease_is_released_when_its_block_ends(c: Client) -> None:
    spec = Concurrency(1, 30_000)
    with c.lease("report", spec) as lease:
        assert lease.id > 0 and lease.decision.remaining == 0
        with pytest.raises(Denied) as denied:
            with c.lease("report", spec):
                pass
        assert denied.value.decision.wait_ms > 0 and denied.value.key == "report"
    assert lease.released and held(c, "report", 1) == 0
    with pytest.raises(RuntimeError):
        with c.lease("report", spec):
            assert held(c, "report", 1) == 1
            raise RuntimeError("the work failed")
    # Released on the exception too: a second lease is granted.
    with c.lease("report", spec) as second:
        assert second.id > lease.id


def test_renewing_keeps_a_lease_past_its_lease_ms(c: Client) -> None:
    spec = Concurrency(1, 600)
    with c.lease("long", spec, renew=True) as lease:  # renewed every 200 ms
        started = time.monotonic()
        while time.monotonic() - started < 2.4:  # four times the lease
            assert not c.concurrency("long", 1, 600).allowed
            time.sleep(0.1)
        assert not lease.lost and lease.renew() is True
    assert held(c, "long", 1) == 0
    # Without renewal the same lease would have ended: it is the renewal that held it.
    d = c.concurrency("short", 1, 300)
    wait_until(lambda: c.concurrency("short", 1, 300).allowed, 5, "expiry")
    assert d.lease is not None and not c.release("short", d.lease)


def test_a_lost_lease_is_reported(c: Client, r: redis.Redis) -> None:
    with c.lease("gone", Concurrency(1, 30_000)) as lease:
        r.delete("gone")
        assert lease.renew() is False and lease.lost
    assert lease.released


def test_never_more_than_limit_leases_under_concurrent_use(c: Client) -> None:
    limit, lock = 3, threading.Lock()
    in_flight, peak, granted = [0], [0], [0]

    def worker() -> None:
        for _ in range(15):
            try:
                with c.lease("shared", Concurrency(limit, 10_000)):
                    with lock:
                        in_flight[0] += 1
                        peak[0] = max(peak[0], in_flight[0])
                        granted[0] += 1
                    time.sleep(0.002)
                    with lock:
                        in_flight[0] -= 1
            except Denied:
                pass

    with ThreadPoolExecutor(20) as pool:
        for f in [pool.submit(worker) for _ in range(20)]:
            f.result()
    assert 1 <= peak[0] <= limit and granted[0] >= 15
    assert held(c, "shared", limit) == 0


def test_a_concurrency_policy_grants_leases_through_hit(c: Client) -> None:
    c.policy_set("exports", Concurrency(2, 30_000))
    p = c.policy_get("exports")
    assert p is not None and p["algorithm"] == "CONCURRENCY"
    d = c.hit("exports", "exports:acme")
    assert d.allowed and d.lease is not None and d.remaining == 1
    with c.lease("exports:acme", Policy("exports")) as lease:
        assert lease.decision.remaining == 0
        with pytest.raises(InvalidArgument, match="renew_ms"):
            lease.renew()
        assert lease.renew(30_000)
    assert c.release("exports:acme", d.lease)
    c.policy_set("rate", Sliding(5, 60_000))
    with pytest.raises(InvalidArgument, match="not a CONCURRENCY policy"):
        with c.lease("k", Policy("rate")):
            pass


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.concurrency("k", 0, 1000),
        lambda c: c.concurrency("k", 1 << 24, 1000),
        lambda c: c.concurrency("k", 5, 0),
        lambda c: c.concurrency("k", 5, True),
        lambda c: c.concurrency("", 5, 1000),
        lambda c: c.release("k", -1),
        lambda c: c.release("k", 1 << 63),
        lambda c: c.release("k", "1"),
        lambda c: c.release(b"", 1),
        lambda c: c.renew("k", 1, 0),
        lambda c: c.renew("k", 1.5, 1000),
        lambda c: c.all([("{a}1", Concurrency(1, 1000))]),
        lambda c: c.lease("k", TokenBucket(1, 1, 1)).__enter__(),
        lambda c: c.lease("k", Concurrency(1, 1000), Request.cost(0)).__enter__(),
        lambda c: c.lease("k", Concurrency(1, 1000), renew=True, renew_every=0).__enter__(),
        lambda c: c.lease("k", Policy("p"), renew=True).__enter__(),
        lambda c: c.acquire("k", Concurrency(1, 1000), timeout_ms=-1),
        lambda c: c.acquire("k", Sliding(1, 1000), timeout_ms=1 << 41),
        lambda c: c.acquire_all([("{a}1", Concurrency(1, 1000))], timeout_ms=10),
    ],
)
def test_bad_input_names_the_argument_and_writes_nothing(c: Client, r: redis.Redis, call) -> None:
    with pytest.raises(InvalidArgument):
        call(c)
    assert r.dbsize() == 0


def test_bad_input_messages_name_the_argument(c: Client) -> None:
    msg = "lease must be an integer from 0 to 9223372036854775807"
    with pytest.raises(InvalidArgument, match=msg):
        c.release("k", -1)
    with pytest.raises(InvalidArgument, match="lease_ms must be"):
        c.renew("k", 1, 0)
    with pytest.raises(InvalidArgument, match="limit must be an integer from 1 to 16777215"):
        Concurrency(0, 1000)
    with pytest.raises(InvalidArgument, match="timeout_ms must be"):
        c.acquire("k", Sliding(1, 1000), timeout_ms=-5)
    with pytest.raises(InvalidArgument, match="CONCURRENCY cannot be used here"):
        c.all([("{a}1", Sliding(1, 1000)), ("{a}2", Concurrency(1, 1000))])


def test_asyncio_leases(server: Server, r: redis.Redis) -> None:
    async def go() -> None:
        a = await AsyncClient.create(aioredis.Redis(port=server.port))
        d = await a.concurrency("ajobs", 1, 30_000)
        assert d.allowed and d.lease is not None
        assert not (await a.concurrency("ajobs", 1, 30_000)).allowed
        assert await a.renew("ajobs", d.lease, 30_000)
        assert await a.release("ajobs", d.lease) and not await a.release("ajobs", d.lease)

        spec = Concurrency(1, 600)
        async with a.lease("alease", spec, renew=True) as lease:
            started = time.monotonic()
            while time.monotonic() - started < 2.0:
                assert not (await a.concurrency("alease", 1, 600)).allowed
                await asyncio.sleep(0.1)
            assert not lease.lost
            with pytest.raises(Denied):
                async with a.lease("alease", spec):
                    pass
        assert (
            lease.released
            and (await a.concurrency("alease", 1, 600, Request.cost(0))).remaining == 1
        )

        with pytest.raises(KeyError):
            async with a.lease("alease", spec):
                raise KeyError("failed")
        assert (await a.concurrency("alease", 1, 600, Request.cost(0))).remaining == 1

        # A cancelled holder still gives its lease back.
        entered = asyncio.Event()

        async def holder() -> None:
            async with a.lease("alease", Concurrency(1, 30_000)):
                entered.set()
                await asyncio.Event().wait()

        task = asyncio.ensure_future(holder())
        await entered.wait()
        assert (await a.concurrency("alease", 1, 30_000, Request.cost(0))).remaining == 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await a.concurrency("alease", 1, 30_000, Request.cost(0))).remaining == 1

        # 30 tasks on 4 units: never more than 4 held.
        in_flight, peak = [0], [0]

        async def worker() -> None:
            for _ in range(5):
                try:
                    async with a.lease("apeak", Concurrency(4, 10_000)):
                        in_flight[0] += 1
                        peak[0] = max(peak[0], in_flight[0])
                        await asyncio.sleep(0.002)
                        in_flight[0] -= 1
                except Denied:
                    await asyncio.sleep(0)

        await asyncio.gather(*[worker() for _ in range(30)])
        assert 1 <= peak[0] <= 4
        assert (await a.concurrency("apeak", 4, 10_000, Request.cost(0))).remaining == 4
        await a.redis.aclose()

    asyncio.run(go())


def test_cluster_routes_leases_to_the_owner(cluster: Cluster) -> None:
    from redis.cluster import ClusterNode, RedisCluster

    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.nodes[0].port)])
    c = Client(rc)
    before = cluster.moved_errors()
    keys = [f"lease:{i}" for i in range(20)]
    for k in keys:
        with c.lease(k, Concurrency(1, 30_000)) as lease:
            assert c.renew(k, lease.id, 30_000)
            assert not c.concurrency(k, 1, 30_000).allowed
        assert c.concurrency(k, 1, 30_000, Request.cost(0)).remaining == 1

    async def go() -> None:
        from redis.asyncio.cluster import ClusterNode as ANode
        from redis.asyncio.cluster import RedisCluster as ARC

        arc = ARC(startup_nodes=[ANode("127.0.0.1", cluster.nodes[1].port)])
        a = await AsyncClient.create(arc)
        for k in keys:
            async with a.lease(k, Concurrency(1, 30_000)) as lease:
                assert await a.renew(k, lease.id, 30_000)
            assert (await a.concurrency(k, 1, 30_000, Request.cost(0))).remaining == 1
        await arc.aclose()

    asyncio.run(go())
    assert cluster.moved_errors() == before
    rc.close()


def test_a_failed_release_is_logged_not_raised(
    own_server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    c = Client(own_server.client(retry=Retry(NoBackoff(), 0)))
    with c.lease("k", Concurrency(1, 30_000)) as lease:
        own_server.kill()  # the work is done; the lease will end at its expiry
    assert lease.released
    assert "releasing lease" in caplog.text and "ends at its expiry" in caplog.text
