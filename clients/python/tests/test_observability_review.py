"""Metrics and deny events where they broke under review: a fork (a
pre-forking server's workers), a buffer smaller than a batch, `close()`
while the flusher ships to a slow sink, and arguments that reached the
flusher unchecked and cost a whole batch there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from conftest import Server, wait_until
from observability import BulkServer, scrape, value
from prometheus_client import CollectorRegistry

from redis_ratelimit_client import (
    AsyncLimiter,
    BulkSink,
    DenyEvent,
    DenyEvents,
    FileSink,
    InvalidArgument,
    Limiter,
    Metrics,
    Rule,
    Sliding,
)
from redis_ratelimit_client.events import MAX_SECONDS

SRC = Path(__file__).resolve().parents[1] / "src"


def deny(events: DenyEvents, key: str) -> None:
    events.deny(key=key, rule="r", level="redis", limit=1, remaining=0, retry_after_ms=5)


FORK = """
import os, sys, threading, time
from prometheus_client import CollectorRegistry
from redis_ratelimit_client import DenyEvents, FileSink

reg = CollectorRegistry()
events = DenyEvents(FileSink(sys.argv[1]), flush_interval=3600, flush_events=2, metrics=reg)
m = events.metrics


def deny(key):
    events.deny(key=key, rule="r", level="redis", limit=1, remaining=0, retry_after_ms=5)


deny("parent")  # waiting in the buffer at the fork: the parent's to ship
# Another thread holds each lock at the moment of the fork.
held, go = threading.Event(), threading.Event()


def hold():
    with events._lock, m._lock:
        held.set()
        go.wait()


holder = threading.Thread(target=hold)
holder.start()
held.wait()
pid = os.fork()
if pid:
    go.set()
    holder.join()
if pid == 0:
    code = 1
    try:
        deny("child0")
        deny("child1")  # two wait: the child's flusher ships them
        deadline = time.monotonic() + 10
        while events.shipped < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        m.decision("r", "redis", "denied")
        code = 0 if (events.shipped, events.dropped) == (2, 0) else 3
    finally:
        os._exit(code)
deadline = time.monotonic() + 20
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child", os.WEXITSTATUS(status))
        break
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("child hung")
        break
    time.sleep(0.02)
events.close()
print("parent", events.shipped, events.dropped)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_worker_ships_its_own_events_once(tmp_path: Path) -> None:
    """A pre-forking server (gunicorn --preload) makes the shipper in the
    parent: each worker must get working locks and a flusher of its own,
    and the events waiting at the fork are the parent's alone."""
    path = tmp_path / "deny.jsonl"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", FORK, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["child 0", "parent 1 0"], out.stdout + out.stderr
    keys = sorted(json.loads(x)["key"] for x in path.read_text().splitlines())
    assert keys == ["child0", "child1", "parent"]  # each once


def test_a_buffer_smaller_than_flush_events_ships_when_full_not_at_the_interval() -> None:
    batches: list[list[DenyEvent]] = []
    # flush_events keeps its default (1,000): the buffer never holds that many.
    events = DenyEvents(batches.append, capacity=10, flush_interval=3600)
    try:
        for i in range(10):
            deny(events, f"k{i}")
        # An hour's interval: only a full buffer can have woken the flusher.
        wait_until(lambda: events.shipped == 10, 10, "the full buffer shipped")
        assert events.dropped == 0
        assert [e.key for b in batches for e in b] == [f"k{i}" for i in range(10)]
    finally:
        events.close()


def test_close_is_bounded_by_its_timeout_while_the_flusher_ships_to_a_slow_sink() -> None:
    """A sink that answers each batch in time, but slowly: `close()` ships
    what fits in its `timeout` and drops (counts) the rest, rather than
    waiting for the flusher to ship every batch."""
    calls: list[int] = []
    never = threading.Event()

    def slow(batch: list[DenyEvent]) -> None:
        calls.append(len(batch))
        never.wait(0.3)  # each batch within the timeout (1 s)

    events = DenyEvents(slow, flush_interval=3600, flush_events=1, timeout=1)
    n = 40
    for i in range(n):
        deny(events, f"k{i}")
    wait_until(lambda: calls, 10, "the flusher shipping")
    events.close()
    made = len(calls)
    assert made < n  # 40 batches of 0.3 s would be 12 s
    assert events.shipped + events.dropped == n and events.pending == 0
    assert events.dropped >= 1
    assert len(calls) == made  # nothing shipped after close() returned


def test_a_bad_client_ip_or_user_agent_is_refused_naming_it(server: Server) -> None:
    """Each would reach the flusher and cost its whole batch there (not JSON
    text); refused at the call instead, with the argument's name."""
    server.client().flushall()
    events = DenyEvents(list, start=False)
    lim = Limiter(server.client(), [Rule(Sliding(1, 60_000), "per-user")], deny_events=events)
    for kwargs, param in (
        ({"client_ip": b"10.0.0.1"}, "client_ip"),
        ({"client_ip": 10}, "client_ip"),
        ({"user_agent": b"curl"}, "user_agent"),
    ):
        with pytest.raises(InvalidArgument) as e:
            lim.check("alice", **kwargs)
        assert e.value.param == param
    alim = AsyncLimiter(
        aioredis.Redis(port=server.port), [Rule(Sliding(1, 60_000), "per-user")], connections=1
    )

    async def bad() -> None:
        try:
            with pytest.raises(InvalidArgument) as e:
                await alim.check("alice", user_agent=["x"])  # type: ignore[arg-type]
            assert e.value.param == "user_agent"
        finally:
            await alim.client.redis.aclose()

    import asyncio

    asyncio.run(bad())
    assert events.pending == 0


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"key": None}, "key"),
        ({"key": b"k"}, "key"),
        ({"rule": 3}, "rule"),
        ({"level": None}, "level"),
        ({"limit": "1"}, "limit"),
        ({"remaining": 0.5}, "remaining"),
        ({"retry_after_ms": None}, "retry_after_ms"),
        ({"outcome": "admitted"}, "outcome"),
        ({"client_ip": b"1.2.3.4"}, "client_ip"),
        ({"user_agent": 7}, "user_agent"),
    ],
)
def test_deny_refuses_a_field_that_is_not_the_contracts(
    tmp_path: Path, kwargs: dict[str, Any], param: str
) -> None:
    path = tmp_path / "deny.jsonl"
    events = DenyEvents(FileSink(str(path)), start=False)
    fields: dict[str, Any] = {
        "key": "k",
        "rule": "r",
        "level": "redis",
        "limit": 1,
        "remaining": 0,
        "retry_after_ms": 5,
        **kwargs,
    }
    with pytest.raises(InvalidArgument) as e:
        events.deny(**fields)
    assert e.value.param == param
    deny(events, "good")  # the batch of the good one is not lost
    assert events.flush() == 1 and events.sink_errors == 0
    assert [json.loads(x)["key"] for x in path.read_text().splitlines()] == ["good"]


def test_the_bulk_sinks_timeout_and_headers_are_checked() -> None:
    for kwargs, param in (
        ({"timeout": "2"}, "timeout"),
        ({"timeout": True}, "timeout"),
        ({"headers": [("a", "b")]}, "headers"),
        ({"headers": {"a": 1}}, "headers"),
    ):
        with pytest.raises(InvalidArgument) as e:
            BulkSink("http://127.0.0.1:9", **kwargs)
        assert e.value.param == param, kwargs


def test_counters_are_exact_under_threads(server: Server) -> None:
    """Many threads deciding at once: every decision counted exactly once
    (the counters take no lock on the request's path)."""
    server.client().flushall()
    reg = CollectorRegistry()
    lim = Limiter(
        server.client(), [Rule(Sliding(1, 3_600_000), "per-user")], metrics=reg, deny_cache_max=60
    )
    assert lim.check("alice").allowed
    threads, each = 8, 2000
    start = threading.Barrier(threads)

    def run() -> None:
        start.wait()
        for _ in range(each):
            lim.check("alice")

    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    text = scrape(reg)
    counted = sum(
        value(text, "ratelimit_decisions_total", rule="per-user", level=level, outcome="denied")
        for level in ("redis", "deny_cache")
    )
    assert counted == threads * each
    assert Metrics.of(reg).decisions()[("per-user", "redis", "admitted")] == 1


def test_a_scrape_racing_decisions_misses_none(server: Server, r: redis.Redis) -> None:
    """Scrapes on another thread while decisions are counted: the last one has them all."""
    reg = CollectorRegistry()
    lim = Limiter(server.client(), [Rule(Sliding(1, 3_600_000), "per-user")], metrics=reg)
    stop = threading.Event()
    texts: list[str] = []

    def scraper() -> None:
        while not stop.is_set():
            texts.append(scrape(reg))

    t = threading.Thread(target=scraper)
    t.start()
    try:
        for i in range(300):
            lim.check(f"u{i % 3}")
    finally:
        stop.set()
        t.join()
    assert texts
    final = scrape(reg)
    total = sum(
        value(final, "ratelimit_decisions_total", rule="per-user", level=lv, outcome=o)
        for lv in ("redis", "deny_cache")
        for o in ("admitted", "denied")
    )
    assert total == 300


def test_every_event_is_shipped_or_counted_dropped_under_threads() -> None:
    """Threads recording into a small buffer while the flusher ships and a
    full buffer drops: not one event lost uncounted or counted twice."""
    reg = CollectorRegistry()
    got: list[str] = []
    events = DenyEvents(
        lambda batch: got.extend(e.key for e in batch),
        capacity=100,
        flush_events=50,
        flush_interval=0.01,
        metrics=reg,
    )
    threads, each = 8, 3000
    start = threading.Barrier(threads)

    def run(t: int) -> None:
        start.wait()
        for i in range(each):
            deny(events, f"t{t}-{i}")

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    events.close()
    total = threads * each
    assert events.pending == 0
    assert events.shipped == len(got) == len(set(got))  # none twice
    assert events.shipped + events.dropped == total
    text = scrape(reg)
    assert value(text, "ratelimit_deny_events_shipped_total") == events.shipped
    assert value(text, "ratelimit_deny_events_dropped_total") == events.dropped
    # Each thread's events that were shipped came in its order.
    for t in range(threads):
        mine = [int(k.split("-")[1]) for k in got if k.startswith(f"t{t}-")]
        assert mine == sorted(mine)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"flush_interval": float("inf")}, "flush_interval"),
        ({"flush_interval": 1e12}, "flush_interval"),
        ({"timeout": float("inf")}, "timeout"),
        ({"timeout": 1e12}, "timeout"),
    ],
)
def test_a_wait_too_long_for_the_platform_is_refused_not_fatal_to_the_flusher(
    kwargs: dict[str, Any], param: str
) -> None:
    """`threading`'s waits refuse more than `threading.TIMEOUT_MAX` (and
    infinity): the flusher died at its first wait (nothing ever shipped) or
    at its first batch; refused at the call instead, naming the argument."""
    with pytest.raises(InvalidArgument) as e:
        DenyEvents(list, **kwargs)
    assert e.value.param == param
    with pytest.raises(InvalidArgument) as e:
        BulkSink("http://127.0.0.1:9", timeout=float("inf"))
    assert e.value.param == "timeout"


def test_the_longest_wait_the_platform_takes_still_ships_by_count() -> None:
    batches: list[list[DenyEvent]] = []
    events = DenyEvents(
        batches.append, flush_interval=MAX_SECONDS, flush_events=2, timeout=MAX_SECONDS
    )
    try:
        deny(events, "a")
        deny(events, "b")
        wait_until(lambda: events.shipped == 2, 10, "a flush by count")
        assert events.running
    finally:
        events.close()


def test_a_lone_surrogate_costs_no_batch_at_file_or_bulk(tmp_path: Path) -> None:
    """A str may hold a lone surrogate (an identity from `os.fsdecode`, say):
    UTF-8 cannot encode it, and the whole batch was lost with it. It is
    written as JSON's own escape instead, and reads back the same."""
    odd = "user-\udc80"
    path = tmp_path / "deny.jsonl"
    bulk = BulkServer()
    try:
        for sink in (FileSink(str(path)), BulkSink(bulk.url)):
            events = DenyEvents(sink, start=False)
            deny(events, "before")
            deny(events, odd)
            deny(events, "after")
            assert events.flush() == 3 and events.sink_errors == 0
        lines = [json.loads(x)["key"] for x in path.read_text().splitlines()]
        assert lines == ["before", odd, "after"]
        assert [e["key"] for e in bulk.events()] == ["before", odd, "after"]
    finally:
        bulk.stop()


def _python312() -> str | None:
    """A CPython 3.12 (its atexit refuses new threads), if this host has one."""
    import glob
    import shutil

    pyenv = glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12"))
    for found in [*sorted(pyenv), shutil.which("python3.12")]:
        if found:
            done = subprocess.run(
                [found, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if done.stdout.strip() == "True":
                return found
    return None


HUNG_AT_EXIT = """
import sys, threading
from redis_ratelimit_client import DenyEvents, FileSink
gate = threading.Event()
hung = DenyEvents(lambda batch: gate.wait(), flush_interval=3600, timeout=0.5)
shipped = DenyEvents(FileSink(sys.argv[1]), flush_interval=3600, timeout=5)
for e in (hung, shipped):
    e.deny(key="k", rule="r", level="redis", limit=1, remaining=0, retry_after_ms=1)
"""  # never closed: at the exit, one sink hangs, the other ships


@pytest.mark.parametrize("python", ["this", "3.12"])
def test_the_exit_with_a_hung_callback_is_bounded_and_ships_the_rest(
    tmp_path: Path, python: str
) -> None:
    """CPython 3.12's atexit refuses new threads: the sink was then called
    on the exiting thread, and a callback that hangs hung the exit forever.
    The sink runs on a thread of the shipper's own, started with it."""
    import sysconfig

    exe = sys.executable if python == "this" else _python312()
    if exe is None:
        pytest.skip("no CPython 3.12 on this host")
    path = tmp_path / "deny.jsonl"
    # redis and prometheus_client are pure Python: this interpreter's serve.
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{sysconfig.get_paths()['purelib']}"}
    out = subprocess.run(
        [exe, "-c", HUNG_AT_EXIT, str(path)], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert [json.loads(x)["key"] for x in path.read_text().splitlines()] == ["k"]
