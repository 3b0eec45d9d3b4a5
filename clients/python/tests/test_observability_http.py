"""The example services (examples/asgi_middleware.py, flask_app.py) over real HTTP, against a
real redis-server with the module: its `/metrics`, scraped over HTTP, passes
`promtool check metrics` and counts exactly the requests the test drove, by
level and outcome; its denials reach the deny events' file with the client's
IP and User-Agent; a `_bulk` sink that never answers costs counts, never a
request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from conftest import Server, running, serve_asgi, serve_wsgi, wait_until
from observability import HangingServer, decisions, promtool_check, value
from test_examples import load

UA = "rl-obs-test/1"


def example(server: Server, monkeypatch: pytest.MonkeyPatch, **env: str) -> Any:  # the FastAPI app
    monkeypatch.setenv("INSTANCES", "1")
    monkeypatch.setenv("RL_DEADLINE", "0.5")
    # A window no run outlasts, no stages: the counts are the test's alone;
    # no deny cache: every denial is Redis's.
    monkeypatch.setenv("RL_POLICY_SPEC", "SLIDING 5 3600000")
    monkeypatch.setenv("RL_DENY_CACHE_MAX", "0")
    monkeypatch.setenv("RL_DENY_FLUSH_INTERVAL", "0.2")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return load("asgi_middleware", server, monkeypatch).app


def drive(http: httpx.Client, user: str, n: int) -> list[int]:
    return [http.get("/", headers={"x-user": user, "user-agent": UA}).status_code for _ in range(n)]


def test_the_example_serves_metrics_that_count_what_was_driven(
    server: Server, r: redis.Redis, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    deny_file = tmp_path / "deny.jsonl"
    app = example(server, monkeypatch, RL_DENY_FILE=str(deny_file))
    with running(serve_asgi(app, lifespan="on")) as web, httpx.Client(base_url=web.base) as http:
        alice = drive(http, "alice", 12)
        bob = drive(http, "bob", 3)
        assert alice == [200] * 5 + [429] * 7 and bob == [200] * 3
        scraped = http.get("/metrics")
        assert scraped.status_code == 200
        assert scraped.headers["content-type"].startswith("text/plain")
        text = scraped.text

        def lines() -> list[dict[str, Any]]:
            if not deny_file.exists():
                return []
            return [json.loads(x) for x in deny_file.read_text().splitlines()]

        wait_until(lambda: len(lines()) == 7, 10, "7 deny events in the file")
    promtool_check(text)
    # The policy rule is labelled by its policy's name; every decision is Redis's.
    assert decisions(text) == {("api", "redis", "admitted"): 8, ("api", "redis", "denied"): 7}
    assert value(text, "ratelimit_redis_seconds_count") == 15  # one RL.ALL per request
    assert value(text, "ratelimit_breaker_open", breaker="redis") == 0
    assert value(text, "ratelimit_breaker_open", breaker="backend") == 0
    assert value(text, "ratelimit_scale", rule="api") == 100
    assert value(text, "ratelimit_stage", rule="api") == 0
    assert value(text, "ratelimit_remaining_ratio", rule="api") == pytest.approx(2 / 5)
    assert value(text, "ratelimit_deny_events_dropped_total") == 0
    events = lines()
    assert {e["key"] for e in events} == {"{api}:user:alice"}
    assert {(e["rule"], e["level"], e["outcome"], e["limit"]) for e in events} == {
        ("api", "redis", "denied", 5)
    }
    assert {(e["client_ip"], e["user_agent"]) for e in events} == {("127.0.0.1", UA)}
    assert list(events[0]) == [
        "timestamp",
        "key",
        "rule",
        "level",
        "outcome",
        "limit",
        "remaining",
        "retry_after_ms",
        "client_ip",
        "user_agent",
    ]


def test_a_huge_user_agent_is_cut_to_max_header_bytes_at_a_character_boundary(
    server: Server, r: redis.Redis, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A 20,000-byte User-Agent of 2-byte characters, sent as UTF-8 over real
    HTTP: the shipped event's user_agent is a prefix of it, valid UTF-8, at
    most MAX_HEADER_BYTES (the contract's max_header_bytes) long."""
    from redis_ratelimit_client.events import MAX_HEADER_BYTES

    ua = "é" * 10_000
    raw = ua.encode("utf-8")
    assert len(raw) == 20_000
    deny_file = tmp_path / "deny.jsonl"
    app = example(server, monkeypatch, RL_DENY_FILE=str(deny_file))
    with running(serve_asgi(app, lifespan="on")) as web, httpx.Client(base_url=web.base) as http:
        codes = [
            http.get("/", headers={"x-user": "carol", "user-agent": raw}).status_code
            for _ in range(6)
        ]
        assert codes == [200] * 5 + [429]
        wait_until(
            lambda: deny_file.exists() and deny_file.read_bytes().endswith(b"\n"),
            10,
            "the deny event in the file",
        )
    lines = deny_file.read_bytes().splitlines()
    assert len(lines) == 1
    lines[0].decode("utf-8")  # the whole line is valid UTF-8
    event = json.loads(lines[0])
    shipped = event["user_agent"]
    shipped_bytes = shipped.encode("utf-8")  # no lone surrogate: valid UTF-8
    assert 0 < len(shipped_bytes) <= MAX_HEADER_BYTES
    assert raw.startswith(shipped_bytes) and ua.startswith(shipped)
    assert shipped == "é" * (MAX_HEADER_BYTES // 2)  # the longest cut: nothing lost needlessly
    assert (event["key"], event["client_ip"]) == ("{api}:user:carol", "127.0.0.1")


def test_a_hanging_bulk_sink_costs_counts_not_requests(
    server: Server, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    hang = HangingServer()
    try:
        app = example(server, monkeypatch, RL_DENY_BULK=hang.url)
        with (
            running(serve_asgi(app, lifespan="on")) as web,
            httpx.Client(base_url=web.base, timeout=30) as http,
        ):
            assert drive(http, "alice", 6) == [200] * 5 + [429]
            wait_until(lambda: hang.accepted >= 1, 15, "the flusher stuck on the sink")
            # The sink holds its flush; the requests go on, denied at once.
            assert drive(http, "alice", 30) == [429] * 30
            assert not hang.released.is_set()

            def lost() -> float:
                text = http.get("/metrics").text
                if value(text, "ratelimit_deny_events_dropped_total") == 31:
                    return value(text, "ratelimit_deny_events_sink_errors_total")
                return 0

            assert wait_until(lost, 20, "31 events dropped") >= 1
    finally:
        hang.release()


def test_the_flask_example_serves_the_sync_limiters_metrics(
    server: Server, r: redis.Redis, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    deny_file = tmp_path / "deny.jsonl"
    monkeypatch.setenv("RL_DENY_FILE", str(deny_file))
    monkeypatch.setenv("RL_DENY_FLUSH_INTERVAL", "0.2")
    module = load("flask_app", server, monkeypatch)
    with running(serve_wsgi(module.app)) as web, httpx.Client(base_url=web.base) as http:
        codes = [http.get("/checkout", headers={"user-agent": UA}).status_code for _ in range(5)]
        assert codes == [200] * 3 + [429] * 2
        assert http.get("/").status_code == 200  # flask-limiter's routes unchanged
        text = http.get("/metrics").text
    promtool_check(text)
    counts = decisions(text)
    assert counts.pop(("checkout", "redis", "admitted")) == 3
    # The second denial is Redis's or the deny cache's (it remembers 1 s).
    assert set(counts) <= {("checkout", "redis", "denied"), ("checkout", "deny_cache", "denied")}
    assert sum(counts.values()) == 2
    assert value(text, "ratelimit_redis_seconds_count") == 3 + counts.get(
        ("checkout", "redis", "denied"), 0
    )

    def lines() -> list[dict[str, Any]]:
        if not deny_file.exists():
            return []
        return [json.loads(x) for x in deny_file.read_text().splitlines()]

    wait_until(lambda: len(lines()) == 2, 10, "2 deny events in the file")
    assert {(e["key"], e["rule"], e["client_ip"], e["user_agent"]) for e in lines()} == {
        ("rl:checkout:127.0.0.1", "checkout", "127.0.0.1", UA)
    }
    module.events.close()
