"""The protection loop's kit side: the counts, the stage hold, the breaker,
the STATS parser, and `Protection`/`AsyncProtection` against two real
standalone masters (the highest stage and the lowest scale win; every
master gets every report; a lost report is lost, never sent again)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis
from conftest import Cluster, Server, wait_until

from redis_ratelimit_client import (
    AsyncProtection,
    BreakerOpen,
    BreakerState,
    CircuitBreaker,
    Limiter,
    Policy,
    PolicyStats,
    Protection,
    Rule,
    TokenBucket,
)
from redis_ratelimit_client.errors import InvalidArgument, ProtocolError
from redis_ratelimit_client.protection import STATS_FIELDS, WINDOW_FIELDS


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stats_reply(scale: int = 100, stage: int = 0) -> list[object]:
    window = [x for name in WINDOW_FIELDS for x in (name.encode(), 0)]
    values: dict[str, object] = {
        "scale": scale,
        "stage": stage,
        "window_ms": 1000,
        "window_end_ms": 2000,
        "current": list(window),
        "last": list(window),
        "adapting": 1,
    }
    return [x for name in STATS_FIELDS for x in (name.encode(), values[name])]


def stats(scale: int = 100, stage: int = 0) -> PolicyStats:
    return PolicyStats.from_reply(stats_reply(scale, stage))


# -- the STATS parser ----------------------------------------------------------


def test_stats_are_parsed_field_by_field() -> None:
    reply = stats_reply(80, 2)
    reply[9][1] = 7  # type: ignore[index]  # current calls
    s = PolicyStats.from_reply(reply)
    assert (s.scale, s.stage, s.window_ms, s.window_end_ms, s.adapting) == (80, 2, 1000, 2000, True)
    assert s.current.calls == 7 and s.last.calls == 0


@pytest.mark.parametrize(
    "broken",
    [
        lambda r: r[:-2],  # a field fewer
        lambda r: [*r, b"more", 1],  # a field more
        lambda r: [b"stage", r[3], b"scale", r[1], *r[4:]],  # out of order
    ],
)
def test_stats_of_another_shape_are_refused(broken: object) -> None:
    with pytest.raises(ProtocolError):
        PolicyStats.from_reply(broken(stats_reply()))  # type: ignore[operator]


def test_a_window_of_another_shape_is_refused() -> None:
    reply = stats_reply()
    reply[9] = reply[9][:-2]  # type: ignore[index]
    with pytest.raises(ProtocolError):
        PolicyStats.from_reply(reply)


# -- the counts -------------------------------------------------------------


def test_outcomes_are_counted_in_memory_and_taken_once() -> None:
    p = Protection([], ["api"])
    for i in range(10):
        p.record("api", error=i % 5 == 0)
    p.record_ok("other")
    p.record_error("other")
    assert p.pending() == {"api": (8, 2, 0), "other": (1, 1, 0)}
    assert sorted(p._take()) == [("api", 8, 2, 0), ("other", 1, 1, 0)]
    assert p.pending() == {} and p._take() == []


def test_counts_from_many_threads_add_up() -> None:
    p = Protection([], ["api"])

    def work() -> None:
        for i in range(5000):
            p.record("api", i % 10 == 0)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert p.pending() == {"api": (18000, 2000, 0)}


def test_the_options_are_checked() -> None:
    with pytest.raises(InvalidArgument) as e:
        Protection([], ["api"], report_interval=0)
    assert e.value.param == "report_interval"
    with pytest.raises(InvalidArgument) as e:
        Protection([], ["api"], breakers={"other": CircuitBreaker("b")})
    assert e.value.param == "breakers"
    with pytest.raises(InvalidArgument):
        Protection([], "api")


# -- the stage: the highest wins, held for stage_hold -------------------------


def test_the_highest_stage_and_the_lowest_scale_win() -> None:
    p = Protection([], ["api"])
    p._read("api", "a:1", stats(scale=80, stage=0))
    p._read("api", "b:2", stats(scale=64, stage=2))
    p._read("api", "c:3", stats(scale=100, stage=1))
    p._settle(["a:1", "b:2", "c:3"])
    assert p.stage("api") == 2 and p.scale("api") == 64
    assert p.stage("other") == 0 and p.scale("other") == 100


def test_with_no_read_for_stage_hold_the_stage_falls_to_0_and_the_breaker_closes() -> None:
    clock = Clock()
    breaker = CircuitBreaker("downstream")
    p = Protection([], ["api"], stage_hold=5.0, breakers={"api": breaker}, clock=clock)
    p._read("api", "a:1", stats(scale=80, stage=2))
    p._settle(["a:1"])
    assert p.stage("api") == 2 and breaker.state is BreakerState.FORCED_OPEN
    clock.now += 5.0
    p._apply_breaker("api")
    assert p.stage("api") == 2 and breaker.state is BreakerState.FORCED_OPEN
    clock.now += 0.1
    p._apply_breaker("api")
    assert p.stage("api") == 0 and breaker.state is BreakerState.CLOSED
    # The scale is the last read: the local level stays where the server was.
    assert p.scale("api") == 80
    assert p.state() == {"api": {"stage": 0, "scale": 80, "breaker": "closed"}}


def test_the_breaker_opens_at_stage_2_only_and_closes_below() -> None:
    breaker = CircuitBreaker("downstream")
    p = Protection([], ["api"], breakers={"api": breaker})
    for stage, state in [
        (1, BreakerState.CLOSED),
        (2, BreakerState.FORCED_OPEN),
        (2, BreakerState.FORCED_OPEN),
        (1, BreakerState.CLOSED),
        (0, BreakerState.CLOSED),
    ]:
        p._read("api", "a:1", stats(stage=stage))
        p._settle(["a:1"])
        assert breaker.state is state, stage


# -- the breaker ------------------------------------------------------------


def test_the_breaker_opens_after_failures_in_a_row_and_lets_one_trial_through() -> None:
    clock = Clock()
    b = CircuitBreaker("db", failures=2, open_for=1.0, clock=clock)

    def boom() -> None:
        raise ConnectionError("down")

    for _ in range(2):
        with pytest.raises(ConnectionError):
            b.call(boom)
    assert b.state is BreakerState.OPEN
    with pytest.raises(BreakerOpen):
        b.call(lambda: 1)
    clock.now += 1.0
    assert b.allow() and not b.allow()  # one trial; the others wait for it
    b.record_success()
    assert b.state is BreakerState.CLOSED and b.call(lambda: 7) == 7
    assert b.refused == 2


def test_a_forced_open_breaker_refuses_until_released() -> None:
    b = CircuitBreaker("db")
    b.force_open()
    assert b.state is BreakerState.FORCED_OPEN and not b.allow()
    b.record_success()
    assert b.state is BreakerState.FORCED_OPEN

    async def fetch() -> int:
        return 3

    with pytest.raises(BreakerOpen) as e:
        asyncio.run(b.call_async(fetch))
    assert e.value.state is BreakerState.FORCED_OPEN and "forced open" in str(e.value)
    b.release()
    assert asyncio.run(b.call_async(fetch)) == 3


# -- two real masters ---------------------------------------------------------


@pytest.fixture
def masters() -> Iterator[tuple[Server, Server]]:
    a, b = Server(), Server()
    yield a, b
    a.stop()
    b.stop()


def policy(r: redis.Redis, spec: str) -> None:
    r.execute_command("RL.POLICY", "SET", "api", *spec.split())


def test_the_highest_stage_of_two_masters_wins_and_the_lowest_scale(
    masters: tuple[Server, Server],
) -> None:
    a, b = (m.client() for m in masters)
    policy(a, "TOKENBUCKET 2 1 60000 STAGES 30 50 WINDOW 1000")
    policy(b, "TOKENBUCKET 2 1 60000 STAGES 30 50 WINDOW 1000")
    b.execute_command("RL.POLICY", "SCALE", "api", 40)
    breaker = CircuitBreaker("downstream")
    p = Protection([a, b], ["api"], breakers={"api": breaker})

    def flooded() -> bool:
        for _ in range(10):
            a.execute_command("RL.HIT", "api", "flooder")
        p.poll()
        return p.stage("api") == 2

    wait_until(flooded, 5, "stage 2 on master a")
    assert p.scale("api") == 40 and breaker.state is BreakerState.FORCED_OPEN
    assert p.stats.polls_failed == 0

    async def read_async() -> tuple[int, int]:
        ca, cb = (aioredis.Redis(port=m.port) for m in masters)
        ap = AsyncProtection([ca, cb], ["api"])
        await ap.poll()
        await ca.aclose()
        await cb.aclose()
        return ap.stage("api"), ap.scale("api")

    assert asyncio.run(read_async()) == (2, 40)


def window_counts(r: redis.Redis) -> tuple[int, int]:
    """ok and errors of the current and the last window together."""
    s = PolicyStats.from_reply(r.execute_command("RL.POLICY", "STATS", "api"))
    return s.current.ok + s.last.ok, s.current.errors + s.last.errors


def test_every_master_gets_every_report_then_the_counts_are_forgotten(
    masters: tuple[Server, Server],
) -> None:
    a, b = (m.client() for m in masters)
    for r in (a, b):
        policy(r, "TOKENBUCKET 100 100 1000 STAGES 30 50 WINDOW 86400000")
    p = Protection([a, b], ["api"])
    for i in range(10):
        p.record("api", error=i == 0)
    p.report()
    assert window_counts(a) == window_counts(b) == (9, 1)
    assert p.stats.reports_sent == 2 and p.pending() == {}
    p.report()  # nothing to send: nothing sent
    assert p.stats.reports_sent == 2 and window_counts(a) == (9, 1)


def test_a_lost_report_is_lost_never_sent_again(masters: tuple[Server, Server]) -> None:
    a_server, b_server = masters
    a, b = a_server.client(), b_server.client()
    for r in (a, b):
        policy(r, "TOKENBUCKET 100 100 1000 STAGES 30 50 WINDOW 86400000")
    p = Protection(
        [
            redis.Redis(port=a_server.port, socket_timeout=0.5),
            redis.Redis(port=b_server.port, socket_timeout=0.5),
        ],
        ["api"],
    )
    b_server.kill()
    for _ in range(5):
        p.record_ok("api")
    p.report()  # a gets it; b's share is lost
    assert window_counts(a) == (5, 0)
    assert (p.stats.reports_sent, p.stats.reports_failed, p.stats.lost_ok) == (1, 1, 5)
    assert p.pending() == {}
    b_server.start()
    b = b_server.client()
    policy(b, "TOKENBUCKET 100 100 1000 STAGES 30 50 WINDOW 86400000")
    p.record_error("api")
    p.report()
    assert window_counts(b) == (0, 1)  # the lost 5 were not sent again
    assert window_counts(a) == (5, 1)


def test_the_background_thread_reports_polls_and_sends_the_last_counts_at_close(
    server: Server, r: redis.Redis
) -> None:
    policy(r, "TOKENBUCKET 100 100 1000 STAGES 30 50 WINDOW 86400000")
    r.execute_command("RL.POLICY", "SCALE", "api", 70)
    with Protection(server.client(), ["api"], report_interval=0.05, stage_poll=0.05) as p:
        wait_until(lambda: p.scale("api") == 70, 5, "the scale read")
        p.record_ok("api")
        wait_until(lambda: window_counts(r) == (1, 0), 5, "the report")
        p.report_interval = 3600  # the next report would come at close
        p.record_ok("api")
    assert not p.running
    assert window_counts(r) == (2, 0)


def test_the_async_task_reports_and_polls(server: Server, r: redis.Redis) -> None:
    policy(r, "TOKENBUCKET 100 100 1000 STAGES 30 50 WINDOW 86400000")
    r.execute_command("RL.POLICY", "SCALE", "api", 60)

    async def run() -> None:
        client = aioredis.Redis(port=server.port)
        async with AsyncProtection(client, ["api"], report_interval=0.05, stage_poll=0.05) as p:
            for _ in range(200):
                if p.scale("api") == 60:
                    break
                await asyncio.sleep(0.02)
            assert p.scale("api") == 60
            p.record_error("api")
        assert not p.running
        await client.aclose()

    asyncio.run(run())
    assert window_counts(r) == (0, 1)


def test_a_global_policy_rules_local_level_runs_at_the_scale_read(
    server: Server, r: redis.Redis
) -> None:
    policy(r, "TOKENBUCKET 100 10 1000")
    limiter = Limiter(server.client(), [Rule(Policy("api"), "api", global_=True)], instances=2)
    limiter.startup()
    assert limiter._algorithms == [TokenBucket(100, 10, 1000)]
    p = Protection(server.client(), ["api"])
    p.attach(limiter)
    r.execute_command("RL.POLICY", "SCALE", "api", 50)
    p.poll()
    assert limiter._algorithms == [TokenBucket(50, 5, 1000)]
    # The share of 2 instances: ceil(50 / 2 * 1.1) = 28 admitted locally at most.
    admitted = sum(limiter.check("alice").allowed for _ in range(40))
    assert admitted == 28
    r.execute_command("RL.POLICY", "SCALE", "api", 100)
    p.poll()
    assert limiter._algorithms == [TokenBucket(100, 10, 1000)]


def test_the_typed_calls_set_a_policys_loop_scale_it_and_read_it(
    server: Server, r: redis.Redis
) -> None:
    from redis_ratelimit_client import Adapt, AsyncClient, Client, Stages

    c = Client(server.client())
    c.policy_set(
        "api",
        TokenBucket(10, 1, 1000),
        adapt=Adapt(5, mincalls=20),
        stages=Stages(30, 50),
        window_ms=1000,
    )
    got = c.policy_get("api")
    assert got is not None
    assert (got["adapt"], got["stages"], got["window_ms"]) == ([5, 80, 50, 5, 20], [30, 50], 1000)
    c.policy_scale("api", 40)
    [s] = c.outcome("api", 3, 1)
    assert s.scale == 40 and s.adapting and s.current.ok + s.last.ok == 3
    c.policy_set("api", TokenBucket(10, 1, 1000), adapt="OFF")
    assert c.policy_get("api")["scale"] == 40  # type: ignore[index]

    async def run() -> list[PolicyStats]:
        ac = await AsyncClient.create(aioredis.Redis(port=server.port))
        await ac.policy_set("api", TokenBucket(10, 1, 1000), stages=Stages(10, 20))
        await ac.policy_scale("api", 70)
        out = await ac.policy_stats("api")
        await ac.redis.aclose()
        return out

    [s] = asyncio.run(run())
    assert s.scale == 70 and not s.adapting and s.window_ms == 10_000


def test_a_cluster_client_reports_to_and_reads_every_master(cluster: Cluster) -> None:
    from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import ClusterNode, RedisCluster

    from redis_ratelimit_client import Client, Stages

    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.nodes[0].port)])
    c = Client(rc)
    c.policy_set("api", TokenBucket(2, 1, 60000), stages=Stages(30, 50), window_ms=86_400_000)
    nodes = [n.client() for n in cluster.nodes]
    # One master's own traffic puts it at stage 2 ...
    nodes[1].execute_command(
        "RL.POLICY", "SET", "api", *"TOKENBUCKET 2 1 60000 STAGES 30 50 WINDOW 1000".split()
    )
    for _ in range(10):
        nodes[1].execute_command("RL.HIT", "api", "flooder")
    p = Protection(c, ["api"])
    wait_until(lambda: p.poll() or p.stage("api") == 2, 5, "stage 2 from one master of three")
    assert p.stats.polls_failed == 0 and p.stats.polls >= 3
    nodes[2].execute_command("RL.POLICY", "SCALE", "api", 30)
    p.record_ok("api")
    p.record_error("api")
    p.report()
    assert p.stats.reports_sent == 3
    for n in (nodes[0], nodes[2]):
        assert window_counts(n) == (1, 1)
    assert p.scale("api") == 30  # RL.OUTCOME's reply is a read too

    async def read_async() -> tuple[int, int, int]:
        arc = AsyncRedisCluster(
            startup_nodes=[AsyncClusterNode("127.0.0.1", cluster.nodes[0].port)]
        )
        ap = AsyncProtection(arc, ["api"])
        await ap.poll()
        await arc.aclose()
        return ap.stage("api"), ap.scale("api"), ap.stats.polls

    assert asyncio.run(read_async()) == (2, 30, 3)
    for n in nodes:
        n.execute_command("RL.POLICY", "DEL", "api")


# -- DENIED: the denials a limiter answered without the server -----------------


def test_outcome_args_add_denied_only_when_there_are_some() -> None:
    from redis_ratelimit_client.protection import outcome_args

    assert outcome_args("api", 1, 2) == ["RL.OUTCOME", "api", 1, 2]
    assert outcome_args("api", 1, 2, 0) == ["RL.OUTCOME", "api", 1, 2]
    assert outcome_args("api", 0, 0, 7) == ["RL.OUTCOME", "api", 0, 0, "DENIED", 7]
    for bad in (-1, 1099511627777, True, 1.5):
        with pytest.raises(InvalidArgument) as e:
            outcome_args("api", 0, 0, bad)  # type: ignore[arg-type]
        assert e.value.param == "DENIED"


def test_local_denials_are_counted_beside_the_outcomes_and_taken_once() -> None:
    p = Protection([], ["api"])
    p.record_ok("api")
    p.record_denied("api")
    p.record_denied("api", 4)
    p.record_denied("other")
    assert p.pending() == {"api": (1, 0, 5), "other": (0, 0, 1)}
    assert sorted(p._take()) == [("api", 1, 0, 5), ("other", 0, 0, 1)]
    assert p.pending() == {} and p._take() == []


def server_window(r: redis.Redis) -> tuple[int, int]:
    """calls and denied of the current and the last window together."""
    s = PolicyStats.from_reply(r.execute_command("RL.POLICY", "STATS", "api"))
    return s.current.calls + s.last.calls, s.current.denied + s.last.denied


def test_a_limiters_deny_cache_hits_on_a_policy_rule_are_reported_as_denied(
    server: Server, r: redis.Redis
) -> None:
    from redis_ratelimit_client import Sliding

    policy(r, "TOKENBUCKET 2 1 60000 STAGES 30 50 WINDOW 86400000")
    # The policy and an inline rule go in one RL.ALL: its denial is cached for both.
    limiter = Limiter(
        server.client(),
        [Rule(Policy("api"), "api"), Rule(Sliding(1000, 1000), "inline", key_prefix="i:")],
    )
    p = Protection(server.client(), ["api"])
    p.attach(limiter)
    paths = [limiter.check("alice").path for _ in range(10)]
    assert paths == ["redis"] * 3 + ["deny_cache"] * 7
    assert p.pending() == {"api": (0, 0, 7)}
    assert server_window(r) == (3, 1)
    p.report()
    assert server_window(r) == (10, 8) and p.pending() == {}
    assert p.stats.denied_sent == 7
    # A report without local denials is the plain form.
    p.record_ok("api")
    p.report()
    assert server_window(r) == (10, 8) and window_counts(r) == (1, 0)


def test_an_inline_rules_denials_are_not_a_policys(server: Server, r: redis.Redis) -> None:
    from redis_ratelimit_client import Sliding

    policy(r, "TOKENBUCKET 1000 1000 1000 STAGES 30 50 WINDOW 86400000")
    limiter = Limiter(
        server.client(),
        [Rule(Policy("api"), "api"), Rule(Sliding(1, 60000), "inline", key_prefix="i:")],
    )
    p = Protection(server.client(), ["api"])
    p.attach(limiter)
    paths = [limiter.check("alice").path for _ in range(5)]
    assert paths == ["redis"] * 2 + ["deny_cache"] * 3
    assert p.pending() == {}


def test_a_global_policy_rules_local_denials_are_reported_as_denied(
    server: Server, r: redis.Redis
) -> None:
    policy(r, "TOKENBUCKET 10 1 60000 STAGES 30 50 WINDOW 86400000")
    limiter = Limiter(server.client(), [Rule(Policy("api"), "api", global_=True)], instances=2)
    p = Protection(server.client(), ["api"])
    p.attach(limiter)
    # The share of 2 instances: ceil(10 / 2 * 1.1) = 6, then the local level denies.
    paths = [limiter.check("alice").path for _ in range(9)]
    assert paths == ["redis"] * 6 + ["local"] * 3
    assert p.pending() == {"api": (0, 0, 3)}
    p.report()
    assert server_window(r) == (9, 3)


def test_the_async_limiter_reports_its_deny_cache_hits(server: Server, r: redis.Redis) -> None:
    from redis_ratelimit_client import AsyncLimiter

    policy(r, "TOKENBUCKET 1 1 60000 STAGES 30 50 WINDOW 86400000")

    async def run() -> list[str]:
        client = aioredis.Redis(port=server.port)
        limiter = AsyncLimiter(client, [Rule(Policy("api"), "api")])
        p = AsyncProtection(client, ["api"])
        p.attach(limiter)
        paths = [(await limiter.check("bob")).path for _ in range(6)]
        assert p.pending() == {"api": (0, 0, 4)}
        await p.report()
        await client.aclose()
        return paths

    assert asyncio.run(run()) == ["redis"] * 2 + ["deny_cache"] * 4
    assert server_window(r) == (6, 5)


def test_a_lost_report_loses_its_denied_counts_too(masters: tuple[Server, Server]) -> None:
    a_server, b_server = masters
    a = a_server.client()
    policy(a, "TOKENBUCKET 100 100 1000 STAGES 30 50 WINDOW 86400000")
    p = Protection(redis.Redis(port=b_server.port, socket_timeout=0.5), ["api"])
    b_server.kill()
    p.record_denied("api", 5)
    p.record_ok("api")
    p.report()
    assert (p.stats.reports_failed, p.stats.lost_ok, p.stats.lost_denied) == (1, 1, 5)
    assert p.pending() == {} and p.stats.denied_sent == 0
    b_server.start()
    b = b_server.client()
    policy(b, "TOKENBUCKET 100 100 1000 STAGES 30 50 WINDOW 86400000")
    p.record_denied("api")
    p.report()
    assert server_window(b) == (1, 1)  # the lost 5 were not sent again


# -- review: defects of the loop ---------------------------------------------------


def test_closing_the_loop_releases_the_breakers_it_forced_open() -> None:
    breaker = CircuitBreaker("downstream")
    p = Protection([], ["api"], breakers={"api": breaker})
    p._read("api", "a:1", stats(stage=2))
    p._settle(["a:1"])
    assert breaker.state is BreakerState.FORCED_OPEN
    p.close()  # nothing keeps it up to date any more: forced open for good otherwise
    assert breaker.state is BreakerState.CLOSED

    async def run() -> BreakerState:
        b = CircuitBreaker("downstream")
        ap = AsyncProtection([], ["api"], breakers={"api": b})
        ap._read("api", "a:1", stats(stage=2))
        ap._settle(["a:1"])
        assert b.state is BreakerState.FORCED_OPEN
        await ap.aclose()
        return b.state

    assert asyncio.run(run()) is BreakerState.CLOSED


def test_a_cancelled_trial_call_gives_its_trial_back() -> None:
    clock = Clock()
    b = CircuitBreaker("db", failures=1, open_for=1.0, clock=clock)
    with pytest.raises(ConnectionError):
        b.call(lambda: (_ for _ in ()).throw(ConnectionError("down")))
    clock.now += 1.0

    async def run() -> None:
        started = asyncio.Event()

        async def slow() -> int:
            started.set()
            await asyncio.sleep(10)
            return 1

        task = asyncio.ensure_future(b.call_async(slow))
        await started.wait()
        task.cancel()  # the request went away, or a timeout cut it short
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    # Neither a success nor a failure: the next call is the trial (it waited for ever).
    assert b.state is BreakerState.OPEN
    assert b.call(lambda: 5) == 5 and b.state is BreakerState.CLOSED


def test_stage_hold_must_outlive_the_time_between_two_polls() -> None:
    # A hold of 0 (or shorter than the poll) dropped every stage read before use.
    for hold, poll in ((0, 1.0), (0.5, 1.0), (1.0, 1.0)):
        with pytest.raises(InvalidArgument) as e:
            Protection([], ["api"], stage_hold=hold, stage_poll=poll)
        assert e.value.param == "stage_hold"
    Protection([], ["api"], stage_hold=1.5, stage_poll=1.0)


def test_a_hung_server_does_not_keep_the_breaker_forced_open_nor_close_waiting(
    own_server: Server,
) -> None:
    import os
    import signal

    r = own_server.client()
    policy(r, "TOKENBUCKET 2 1 60000 STAGES 30 50 WINDOW 1000")
    breaker = CircuitBreaker("downstream")
    # A redis-py client without a socket timeout (redis-py < 8's default).
    p = Protection(
        redis.Redis(port=own_server.port, socket_timeout=None),
        ["api"],
        stage_poll=0.1,
        stage_hold=1.0,
        report_interval=0.1,
        breakers={"api": breaker},
    )

    def flooded() -> bool:
        for _ in range(10):
            r.execute_command("RL.HIT", "api", "flooder")
        p.poll()
        return p.stage("api") == 2

    wait_until(flooded, 5, "stage 2")
    p.start()
    assert own_server.proc is not None
    os.kill(own_server.proc.pid, signal.SIGSTOP)  # connections stay open, nothing answers
    try:
        p.record_ok("api")
        wait_until(lambda: breaker.state is BreakerState.CLOSED, 3, "the breaker released")
        closing = threading.Thread(target=p.close, daemon=True)
        closing.start()
        closing.join(5)
        assert not closing.is_alive() and not p.running
    finally:
        os.kill(own_server.proc.pid, signal.SIGCONT)
