"""The `limits` storage on redis+rl://, through limits' own strategies."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import pytest
import redis
from conftest import Cluster, Server, wait_until
from limits import RateLimitItemPerSecond, parse, strategies
from limits.aio import strategies as aio_strategies
from limits.errors import StorageError
from limits.storage import storage_from_string

import redis_ratelimit_client  # noqa: F401  (registers redis+rl:// and async+redis+rl://)
from redis_ratelimit_client import AsyncRLStorage, ModuleMissing, RLStorage


@pytest.fixture
def storage(server: Server, r: redis.Redis) -> RLStorage:
    s = storage_from_string(f"redis+rl://127.0.0.1:{server.port}")
    assert isinstance(s, RLStorage)
    return s


def test_the_schemes_are_registered_on_import(server: Server) -> None:
    assert isinstance(storage_from_string(f"redis+rl://127.0.0.1:{server.port}/0"), RLStorage)
    assert isinstance(
        storage_from_string(f"async+redis+rl://127.0.0.1:{server.port}"), AsyncRLStorage
    )


def test_moving_window_admits_exactly_limit_in_any_window(storage: RLStorage) -> None:
    """Client-side time brackets around each call: the server decided at some
    instant in [before, after]. Six admissions within one window would need
    after(i+5) - before(i) < window for some i; the log must never allow it."""
    limiter = strategies.MovingWindowRateLimiter(storage)
    item = RateLimitItemPerSecond(5, 1)
    admitted: list[tuple[float, float]] = []
    end = time.monotonic() + 2.6
    while time.monotonic() < end:
        before = time.monotonic()
        ok = limiter.hit(item, "exact")
        after = time.monotonic()
        if ok:
            admitted.append((before, after))
        time.sleep(0.002)
    for i in range(len(admitted) - 5):
        assert admitted[i + 5][1] - admitted[i][0] >= 1.0, f"6 admitted within 1 s at {i}"
    # The first window admits exactly 5; the log refills as entries leave.
    assert admitted[4][1] - admitted[0][0] < 1.0
    assert len(admitted) >= 5 * 2


def test_moving_window_stats_derive_the_oldest_entry(storage: RLStorage) -> None:
    limiter = strategies.MovingWindowRateLimiter(storage)
    item = parse("3/10 seconds")
    before = time.time()
    assert limiter.hit(item, "w", cost=2)
    after = time.time()
    time.sleep(0.05)
    assert limiter.hit(item, "w")
    assert not limiter.test(item, "w")
    reset, remaining = limiter.get_window_stats(item, "w")
    assert remaining == 0
    # The oldest entry was made in [before, after]; its window ends 10 s later.
    assert before + 10 - 0.01 <= reset <= after + 10 + 0.01
    assert not limiter.hit(item, "w")
    limiter.clear(item, "w")
    assert limiter.get_window_stats(item, "w").remaining == 3
    assert limiter.test(item, "w", cost=3) and not limiter.test(item, "w", cost=4)


def test_moving_window_writes_only_native_state(storage: RLStorage, r: redis.Redis) -> None:
    limiter = strategies.MovingWindowRateLimiter(storage)
    item = parse("10/minute")
    limiter.hit(item, "native")
    limiter.get_window_stats(item, "native")
    [key] = r.keys("*")
    assert r.type(key) == b"rl-slilog"
    assert r.execute_command("RL.SLIDING", key, 10, 60_000, "COST", 0)[2] == 9


def test_fixed_window_counts_and_resets(storage: RLStorage, r: redis.Redis) -> None:
    limiter = strategies.FixedWindowRateLimiter(storage)
    item = parse("2/second")
    assert limiter.hit(item, "f") and limiter.hit(item, "f")
    assert not limiter.hit(item, "f") and not limiter.test(item, "f")
    reset, remaining = limiter.get_window_stats(item, "f")
    assert remaining == 0 and time.time() < reset <= time.time() + 1
    [key] = r.keys("*")
    assert r.type(key) == b"string" and 0 < r.pttl(key) <= 1000
    wait_until(lambda: limiter.test(item, "f"), 3, "the fixed window to end")
    assert limiter.hit(item, "f", cost=2) and not limiter.hit(item, "f")


def test_sliding_window_counter_on_the_hash_window(storage: RLStorage, r: redis.Redis) -> None:
    limiter = strategies.SlidingWindowCounterRateLimiter(storage)
    item = parse("4/second")
    assert all(limiter.hit(item, "s") for _ in range(4))
    assert not limiter.hit(item, "s") and not limiter.test(item, "s")
    reset, remaining = limiter.get_window_stats(item, "s")
    assert remaining == 0 and time.time() < reset <= time.time() + 1
    [key] = r.keys("*")
    assert r.type(key) == b"rl-hashwn"
    wait_until(lambda: limiter.test(item, "s", cost=4), 3, "the window to slide")
    assert limiter.get_window_stats(item, "s").remaining == 4
    limiter.hit(item, "s")
    limiter.clear(item, "s")
    assert r.dbsize() == 0


def test_reset_and_check(storage: RLStorage, r: redis.Redis) -> None:
    item = parse("5/minute")
    for strategy in (
        strategies.MovingWindowRateLimiter,
        strategies.FixedWindowRateLimiter,
        strategies.SlidingWindowCounterRateLimiter,
    ):
        strategy(storage).hit(item, "a")
    r.set("other", "x")
    assert storage.check()
    assert storage.reset() == 3
    assert r.keys("*") == [b"other"]


def test_a_limit_the_log_cannot_hold_is_an_error(storage: RLStorage) -> None:
    limiter = strategies.MovingWindowRateLimiter(storage)
    with pytest.raises(Exception, match="sliding-max-limit"):
        limiter.hit(parse("1000000/hour"), "huge")


def test_missing_module_and_dead_server_are_clear(plain_server: Server, own_server: Server) -> None:
    s = storage_from_string(f"redis+rl://127.0.0.1:{plain_server.port}")
    with pytest.raises(ModuleMissing, match=str(plain_server.port)):
        strategies.MovingWindowRateLimiter(s).hit(parse("1/second"), "x")
    wrapped = storage_from_string(
        f"redis+rl://127.0.0.1:{own_server.port}", wrap_exceptions=True, socket_timeout=1
    )
    own_server.kill()
    with pytest.raises(StorageError):
        strategies.MovingWindowRateLimiter(wrapped).hit(parse("1/second"), "x")
    assert not wrapped.check()


def test_async_storage(server: Server, r: redis.Redis) -> None:
    async def go() -> None:
        s = storage_from_string(f"async+redis+rl://127.0.0.1:{server.port}")
        mw = aio_strategies.MovingWindowRateLimiter(s)
        item = parse("2/10 seconds")
        assert await mw.hit(item, "a") and await mw.hit(item, "a")
        assert not await mw.hit(item, "a") and not await mw.test(item, "a")
        assert (await mw.get_window_stats(item, "a")).remaining == 0
        fw = aio_strategies.FixedWindowRateLimiter(s)
        assert await fw.hit(item, "b") and await fw.hit(item, "b") and not await fw.hit(item, "b")
        sw = aio_strategies.SlidingWindowCounterRateLimiter(s)
        assert await sw.hit(item, "c", cost=2) and not await sw.test(item, "c")
        await mw.clear(item, "a")
        assert await mw.test(item, "a")
        assert await s.check()
        assert await s.reset() == 2

    asyncio.run(go())


def test_cluster_scheme(cluster: Cluster) -> None:
    nodes = ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes)
    s = storage_from_string(f"redis+rl+cluster://{nodes}")
    mw = strategies.MovingWindowRateLimiter(s)
    item = parse("1/minute")
    before = cluster.moved_errors()
    for i in range(20):
        assert mw.hit(item, f"u{i}") and not mw.hit(item, f"u{i}")
        assert mw.get_window_stats(item, f"u{i}").remaining == 0
    assert cluster.moved_errors() == before
    s.reset()


def test_bad_costs_raise_and_write_nothing(storage: RLStorage, r: redis.Redis) -> None:
    from redis_ratelimit_client import InvalidArgument

    item = parse("5/minute")
    for strategy in (
        strategies.MovingWindowRateLimiter,
        strategies.FixedWindowRateLimiter,
        strategies.SlidingWindowCounterRateLimiter,
    ):
        with pytest.raises(InvalidArgument, match="amount"):
            strategy(storage).hit(item, "neg", cost=-1)
        with pytest.raises(InvalidArgument, match="amount"):
            strategy(storage).hit(item, "neg", cost="2")  # type: ignore[arg-type]
    assert r.dbsize() == 0


def poll_until_true(check: Callable[[], bool]) -> tuple[float, float]:
    """Calls `check` until it answers True: (the instant before the last call
    that answered False, the instant after the first that answered True)."""
    last_false = time.time()
    while True:
        before = time.time()
        if check():
            return last_false, time.time()
        last_false = before


def test_sliding_window_counter_reset_is_when_the_oldest_unit_leaves(storage: RLStorage) -> None:
    """The issue's repro at a tenth of its scale: 2 per second; hits at t0
    and t0 + 0.5; denied at t0 + 0.6. The reset is when `test()` is true
    again (the oldest unit leaves), not when the newest does."""
    limiter = strategies.SlidingWindowCounterRateLimiter(storage)
    item = parse("2/second")
    t0 = time.time()
    assert limiter.hit(item, "reset")
    poll_until_true(lambda: time.time() >= t0 + 0.5)
    assert limiter.hit(item, "reset")
    poll_until_true(lambda: time.time() >= t0 + 0.6)
    assert not limiter.test(item, "reset")
    before = time.time()
    reset, remaining = limiter.get_window_stats(item, "reset")
    took = time.time() - before
    assert remaining == 0
    last_false, first_true = poll_until_true(lambda: limiter.test(item, "reset"))
    # The reset is the server's wait added to the client's clock after the
    # reply: late by at most the call's own time, never early.
    assert last_false - 0.002 <= reset <= first_true + took + 0.002, (t0, reset, last_false)


def test_peeks_send_the_script_by_its_sha(storage: RLStorage, r: redis.Redis) -> None:
    """`get_window_stats` runs on every response with headers on: the peek
    script goes by its SHA1, in full once after a `NOSCRIPT`."""
    moving = strategies.MovingWindowRateLimiter(storage)
    counter = strategies.SlidingWindowCounterRateLimiter(storage)
    item = parse("10/minute")
    moving.hit(item, "sha")
    counter.hit(item, "sha")
    r.script_flush()
    r.config_resetstat()
    for _ in range(5):
        assert moving.get_window_stats(item, "sha").remaining == 9
        assert counter.get_window_stats(item, "sha").remaining == 9
    stats = r.info("commandstats")
    assert stats["cmdstat_eval"]["calls"] == 1  # the NOSCRIPT after the flush
    assert stats["cmdstat_evalsha"]["calls"] >= 9


def test_async_peeks_send_the_script_by_its_sha(server: Server, r: redis.Redis) -> None:
    async def go() -> None:
        s = storage_from_string(f"async+redis+rl://127.0.0.1:{server.port}")
        moving = aio_strategies.MovingWindowRateLimiter(s)
        item = parse("10/minute")
        await moving.hit(item, "sha")
        r.script_flush()
        r.config_resetstat()
        for _ in range(3):
            assert (await moving.get_window_stats(item, "sha")).remaining == 9
        stats = r.info("commandstats")
        assert stats["cmdstat_eval"]["calls"] == 1
        assert stats["cmdstat_evalsha"]["calls"] >= 2

    asyncio.run(go())


def test_check_is_false_on_a_server_without_the_module(plain_server: Server) -> None:
    """flask-limiter's in-memory fallback returns to the storage when
    `check()` says True: a server that cannot run RL.* must say False."""
    assert not storage_from_string(f"redis+rl://127.0.0.1:{plain_server.port}").check()

    async def go() -> bool:
        s = storage_from_string(f"async+redis+rl://127.0.0.1:{plain_server.port}")
        return bool(await s.check())

    assert not asyncio.run(go())


def test_a_restart_without_the_module_is_module_not_loaded(own_server: Server) -> None:
    from redis_ratelimit_client import Client

    s = storage_from_string(f"redis+rl://127.0.0.1:{own_server.port}")
    limiter = strategies.MovingWindowRateLimiter(s)
    rl = Client(own_server.client())
    assert limiter.hit(parse("5/minute"), "x") and rl.sliding("y", 5, 60_000).allowed
    assert s.check()
    own_server.kill()
    own_server.module = False
    own_server.start()
    port = str(own_server.port)
    with pytest.raises(ModuleMissing, match=port):
        limiter.hit(parse("5/minute"), "x")
    with pytest.raises(ModuleMissing, match=port):
        rl.sliding("y", 5, 60_000)
    assert not s.check()
