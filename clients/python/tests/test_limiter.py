"""The Limiter and AsyncLimiter without any web framework, against a real
redis-server; Redis fails for real (the process stopped with SIGSTOP)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from conftest import FIXED_MS, Server, wait_until

from redis_ratelimit_client import FixedWindow, InvalidArgument, Request, Sliding
from redis_ratelimit_client.limiter import AsyncLimiter, FallbackMode, Limiter
from redis_ratelimit_client.spec import Concurrency, Policy, Rule


@contextmanager
def stopped(s: Server) -> Iterator[None]:
    """The server's process stopped (SIGSTOP): connections stay open, nothing answers."""
    assert s.proc is not None
    os.kill(s.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(s.proc.pid, signal.SIGCONT)


def quick(s: Server) -> redis.Redis:
    """A client whose calls give up after 0.3 s (a sync limiter's deadline)."""
    return redis.Redis(host="127.0.0.1", port=s.port, socket_timeout=0.3)


#: One rule, for the settings' checks.
ONE_RULE = [Rule(Sliding(1, 1000), "a")]


def remaining(r: redis.Redis, key: str, limit: int, window_ms: int) -> int:
    return int(r.execute_command("RL.SLIDING", key, limit, window_ms, "COST", 0)[2])


def test_redis_decides_and_the_deny_cache_remembers(server: Server, r: redis.Redis) -> None:
    lim = Limiter(server.client(), [Rule(FixedWindow(2, FIXED_MS), "fw")])
    assert [lim.check("a").path for _ in range(2)] == ["redis", "redis"]
    denied = lim.check("a")
    assert not denied.allowed and denied.path == "redis" and denied.decision.wait_ms > 0
    calls = lim.stats.redis_calls
    again = lim.check("a")
    assert not again.allowed and again.path == "deny_cache" and lim.stats.redis_calls == calls
    assert lim.check("b", Request.cost(2)).decision.remaining == 0
    assert lim.stats.redis_admitted == 3 and lim.stats.redis_denied == 1


def test_a_global_rule_admits_from_its_local_share_first(server: Server, r: redis.Redis) -> None:
    # Two instances share 10: each admits ceil(10 * 1.1 / 2) = 6 locally.
    rule = Rule(Sliding(10, 60_000), "g", fixed_key="g", global_=True)
    lim = Limiter(server.client(), [rule], instances=2)
    assert all(lim.check("x").path == "redis" for _ in range(6))
    local = lim.check("x")
    assert not local.allowed and local.path == "local" and local.decision.limit == 10
    assert lim.stats.local_denied == 1 and lim.stats.redis_calls == 6
    assert remaining(r, "g", 10, 60_000) == 4  # the denied one never reached Redis


def test_a_global_rule_gives_its_local_units_back_when_redis_denies(
    server: Server, r: redis.Redis
) -> None:
    r.execute_command("RL.SLIDING", "g2", 3, 60_000, "COST", 3)  # another instance took all
    lim = Limiter(server.client(), [Rule(Sliding(3, 60_000), "g2", fixed_key="g2", global_=True)])
    d = lim.check("x")
    assert not d.allowed and d.path == "redis"
    assert lim.local.peek("g2", "g2", Sliding(3, 60_000), 3, Request.cost(3).core(), 0.0).allowed


@pytest.mark.parametrize(
    ("make", "param"),
    [
        (lambda c: Limiter(c, []), "rules"),
        (lambda c: Limiter(c, ONE_RULE * 2), "rules"),
        (lambda c: Limiter(c, ONE_RULE, instances=0), "instances"),
        (
            lambda c: Limiter(c, ONE_RULE, breaker_failures=0),
            "breaker_failures",
        ),
        (lambda c: AsyncLimiter(c, ONE_RULE, deadline=0), "deadline"),
        (lambda c: Rule(Concurrency(1, 1000), "c", global_=True), "global_"),
        (lambda c: Limiter(c, ONE_RULE).check("k", Request.force(1)), "COST"),
        (
            lambda c: Limiter(c, ONE_RULE).check("k", Request.refund(1)),
            "REFUND",
        ),
        (lambda c: Limiter(c, ONE_RULE).check(None), "identity"),  # type: ignore[arg-type]
    ],
)
def test_bad_settings_name_their_parameter(
    server: Server, r: redis.Redis, make, param: str
) -> None:
    with pytest.raises(InvalidArgument) as e:
        make(server.client())
    assert e.value.param == param
    assert r.dbsize() == 0


def test_local_only_fallback_and_breaker_then_the_owed_units_reach_redis(
    own_server: Server,
) -> None:
    r = own_server.client()
    client = quick(own_server)
    lim = Limiter(
        client, [Rule(Sliding(10, 60_000), "s")], breaker_failures=1, breaker_open_for=0.2
    )
    assert [lim.check("u").path for _ in range(2)] == ["redis", "redis"]
    with stopped(own_server):
        # Its answer is lost (the deadline passed): it may be counted; it
        # opens the breaker. Another key, so that "u" counts exactly.
        lost = lim.check("lost")
        assert lost.allowed and lost.path == "fallback" and lim.stats.redis_timeouts == 1
        assert lim.breaker_open and lim.stats.breaker_opened == 1
        during = [lim.check("u") for _ in range(3)]
        assert all(a.allowed and a.path == "fallback" for a in during)
        assert lim.owed[(0, "rl:s:u")] == 3
    # Once the breaker is due, the next decision probes (PING), finds Redis
    # again and calls it; the units owed go first.
    wait_until(lambda: time.monotonic() >= lim._open_until, 5, "the breaker to be due")
    back = lim.check("u")
    assert back.allowed and back.path == "redis"
    assert lim.stats.probes_ok == 1 and not lim.breaker_open
    assert lim.stats.owed_sent == 1 and not lim.owed
    assert remaining(r, "rl:s:u", 10, 60_000) == 10 - 6  # 2 + 3 owed + 1


def test_local_only_fallback_keeps_to_the_share(own_server: Server) -> None:
    client = quick(own_server)
    lim = Limiter(
        client,
        [Rule(Sliding(4, 60_000), "s")],
        instances=2,  # a share of ceil(4 * 1.1 / 2) = 3
        breaker_failures=1,
        breaker_open_for=60,
    )
    assert lim.check("w").path == "redis"
    with stopped(own_server):
        paths = [lim.check("z") for _ in range(5)]
    assert [a.allowed for a in paths] == [True, True, True, False, False]
    assert {a.path for a in paths} == {"fallback"}
    assert lim.stats.fallback_admitted == 3 and lim.stats.fallback_denied == 2
    assert lim.stats.breaker_skipped == 4  # only the first call waited for Redis


def test_fail_closed_denies_and_fail_open_admits_while_redis_is_stopped(
    own_server: Server,
) -> None:
    def limiter(mode: FallbackMode) -> Limiter:
        lim = Limiter(
            quick(own_server),
            [Rule(Sliding(2, 60_000), mode.value)],
            fallback=mode,
            breaker_failures=1,
            breaker_open_for=60,
        )
        assert lim.check("w").path == "redis"
        return lim

    closed, open_ = limiter(FallbackMode.FAIL_CLOSED), limiter(FallbackMode.FAIL_OPEN)
    with stopped(own_server):
        shut = [closed.check("z") for _ in range(3)]
        passed = [open_.check("z") for _ in range(3)]
    assert not any(a.allowed for a in shut) and shut[0].decision.wait_ms == 60_000
    assert all(a.allowed and a.path == "fallback" for a in passed)
    assert not open_.owed  # only the local-only fallback owes units


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    """Polls `cond` while the event loop runs (the probe is a task)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_the_async_limiter_falls_back_within_its_deadline_and_probes(own_server: Server) -> None:
    r = own_server.client()

    async def main() -> None:
        lim = AsyncLimiter(
            aioredis.Redis(port=own_server.port, socket_timeout=5),
            [Rule(Sliding(10, 60_000), "s")],
            deadline=0.3,
            breaker_failures=2,
            breaker_open_for=0.2,
            connections=2,
        )
        await lim.startup()
        assert (await lim.check("u")).path == "redis"
        with stopped(own_server):
            late = [await lim.check(k) for k in ("l1", "l2")]  # their answers are lost
            assert [a.path for a in late] == ["fallback", "fallback"]
            assert lim.stats.redis_timeouts == 2 and lim.breaker_open
            skipped = [await lim.check("u") for _ in range(2)]
            assert all(a.allowed and a.path == "fallback" for a in skipped)
        await until(lambda: time.monotonic() >= lim._open_until)
        probing = await lim.check("u")  # the fallback decides; a PING goes out
        assert probing.allowed and probing.path == "fallback" and lim._probe is not None
        await until(lambda: not lim.breaker_open)
        back = await lim.check("u")
        assert back.allowed and back.path == "redis"
        assert lim.stats.probes_ok == 1 and lim.stats.owed_sent == 1 and not lim.owed
        assert remaining(r, "rl:s:u", 10, 60_000) == 10 - 5  # 1 + 3 owed + 1
        await lim.client.redis.aclose()

    asyncio.run(main())


def test_a_concurrency_rule_holds_a_lease_until_released(server: Server, r: redis.Redis) -> None:
    lim = Limiter(server.client(), [Rule(Concurrency(1, 30_000), "jobs", fixed_key="jobs")])
    first = lim.check("a")
    assert first.allowed and first.path == "redis" and len(first.held) == 1
    second = lim.check("b")
    assert not second.allowed and second.held == [] and lim.stats.deny_cache_hits == 0
    lim.release(first.held)
    assert lim.stats.leases_released == 1
    third = lim.check("c")
    assert third.allowed and third.path == "redis"
    lim.release(third.held)


def test_a_policy_rule_is_read_once_and_can_be_global(server: Server, r: redis.Redis) -> None:
    r.execute_command("RL.POLICY", "SET", "api", "SLIDING", 4, 60_000)
    rules = [
        Rule(Policy("api"), "api", fixed_key="{t}api", global_=True),
        Rule(Sliding(3, 60_000), "user", key_prefix="{t}user:"),
    ]
    lim = Limiter(server.client(), rules, instances=2)  # the api's share: ceil(4 * 1.1 / 2) = 3
    paths = [lim.check(u) for u in ("a", "a", "b", "c")]
    assert [a.path for a in paths] == ["redis", "redis", "redis", "local"]
    assert lim.stats.local_denied == 1
    assert int(r.execute_command("RL.HIT", "api", "{t}api", "COST", 0)[2]) == 1


def test_threads_share_one_limiter(server: Server, r: redis.Redis) -> None:
    lim = Limiter(server.client(), [Rule(Sliding(50, 60_000), "t", fixed_key="t", global_=True)])
    with ThreadPoolExecutor(8) as pool:
        admitted = sum(pool.map(lambda _: lim.check("x").allowed, range(80)))
    assert admitted == 50 and lim.stats.local_denied == 30
    assert remaining(r, "t", 50, 60_000) == 0


class CountingConnection(redis.Connection):
    """Counts the writes it sends (a handshake's, a PING's; redis-py's own
    retries included)."""

    sends = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sends += 1
        super().send_packed_command(command, check_health)


def test_the_sync_probe_is_one_ping_without_redis_py_retries(own_server: Server) -> None:
    # redis-py (6 and later) retries a timed-out command by default, up to
    # 10 times with backoff: a probe under the limiter's lock then stalled
    # every thread for seconds, well beyond the socket_timeout deadline.
    client = quick(own_server)
    client.connection_pool.connection_class = CountingConnection
    lim = Limiter(
        client, [Rule(Sliding(10, 60_000), "s")], breaker_failures=1, breaker_open_for=0.05
    )
    assert lim.check("u").path == "redis"
    with stopped(own_server):
        assert lim.check("u").path == "fallback" and lim.breaker_open
        wait_until(lambda: time.monotonic() >= lim._open_until, 5, "the breaker to be due")
        CountingConnection.sends = 0
        probed = lim.check("u")
        assert probed.path == "fallback" and lim.stats.probes == 1
        assert CountingConnection.sends == 1
        assert lim.breaker_open
    wait_until(lambda: time.monotonic() >= lim._open_until, 5, "the breaker to be due")
    wait_until(lambda: lim.check("u").path == "redis", 10, "Redis back in use")


def test_a_sync_startup_against_a_stopped_redis_is_not_retried_per_request(
    own_server: Server,
) -> None:
    # Before Redis first answered, every check ran the start-up again (a
    # PING with redis-py's retries, under the lock): a dead Redis cost every
    # request its timeouts. Now one attempt per breaker_open_for.
    client = quick(own_server)
    client.connection_pool.connection_class = CountingConnection
    lim = Limiter(client, [Rule(Sliding(10, 60_000), "s")], breaker_open_for=60)
    with stopped(own_server):
        CountingConnection.sends = 0
        assert [lim.check("u").path for _ in range(3)] == ["fallback"] * 3
        assert CountingConnection.sends == 1 and not lim.ready
    lim._startup_after = 0.0  # as if breaker_open_for had passed
    wait_until(lambda: lim.check("u").path == "redis", 10, "Redis in use")
    assert lim.ready


def test_a_cancelled_check_gives_back_the_local_units_no_call_took(own_server: Server) -> None:
    # The lease call goes first; cancelled while it waits, the check never
    # sent the global rule's call, so the unit its local level took must
    # come back (it was kept: every cancellation shrank the share for good).
    # The lease call on its way may have been granted: held until its expiry.
    window = FixedWindow(2, 60_000)

    async def main() -> None:
        lim = AsyncLimiter(
            aioredis.Redis(port=own_server.port, socket_timeout=30),
            [Rule(Concurrency(5, 60_000), "c"), Rule(window, "g", global_=True)],
            deadline=30,
            connections=2,
        )
        await lim.startup()
        with stopped(own_server):
            task = asyncio.ensure_future(lim.check("u"))
            await until(lambda: lim.stats.redis_calls == 1)
            await asyncio.sleep(0)  # the lease call is on its way
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        now = time.time()
        assert lim.local.peek("g", "rl:g:u", window, 2, Request.cost(2).core(), now).allowed
        assert lim.local._held("c", "rl:c:u", time.monotonic()) == 1  # the lost lease
        await lim.client.redis.aclose()

    asyncio.run(main())


def test_a_sync_call_that_reconnects_tries_once_within_the_socket_timeout(
    own_server: Server,
) -> None:
    # After a timeout the connection is dropped; the next call connects
    # again, which redis-py (6 and later) retries 10 times with backoff by
    # default: each decision until the breaker opened took some 11 socket
    # timeouts and seconds of backoff instead of one timeout.
    client = quick(own_server)
    client.connection_pool.connection_class = CountingConnection
    lim = Limiter(client, [Rule(Sliding(10, 60_000), "s")], breaker_failures=5)
    assert lim.check("u").path == "redis"
    with stopped(own_server):
        assert lim.check("u").path == "fallback"  # its connection is dropped
        CountingConnection.sends = 0
        assert lim.check("u").path == "fallback" and lim.stats.redis_timeouts == 2
        assert CountingConnection.sends == 1
    wait_until(lambda: lim.check("u").path == "redis", 10, "Redis in use")
    assert client.connection_pool.connection_kwargs["retry"].get_retries() > 0  # untouched


def test_an_async_start_up_against_a_stopped_redis_is_bounded_and_not_repeated(
    own_server: Server,
) -> None:
    # Before Redis first answered, every check awaited the start-up with no
    # bound but the client's socket_timeout (times redis-py's retries), and
    # the next request waited its turn to try again.
    async def main() -> None:
        lim = AsyncLimiter(
            aioredis.Redis(port=own_server.port, socket_timeout=60),
            [Rule(Sliding(10, 60_000), "s")],
            deadline=0.05,
            breaker_open_for=60,
            connections=2,
        )
        with stopped(own_server):
            first = await asyncio.wait_for(lim.check("u"), 30)
            assert first.path == "fallback" and not lim.ready
            again = await asyncio.wait_for(lim.check("u"), 30)  # no new attempt
            assert again.path == "fallback" and lim._starting is not None
        await until(lambda: lim.ready)  # the attempt goes on, and Redis answers it
        assert (await lim.check("u")).path == "redis"
        await lim.client.redis.aclose()

    asyncio.run(main())


def test_a_key_of_another_type_does_not_open_the_breaker_for_every_key(
    server: Server, r: redis.Redis
) -> None:
    # WRONGTYPE is about one key, not Redis away (as the Rust kit's breaker,
    # which counts timeouts and connection failures): one identity whose key
    # collides with another value opened the breaker for every other one.
    r.set("rl:wt:bad", "not a limiter")
    lim = Limiter(server.client(), [Rule(Sliding(10, 60_000), "wt")], breaker_failures=2)
    assert [lim.check("bad").path for _ in range(3)] == ["fallback"] * 3
    assert lim.stats.redis_errors == 3 and not lim.breaker_open
    assert lim.check("good").path == "redis"


def test_an_rl_all_denial_is_cached_for_its_set_only(server: Server, r: redis.Redis) -> None:
    """An RL.ALL denial waits for the slowest limiter that denied, not for
    the one it names first: cached for its set of rules and keys only, so
    another identity, which shares the fast rule's key, passes once that
    rule admits again."""
    fast = Rule(Sliding(1, 300), "fast", fixed_key="dc:f")
    slow = Rule(Sliding(1, 60_000), "slow", key_prefix="dc:s:")
    lim = Limiter(server.client(), [fast, slow], deny_cache_max=60.0)
    assert lim.check("a").allowed
    denied = lim.check("a")
    assert not denied.allowed and denied.path == "redis" and denied.decision.wait_ms > 50_000
    assert lim.check("a").path == "deny_cache"
    wait_until(lambda: remaining(r, "dc:f", 1, 300) == 1)
    b = lim.check("b")
    assert b.allowed and b.path == "redis", b
