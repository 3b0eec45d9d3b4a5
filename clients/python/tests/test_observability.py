"""Metrics and deny events (issue 26) against real servers: the limiters'
decisions at every level as a prometheus_client scrape shows them, the
protection loop's gauges, and the deny events shipped to a real `_bulk` HTTP
endpoint written here, to a file and to a callback; a dead or hanging sink
costs counts, never a request; a full buffer drops exactly the oldest."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from conftest import FIXED_MS, Server, wait_until
from observability import (
    BulkServer,
    HangingServer,
    decisions,
    promtool_check,
    refused_url,
    samples,
    scrape,
    value,
)
from prometheus_client import CollectorRegistry

from redis_ratelimit_client import (
    AsyncLimiter,
    AsyncProtection,
    BulkSink,
    CircuitBreaker,
    DenyEvent,
    DenyEvents,
    FallbackMode,
    FileSink,
    FixedWindow,
    InvalidArgument,
    Limiter,
    Metrics,
    MetricsMissing,
    Policy,
    Protection,
    Request,
    Rule,
    Sliding,
    TokenBucket,
)
from redis_ratelimit_client.events import FIELDS

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def bulk() -> Iterator[BulkServer]:
    s = BulkServer()
    yield s
    s.stop()


def never(limit: int = 1) -> Request:
    """A cost above the limit: denied by Redis every time (wait_ms -1, so
    never cached): one deny event per call, in call order."""
    return Request.cost(limit + 1)


# -- the extra -------------------------------------------------------------------


def test_metrics_without_prometheus_client_name_the_extra(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    with pytest.raises(MetricsMissing, match=r"redis-ratelimit-client\[metrics\]"):
        Limiter(server.client(), [Rule(Sliding(1, 1000), "a")], metrics=True)
    with pytest.raises(ImportError, match="'metrics' extra"):
        Metrics.of()


def test_the_kit_runs_without_prometheus_client(server: Server, r: redis.Redis) -> None:
    """Imported lazily: a process where prometheus_client cannot be
    imported decides and ships deny events all the same."""
    code = f"""
import sys
sys.modules["prometheus_client"] = None
import redis
from redis_ratelimit_client import DenyEvents, Limiter, Request, Rule, Sliding
got = []
events = DenyEvents(got.extend, start=False)
lim = Limiter(redis.Redis(port={server.port}), [Rule(Sliding(1, 1000), "a")], deny_events=events)
print(lim.check("x").allowed, lim.check("y", Request.cost(2)).allowed, events.flush(), len(got))
"""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "1", "1"]


def test_the_metrics_argument_is_checked(server: Server) -> None:
    with pytest.raises(InvalidArgument) as e:
        Limiter(server.client(), [Rule(Sliding(1, 1000), "a")], metrics="yes")
    assert e.value.param == "metrics"
    with pytest.raises(InvalidArgument) as e:
        Limiter(server.client(), [Rule(Sliding(1, 1000), "a")], deny_events=[])  # type: ignore[arg-type]
    assert e.value.param == "deny_events"


def test_one_registry_one_collector_shared_by_every_user() -> None:
    reg = CollectorRegistry()
    assert Metrics.of(reg) is Metrics.of(reg)
    assert Metrics.of(CollectorRegistry()) is not Metrics.of(reg)
    made = CollectorRegistry()
    direct = Metrics(made)
    assert Metrics.of(made) is direct


# -- the limiters' decisions ---------------------------------------------------------


def test_every_level_and_outcome_of_the_sync_limiter_is_counted(
    server: Server, r: redis.Redis
) -> None:
    reg = CollectorRegistry()
    lim = Limiter(
        server.client(),
        [
            Rule(FixedWindow(2, FIXED_MS), "per-user"),
            Rule(TokenBucket(3, 1, 60_000), "global", fixed_key="rl-obs:global", global_=True),
        ],
        metrics=reg,
    )
    paths = [lim.check("alice").path for _ in range(4)]
    assert paths == ["redis", "redis", "redis", "deny_cache"]
    # bob takes the global rule's third unit (the decision names the rule
    # with the least left: global); carol meets its local level.
    bob = lim.check("bob")
    assert (bob.path, lim.rules[bob.index].name) == ("redis", "global")
    carol = lim.check("carol")
    assert (carol.path, carol.allowed, lim.rules[carol.index].name) == ("local", False, "global")
    text = scrape(reg)
    promtool_check(text)
    assert decisions(text) == {
        ("per-user", "redis", "admitted"): 2,
        ("per-user", "redis", "denied"): 1,
        ("per-user", "deny_cache", "denied"): 1,
        ("global", "redis", "admitted"): 1,
        ("global", "local", "denied"): 1,
    }
    # One round trip per decision that went to Redis, each in the histogram.
    assert lim.stats.redis_calls == 4
    assert value(text, "ratelimit_redis_seconds_count") == 4
    assert value(text, "ratelimit_redis_seconds_bucket", le="+Inf") == 4
    assert value(text, "ratelimit_redis_seconds_sum") > 0
    # Alice's denial left per-user 0 of 2; carol's local denial global 0.
    assert value(text, "ratelimit_remaining_ratio", rule="per-user") == 0.0
    assert value(text, "ratelimit_remaining_ratio", rule="global") == 0.0
    assert value(text, "ratelimit_breaker_open", breaker="redis") == 0


def test_the_fallback_and_the_open_breaker_are_counted(own_server: Server) -> None:
    reg = CollectorRegistry()
    lim = Limiter(
        redis.Redis(port=own_server.port, socket_timeout=0.5),
        [Rule(Sliding(1, 60_000), "per-user")],
        fallback=FallbackMode.LOCAL_ONLY,
        breaker_failures=1,
        breaker_open_for=3600,
        metrics=reg,
    )
    assert lim.check("alice").path == "redis"
    own_server.kill()
    away = [lim.check(f"u{i}") for i in range(3)] + [lim.check("u0")]
    assert [a.path for a in away] == ["fallback"] * 4
    assert [a.allowed for a in away] == [True, True, True, False]
    text = scrape(reg)
    promtool_check(text)
    assert decisions(text) == {
        ("per-user", "redis", "admitted"): 1,
        ("per-user", "fallback", "admitted"): 3,
        ("per-user", "fallback", "denied"): 1,
    }
    assert lim.stats.fallback_admitted == 3 and lim.stats.fallback_denied == 1
    assert value(text, "ratelimit_breaker_open", breaker="redis") == 1


def test_a_policy_rule_is_labelled_by_its_policy_and_the_async_limiter_counts(
    server: Server, r: redis.Redis
) -> None:
    r.execute_command("RL.POLICY", "SET", "api", "SLIDING", 2, 60_000)
    reg = CollectorRegistry()

    ratios: list[float] = []

    async def run() -> list[str]:
        lim = AsyncLimiter(
            aioredis.Redis(port=server.port),
            [Rule(Policy("api"), "per-user", key_prefix="rl-obs:")],
            metrics=reg,
            deny_cache_max=0,
        )
        out = []
        for _ in range(3):
            out.append((await lim.check("alice")).path)
            ratios.append(value(scrape(reg), "ratelimit_remaining_ratio", rule="api"))
        await lim.client.redis.aclose()
        return out

    assert asyncio.run(run()) == ["redis"] * 3
    assert ratios == [0.5, 0.0, 0.0]  # remaining / limit: 1 of 2, then none
    text = scrape(reg)
    assert decisions(text) == {("api", "redis", "admitted"): 2, ("api", "redis", "denied"): 1}
    assert value(text, "ratelimit_redis_seconds_count") == 3


def test_the_protection_loop_shows_scale_stage_and_its_breaker(
    server: Server, r: redis.Redis
) -> None:
    r.execute_command(
        "RL.POLICY", "SET", "api", *"TOKENBUCKET 2 1 60000 STAGES 30 50 WINDOW 1000".split()
    )
    r.execute_command("RL.POLICY", "SCALE", "api", 40)
    reg = CollectorRegistry()
    breaker = CircuitBreaker("downstream")
    p = Protection(server.client(), ["api"], breakers={"api": breaker}, metrics=reg)
    p.poll()
    text = scrape(reg)
    assert value(text, "ratelimit_scale", rule="api") == 40
    assert value(text, "ratelimit_stage", rule="api") == 0
    assert value(text, "ratelimit_breaker_open", breaker="downstream") == 0

    def flooded() -> bool:
        for _ in range(10):
            r.execute_command("RL.HIT", "api", "flooder")
        p.poll()
        return p.stage("api") == 2

    wait_until(flooded, 5, "stage 2")
    text = scrape(reg)
    promtool_check(text)
    assert value(text, "ratelimit_stage", rule="api") == 2
    assert value(text, "ratelimit_breaker_open", breaker="downstream") == 1
    p.close()  # releases the breaker it forced open
    assert value(scrape(reg), "ratelimit_breaker_open", breaker="downstream") == 0


def test_an_attached_limiter_brings_the_loop_into_its_registry(
    server: Server, r: redis.Redis
) -> None:
    r.execute_command("RL.POLICY", "SET", "api", *"TOKENBUCKET 100 100 1000 STAGES 30 50".split())
    reg = CollectorRegistry()

    async def run() -> None:
        client = aioredis.Redis(port=server.port)
        lim = AsyncLimiter(client, [Rule(Policy("api"), "per-user")], metrics=reg)
        loop = AsyncProtection(client, ["api"])
        loop.attach(lim)
        await loop.poll()
        await client.aclose()

    asyncio.run(run())
    text = scrape(reg)
    assert value(text, "ratelimit_scale", rule="api") == 100
    assert ("ratelimit_stage", frozenset({("rule", "api")})) in samples(text)


# -- deny events ------------------------------------------------------------------------


def test_a_flood_of_denials_reaches_bulk_in_batches_of_at_most_1000(
    server: Server, r: redis.Redis, bulk: BulkServer
) -> None:
    reg = CollectorRegistry()
    events = DenyEvents(BulkSink(bulk.url), flush_interval=0.2)
    lim = Limiter(
        server.client(),
        [Rule(FixedWindow(1, FIXED_MS), "per-user")],
        metrics=reg,
        deny_events=events,
    )
    assert lim.check("alice").allowed
    flood = 5000
    for _ in range(flood):
        lim.check("alice", client_ip="10.0.0.7", user_agent="flood/1")
    wait_until(lambda: len(bulk.events()) == flood, 30, "every deny event at _bulk")
    assert bulk.problems == []
    assert set(bulk.paths) == {"/_bulk"}
    assert set(bulk.content_types) == {"application/x-ndjson"}
    assert max(len(b) for b in bulk.batches) <= 1000
    assert len(bulk.batches) >= flood // 1000
    got = bulk.events()
    assert list(got[0]) == list(FIELDS)  # the contract's order, both optionals known
    assert [e["level"] for e in got[:2]] == ["redis", "deny_cache"]
    assert {e["key"] for e in got} == {"rl:per-user:alice"}
    assert {(e["rule"], e["outcome"], e["limit"], e["remaining"]) for e in got} == {
        ("per-user", "denied", 1, 0)
    }
    assert all(e["retry_after_ms"] > 0 for e in got)
    assert all(e["timestamp"].endswith("Z") and len(e["timestamp"]) == 24 for e in got)
    events.close()
    text = scrape(reg)
    assert value(text, "ratelimit_deny_events_shipped_total") == flood
    assert value(text, "ratelimit_deny_events_dropped_total") == 0
    assert value(text, "ratelimit_deny_events_sink_errors_total") == 0
    assert (events.shipped, events.dropped, events.sink_errors) == (flood, 0, 0)


def test_deny_events_append_to_a_file_as_json_lines(
    server: Server, r: redis.Redis, tmp_path: Path
) -> None:
    path = tmp_path / "deny.jsonl"
    events = DenyEvents(FileSink(str(path)), flush_interval=0.2)
    lim = Limiter(server.client(), [Rule(Sliding(1, 60_000), "per-user")], deny_events=events)
    for i in range(5):
        lim.check(f"u{i}", never())

    def lines() -> list[dict[str, Any]]:
        if not path.exists():
            return []
        return [json.loads(x) for x in path.read_text().splitlines()]

    wait_until(lambda: len(lines()) == 5, 10, "5 lines in the file")
    got = lines()
    assert [e["key"] for e in got] == [f"rl:per-user:u{i}" for i in range(5)]
    # Unknown client_ip and user_agent are left out; the rest in order.
    assert list(got[0]) == list(FIELDS[:8])
    assert got[0]["retry_after_ms"] == -1  # can never pass
    events.close()


def test_a_full_buffer_with_a_stopped_flusher_drops_exactly_the_oldest(
    server: Server, r: redis.Redis
) -> None:
    reg = CollectorRegistry()
    batches: list[list[DenyEvent]] = []
    events = DenyEvents(batches.append, capacity=100, start=False, metrics=reg)
    lim = Limiter(server.client(), [Rule(Sliding(1, 60_000), "per-user")], deny_events=events)
    sent = 150
    for i in range(sent):
        assert not lim.check(f"u{i}", never()).allowed
    assert events.dropped == sent - 100 and events.pending == 100
    assert value(scrape(reg), "ratelimit_deny_events_dropped_total") == sent - 100
    # The callback gets the survivors on the flush: the newest, in order.
    assert events.flush() == 100
    assert [e.key for b in batches for e in b] == [f"rl:per-user:u{i}" for i in range(50, sent)]
    assert (events.shipped, events.sink_errors) == (100, 0)
    events.close()


def test_a_refused_connection_costs_sink_errors_and_drops_not_requests(
    server: Server, r: redis.Redis
) -> None:
    reg = CollectorRegistry()
    events = DenyEvents(BulkSink(refused_url()), flush_interval=0.1, timeout=1, metrics=reg)
    lim = Limiter(server.client(), [Rule(Sliding(1, 60_000), "per-user")], deny_events=events)
    answers = [lim.check(f"u{i}", never()) for i in range(20)]
    assert [a.allowed for a in answers] == [False] * 20
    wait_until(lambda: events.dropped == 20, 10, "every event dropped")
    assert events.sink_errors >= 1 and events.shipped == 0
    text = scrape(reg)
    assert value(text, "ratelimit_deny_events_dropped_total") == 20
    assert value(text, "ratelimit_deny_events_sink_errors_total") == events.sink_errors
    events.close()


@pytest.mark.parametrize("problem", ["errors", "status"])
def test_a_bulk_reply_with_errors_or_a_bad_status_is_a_sink_error(
    bulk: BulkServer, problem: str
) -> None:
    if problem == "errors":
        bulk.errors = True
    else:
        bulk.status = 503
    events = DenyEvents(BulkSink(bulk.url), start=False)
    for i in range(3):
        events.deny(key=f"k{i}", rule="r", level="redis", limit=1, remaining=0, retry_after_ms=5)
    assert events.flush() == 0
    assert len(bulk.batches) == 1 and len(bulk.batches[0]) == 3
    assert (events.dropped, events.sink_errors, events.shipped) == (3, 1, 0)


def test_a_sink_that_never_answers_costs_counts_not_request_latency(
    server: Server, r: redis.Redis
) -> None:
    hang = HangingServer()
    try:
        events = DenyEvents(BulkSink(hang.url, timeout=30), flush_interval=0.05, timeout=0.5)
        lim = Limiter(server.client(), [Rule(Sliding(1, 60_000), "per-user")], deny_events=events)
        lim.check("first", never())
        wait_until(lambda: hang.accepted >= 1, 10, "the flusher stuck on the sink")
        # The sink holds the flusher; requests go on all the same.
        answers = [lim.check(f"u{i}", never()) for i in range(200)]
        assert len(answers) == 200 and not any(a.allowed for a in answers)
        assert not hang.released.is_set()
        wait_until(lambda: events.dropped == 201, 20, "every event dropped")
        assert events.sink_errors >= 1 and events.shipped == 0
    finally:
        hang.release()
    events.close()


def test_a_callback_that_hangs_is_given_up_after_the_timeout() -> None:
    gate = threading.Event()
    calls: list[int] = []

    def stuck(batch: list[DenyEvent]) -> None:
        calls.append(len(batch))
        gate.wait(30)

    events = DenyEvents(stuck, timeout=0.2, start=False)
    events.deny(key="k", rule="r", level="redis", limit=1, remaining=0, retry_after_ms=5)
    assert events.flush() == 0 and (events.dropped, events.sink_errors) == (1, 1)
    # The sink still hangs: the next batch is refused at once, not piled up.
    events.deny(key="k", rule="r", level="redis", limit=1, remaining=0, retry_after_ms=5)
    assert events.flush() == 0 and (events.dropped, events.sink_errors) == (2, 2)
    assert calls == [1]
    gate.set()
    wait_until(lambda: events._stuck is None or not events._stuck.is_alive(), 10, "returned")
    events.deny(key="k", rule="r", level="redis", limit=1, remaining=0, retry_after_ms=5)
    assert events.flush() == 1 and calls == [1, 1]


def test_close_ships_what_is_left_and_later_events_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "deny.jsonl"
    events = DenyEvents(FileSink(str(path)), flush_interval=3600)
    for i in range(3):
        events.deny(key=f"k{i}", rule="r", level="local", limit=5, remaining=0, retry_after_ms=9)
    assert events.pending == 3
    events.close()
    assert [json.loads(x)["key"] for x in path.read_text().splitlines()] == ["k0", "k1", "k2"]
    events.deny(key="late", rule="r", level="local", limit=5, remaining=0, retry_after_ms=9)
    assert events.dropped == 1 and events.pending == 0


def test_the_flusher_ships_as_soon_as_flush_events_wait_not_at_the_interval() -> None:
    batches: list[list[DenyEvent]] = []
    events = DenyEvents(batches.append, flush_interval=3600, flush_events=10)
    for i in range(25):
        events.deny(key=f"k{i}", rule="r", level="redis", limit=1, remaining=0, retry_after_ms=1)
    # An hour's interval: only the count can have woken the flusher.
    wait_until(lambda: events.shipped >= 10 and events.pending < 10, 10, "a flush by count")
    assert events.shipped + events.pending == 25 and events.dropped == 0
    assert all(1 <= len(b) <= 10 for b in batches)
    shipped = [e.key for b in batches for e in b]
    assert shipped == [f"k{i}" for i in range(len(shipped))]  # oldest first
    events.close()
    assert events.shipped == 25


def test_close_with_a_hung_sink_returns_and_counts_what_it_could_not_ship() -> None:
    gate = threading.Event()
    events = DenyEvents(lambda batch: gate.wait(30), flush_interval=3600, timeout=0.2)
    try:
        for i in range(3):
            events.deny(
                key=f"k{i}", rule="r", level="redis", limit=1, remaining=0, retry_after_ms=1
            )
        events.close()  # bounded by the timeout: returns though the sink hangs
        assert events.closed and events.pending == 0
        assert (events.shipped, events.dropped, events.sink_errors) == (0, 3, 1)
    finally:
        gate.set()


def test_the_interpreters_exit_ships_what_is_left(tmp_path: Path) -> None:
    path = tmp_path / "deny.jsonl"
    code = f"""
from redis_ratelimit_client import DenyEvents, FileSink
events = DenyEvents(FileSink({str(path)!r}), flush_interval=3600)
for i in range(3):
    events.deny(key=f"k{{i}}", rule="r", level="redis", limit=1, remaining=0, retry_after_ms=1)
"""  # never closed: an hour's interval, three events waiting at the exit
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert [json.loads(x)["key"] for x in path.read_text().splitlines()] == ["k0", "k1", "k2"]


def test_an_event_line_is_the_contracts() -> None:
    e = DenyEvent(1_796_205_600.123, "rl:u:a", "api", "redis", "denied", 5, 0, 1200, "::1", "ua")
    assert e.timestamp == "2026-12-02T10:00:00.123Z"
    assert e.to_json() == (
        '{"timestamp":"2026-12-02T10:00:00.123Z","key":"rl:u:a","rule":"api","level":"redis",'
        '"outcome":"denied","limit":5,"remaining":0,"retry_after_ms":1200,"client_ip":"::1",'
        '"user_agent":"ua"}'
    )
    bare = DenyEvent(1_796_205_600.0, "k", "r", "local", "denied", 1, 0, -1)
    assert list(bare.as_dict()) == list(FIELDS[:8])
    assert bare.timestamp == "2026-12-02T10:00:00.000Z"
    # Any text a key, a rule or a header may hold: JSON's own escaping.
    odd = 'q"uo\\te\n\t\x00é☃\U0001f600'
    tricky = DenyEvent(1_796_205_601.999, odd, odd, "redis", "denied", 1, 0, 5, odd, odd)
    line = tricky.to_json()
    assert line == json.dumps(tricky.as_dict(), ensure_ascii=False, separators=(",", ":"))
    assert json.loads(line)["key"] == odd and tricky.timestamp == "2026-12-02T10:00:01.999Z"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"capacity": 0}, "capacity"),
        ({"capacity": 1.5}, "capacity"),
        ({"flush_events": 0}, "flush_events"),
        ({"flush_interval": 0}, "flush_interval"),
        ({"flush_interval": "5"}, "flush_interval"),
        ({"timeout": -1}, "timeout"),
        ({"metrics": 3}, "metrics"),
    ],
)
def test_the_shippers_arguments_are_checked(kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        DenyEvents(list.append, start=False, **kwargs)
    assert e.value.param == param


def test_the_sinks_arguments_are_checked() -> None:
    with pytest.raises(InvalidArgument) as e:
        DenyEvents("not a sink", start=False)  # type: ignore[arg-type]
    assert e.value.param == "sink"
    for kwargs, param in (
        ({"url": "ftp://x"}, "url"),
        ({"url": "http://x", "index": ""}, "index"),
        ({"url": "http://x", "timeout": 0}, "timeout"),
    ):
        with pytest.raises(InvalidArgument) as e:
            BulkSink(**kwargs)
        assert e.value.param == param
    with pytest.raises(InvalidArgument) as e:
        FileSink("")
    assert e.value.param == "path"
