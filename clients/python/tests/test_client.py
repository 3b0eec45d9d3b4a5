"""The typed calls, against a real redis-server with the module."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
import redis.asyncio as aioredis
from conftest import FIXED_MS, Cluster, Sentinel, Server, wait_until

import redis_ratelimit_client as rr
from redis_ratelimit_client import (
    AsyncClient,
    Client,
    Decision,
    FixedWindow,
    InvalidArgument,
    ModuleMissing,
    Policy,
    PolicyMode,
    Sliding,
    TokenBucket,
    WrongType,
)
from redis_ratelimit_client.request import Request


@pytest.fixture
def c(r: redis.Redis) -> Client:
    return Client(r)


def test_every_limiter_command_answers_a_decision(c: Client) -> None:
    assert c.module_version is not None and c.module_version >= 1
    assert c.token_bucket("tb", 5, 1, 1000) == Decision(True, 5, 4, 0, 1000)
    d = c.leaky_bucket("lb", 3, 1, 100)
    assert (d.allowed, d.limit, d.remaining) == (True, 3, 2)
    assert c.sliding("sl", 2, 1000).remaining == 1
    assert c.hash_window("hw", 10, 1000, 100).remaining == 9
    assert c.fixed_window("fw", 1, FIXED_MS).remaining == 0
    denied = c.fixed_window("fw", 1, FIXED_MS)
    assert not denied.allowed and denied.wait_ms > 0
    assert denied.retry_after == pytest.approx(denied.wait_ms / 1000)
    assert denied.reset_after == pytest.approx(denied.reset_ms / 1000)
    assert denied.retry_after_s == -(-denied.wait_ms // 1000)


def test_a_cost_above_the_limit_can_never_pass(c: Client) -> None:
    d = c.sliding("big", 3, 1000, Request.cost(4))
    assert not d.allowed and d.never and d.wait_ms == -1
    assert d.retry_after == 0.0 and d.retry_after_s is None


def test_cost_force_and_refund(c: Client, r: redis.Redis) -> None:
    assert c.sliding("k", 5, 10_000, Request.cost(5)).remaining == 0
    forced = c.sliding("k", 5, 10_000, Request.force(1))
    assert forced.allowed
    assert c.sliding("k", 5, 10_000, Request.refund(3)).remaining == 2
    peek = c.sliding("k", 5, 10_000, Request.cost(0))
    assert peek.allowed and peek.remaining == 2


def test_policies_and_hit(c: Client) -> None:
    c.policy_set("POST:/api/login", Sliding(2, 60_000), PolicyMode.ENFORCE, 100)
    assert c.policy_list() == ["POST:/api/login"]
    p = c.policy_get("POST:/api/login")
    assert p is not None and p["algorithm"] == "SLIDING" and p["params"] == [2, 60_000]
    assert c.hit("POST:/api/login", "login:alice").allowed
    assert c.limit("login:alice", Policy("POST:/api/login")).allowed
    assert not c.hit("POST:/api/login", "login:alice").allowed
    c.policy_set("POST:/api/login", Sliding(2, 60_000), PolicyMode.OFF)
    assert c.hit("POST:/api/login", "login:alice").allowed
    assert c.policy_del("POST:/api/login") and not c.policy_del("POST:/api/login")
    assert c.policy_get("POST:/api/login") is None


def test_all_is_all_or_nothing_and_says_which_denied(c: Client, r: redis.Redis) -> None:
    rules = [("{o}:user", TokenBucket(5, 5, 1000)), ("{o}:all", FixedWindow(1, FIXED_MS))]
    assert c.all(rules).allowed
    d = c.all(rules)
    assert not d.allowed and d.denied_by == 1
    assert c.token_bucket("{o}:user", 5, 5, 1000, Request.cost(0)).remaining == 4


def test_the_deny_log(c: Client) -> None:
    c.log_reset()
    c.fixed_window("fw", 1, FIXED_MS)
    c.fixed_window("fw", 1, FIXED_MS)
    assert c.log_len() == 1
    [e] = c.log_get(5)
    assert (e.key, e.source, e.cost) == ("fw", "RL.FIXEDWINDOW", 1) and e.wait_ms > 0


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.sliding("k", 0, 1000),
        lambda c: c.sliding("k", True, 1000),
        lambda c: c.sliding("k", "5", 1000),
        lambda c: c.sliding("k", 5, 1000, Request.cost(-1)),
        lambda c: c.sliding("k", 5, 1000, Request.cost(1.5)),
        lambda c: c.sliding("k", 1 << 41, 1000),
        lambda c: c.sliding("", 5, 1000),
        lambda c: c.sliding(None, 5, 1000),
        lambda c: c.sliding("k", 5, 1000, Request.refund(-2)),
        lambda c: c.sliding("k", 5, 1000, "2"),
        lambda c: c.hash_window("k", 5, 1000, 300),
        lambda c: c.hit("bad name", "k"),
        lambda c: c.policy_set("p", Sliding(5, 1000), rollout=101),
        lambda c: c.all([]),
        lambda c: c.all([("k", Sliding(1, 1)), ("k", Sliding(1, 1))]),
    ],
)
def test_bad_input_raises_before_anything_is_written(c: Client, r: redis.Redis, call) -> None:
    with pytest.raises(InvalidArgument):
        call(c)
    assert r.dbsize() == 0 and r.execute_command("RL.POLICY", "LIST") == []


def test_wrongtype_names_the_key_and_leaves_it_untouched(c: Client, r: redis.Redis) -> None:
    r.set("str", "v")
    with pytest.raises(WrongType, match="'str'"):
        c.sliding("str", 5, 1000)
    c.token_bucket("tb", 5, 1, 1000)
    with pytest.raises(WrongType):
        c.sliding("tb", 5, 1000)
    assert r.get("str") == b"v"
    assert c.token_bucket("tb", 5, 1, 1000, Request.cost(0)).remaining == 4


def test_a_server_error_is_a_server_error(c: Client) -> None:
    with pytest.raises(rr.ServerError, match="sliding-max-limit"):
        c.sliding("k", 200_000, 1000)


def test_module_missing_names_the_server(plain_server: Server) -> None:
    with pytest.raises(ModuleMissing, match=f"127.0.0.1:{plain_server.port}"):
        Client(plain_server.client())
    assert plain_server.client().dbsize() == 0

    async def go() -> None:
        with pytest.raises(ModuleMissing, match=f":{plain_server.port}"):
            await AsyncClient.create(aioredis.Redis(port=plain_server.port))

    asyncio.run(go())


def test_a_timed_out_write_is_not_sent_again(server: Server, r: redis.Redis) -> None:
    """redis-py's own client retries 3 times by default; the kit sends once."""
    client = Client(redis.Redis(port=server.port, socket_timeout=0.2))
    sleeper = threading.Thread(
        target=lambda: server.client().execute_command("DEBUG", "SLEEP", "0.6")
    )
    sleeper.start()
    time.sleep(0.05)
    with pytest.raises(redis.TimeoutError):
        client.sliding("once", 10, 60_000)
    sleeper.join()
    assert client.sliding("once", 10, 60_000, Request.cost(0)).remaining == 9


def test_asyncio_form(server: Server, r: redis.Redis) -> None:
    async def go() -> None:
        a = await AsyncClient.create(aioredis.Redis(port=server.port))
        assert (await a.sliding("as", 2, 1000)).remaining == 1
        assert (await a.token_bucket("at", 2, 1, 1000)).allowed
        assert (await a.leaky_bucket("al", 2, 1, 1000)).allowed
        assert (await a.hash_window("ah", 2, 1000, 100)).allowed
        assert (await a.fixed_window("af", 1, FIXED_MS)).allowed
        assert not (await a.fixed_window("af", 1, FIXED_MS)).allowed
        await a.policy_set("p", FixedWindow(1, FIXED_MS))
        assert await a.policy_list() == ["p"]
        assert (await a.hit("p", "ak")).allowed
        assert (await a.all([("{x}a", Sliding(5, 1000)), ("{x}b", Policy("p"))])).allowed
        d = await a.all([("{x}a", Sliding(5, 1000)), ("{x}b", Policy("p"))])
        assert not d.allowed and d.denied_by == 1
        assert await a.log_len() >= 1
        with pytest.raises(InvalidArgument):
            await a.sliding("as", -1, 1000)
        await a.redis.aclose()

    asyncio.run(go())


def test_sentinel_managed_clients(sentinel: Sentinel) -> None:
    s = redis.sentinel.Sentinel([("127.0.0.1", sentinel.port)], socket_timeout=2)
    c = Client(s.master_for("rlmaster"))
    assert c.sliding("sen", 1, 60_000).allowed
    assert not c.sliding("sen", 1, 60_000).allowed

    async def go() -> None:
        from redis.asyncio.sentinel import Sentinel as AsyncSentinel

        a = await AsyncClient.create(
            AsyncSentinel([("127.0.0.1", sentinel.port)]).master_for("rlmaster")
        )
        assert not (await a.sliding("sen", 1, 60_000)).allowed

    asyncio.run(go())


def test_a_sentinel_failover_is_followed_with_the_state(sentinel_with_replica: Sentinel) -> None:
    sen = sentinel_with_replica
    s = redis.sentinel.Sentinel([("127.0.0.1", sen.port)], socket_timeout=2)
    c = Client(s.master_for("rlmaster", socket_timeout=2))
    assert c.sliding("fo", 3, 60_000, Request.cost(2)).remaining == 1
    assert sen.replica is not None
    replica = sen.replica.client()
    wait_until(
        lambda: replica.info("replication")["master_link_status"] == "up" and replica.exists("fo"),
        20,
        "the replica to sync",
    )
    sentinel_conn = redis.Redis(port=sen.port)
    wait_until(lambda: sentinel_conn.sentinel_slaves("rlmaster"), 20, "sentinel to see the replica")
    sentinel_conn.execute_command("SENTINEL", "FAILOVER", "rlmaster")
    wait_until(lambda: s.discover_master("rlmaster")[1] == sen.replica.port, 30, "the failover")

    def after() -> Decision:
        try:
            return c.sliding("fo", 3, 60_000)
        except (redis.ConnectionError, rr.ServerError):
            return None  # type: ignore[return-value]  # the old master: once, then rediscovered

    d = wait_until(after, 30, "a call on the new master")
    # What was consumed on the old master carried over: 2 + 1 of 3.
    assert d.allowed and d.remaining == 0
    assert not c.sliding("fo", 3, 60_000).allowed


def test_cluster_routes_every_call_to_the_owner_without_moved(cluster: Cluster) -> None:
    from redis.cluster import ClusterNode, RedisCluster

    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.nodes[0].port)])
    c = Client(rc)
    before = cluster.moved_errors()
    c.policy_set("login", Sliding(3, 60_000))
    keys = [f"user:{i}" for i in range(30)]
    for k in keys:
        assert c.sliding(k, 1, 60_000).allowed
        # RL.HIT's name would route elsewhere: the key (argv[2]) decides.
        assert c.hit("login", f"login:{k}").allowed
        assert c.all(
            [(f"{{{k}}}:a", Sliding(1, 60_000)), (f"{{{k}}}:b", TokenBucket(1, 1, 1000))]
        ).allowed
    assert all(not c.sliding(k, 1, 60_000).allowed for k in keys)
    assert cluster.moved_errors() == before
    assert c.policy_list() == ["login"]
    assert c.policy_del("login")

    async def go() -> None:
        from redis.asyncio.cluster import ClusterNode as ANode
        from redis.asyncio.cluster import RedisCluster as ARC

        arc = ARC(startup_nodes=[ANode("127.0.0.1", cluster.nodes[1].port)])
        a = await AsyncClient.create(arc)
        for k in keys:
            assert not (await a.sliding(k, 1, 60_000)).allowed
            assert (await a.fixed_window(f"af:{k}", 1, FIXED_MS)).allowed
        await a.policy_set("p2", FixedWindow(1, FIXED_MS))
        assert (await a.hit("p2", "hk1")).allowed and not (await a.hit("p2", "hk1")).allowed
        await arc.aclose()

    asyncio.run(go())
    assert cluster.moved_errors() == before
