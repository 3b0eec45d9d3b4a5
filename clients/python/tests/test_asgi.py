"""The ASGI middleware in a Starlette app under uvicorn, over real HTTP."""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from conftest import FIXED_MS, FIXED_W, Server, running, serve_asgi, wait_until
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from redis_ratelimit_client import (
    Concurrency,
    FixedWindow,
    Policy,
    Sliding,
    TokenBucket,
)
from redis_ratelimit_client.asgi import FallbackMode, RateLimitMiddleware, Rule, header
from redis_ratelimit_client.model import Algorithm


def hello(request: object) -> PlainTextResponse:
    return PlainTextResponse("hello")


def app_with(port: int, rules: list[Rule], **options: object) -> RateLimitMiddleware:
    inner = Starlette(routes=[Route("/", hello)])
    options.setdefault("deadline", 1.0)
    return RateLimitMiddleware(
        inner,
        client=aioredis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1),
        rules=rules,
        key=header("x-user"),
        **options,
    )  # type: ignore[arg-type]


def test_a_denial_is_a_429_with_the_ietf_fields_and_a_problem(
    server: Server, r: redis.Redis
) -> None:
    mw = app_with(server.port, [Rule(Sliding(2, 1000), "per-user")], x_ratelimit_headers=True)
    with running(serve_asgi(mw)) as web, httpx.Client(base_url=web.base) as http:
        before = time.time()
        ok = http.get("/", headers={"x-user": "alice"})
        after = time.time()
        assert ok.status_code == 200 and ok.text == "hello"
        # As flask-limiter and slowapi: the reset as a Unix time, in seconds
        # (the window of 1 s began during the request).
        assert before < int(ok.headers["X-RateLimit-Reset"]) <= math.ceil(after + 1)
        assert ok.headers["RateLimit-Policy"] == '"per-user";q=2;w=1'
        assert re.fullmatch(r'"per-user";r=1;t=[12]', ok.headers["RateLimit"])
        assert ok.headers["X-RateLimit-Limit"] == "2"
        assert "Retry-After" not in ok.headers
        http.get("/", headers={"x-user": "alice"})
        denied = http.get("/", headers={"x-user": "alice"})
        assert denied.status_code == 429
        assert denied.headers["content-type"] == "application/problem+json"
        assert denied.headers["Retry-After"] == "1"
        assert re.fullmatch(r'"per-user";r=0;t=[12]', denied.headers["RateLimit"])
        body = json.loads(denied.text)
        assert body["type"] == "https://iana.org/assignments/http-problem-types#quota-exceeded"
        assert body["status"] == 429 and body["violated-policies"] == ["per-user"]
        assert http.get("/", headers={"x-user": "bob"}).status_code == 200
        missing = http.get("/")
        assert missing.status_code == 400
        assert missing.headers["content-type"] == "application/problem+json"
    assert r.exists("rl:per-user:alice") and r.exists("rl:per-user:bob")


def test_several_rules_go_through_one_all_and_policies_are_read(
    server: Server, r: redis.Redis
) -> None:
    r.execute_command("RL.POLICY", "SET", "global-api", "FIXEDWINDOW", 3, FIXED_MS)
    rules = [
        Rule(TokenBucket(10, 10, 1000), "per-user", key_prefix="{api}:user:"),
        Rule(Policy("global-api"), "global", fixed_key="{api}:global"),
    ]
    mw = app_with(server.port, rules)
    with running(serve_asgi(mw)) as web, httpx.Client(base_url=web.base) as http:
        codes = [http.get("/", headers={"x-user": f"u{i}"}).status_code for i in range(4)]
        assert codes == [200, 200, 200, 429]
        denied = http.get("/", headers={"x-user": "u9"})
        assert denied.headers["RateLimit-Policy"] == (
            f'"per-user";q=10;w=1, "global";q=3;w={FIXED_W}'
        )
        assert denied.headers["RateLimit"].startswith('"global";r=0;t=')
        assert json.loads(denied.text)["violated-policies"] == ["global"]
    # All or nothing: the denied users kept their tokens.
    assert r.execute_command("RL.TOKENBUCKET", "{api}:user:u3", 10, 10, 1000, "COST", 0)[2] == 10


def test_the_deny_cache_answers_without_a_round_trip(server: Server, r: redis.Redis) -> None:
    mw = app_with(server.port, [Rule(FixedWindow(1, FIXED_MS), "per-user")])
    with running(serve_asgi(mw)) as web, httpx.Client(base_url=web.base) as http:
        assert http.get("/", headers={"x-user": "a"}).status_code == 200
        assert http.get("/", headers={"x-user": "a"}).status_code == 429
        calls = mw.stats.redis_calls
        for _ in range(5):
            d = http.get("/", headers={"x-user": "a"})
            assert d.status_code == 429 and int(d.headers["Retry-After"]) >= 1
        assert mw.stats.redis_calls == calls and mw.stats.deny_cache_hits == 5


def run_outage(
    own: Server, mode: FallbackMode
) -> tuple[list[int], list[httpx.Response], RateLimitMiddleware]:
    mw = app_with(
        own.port,
        [Rule(Sliding(4, 60_000), "per-user")],
        fallback=mode,
        instances=2,
        breaker_failures=2,
        breaker_open_for=0.3,
    )
    with running(serve_asgi(mw)) as web, httpx.Client(base_url=web.base) as http:
        assert http.get("/", headers={"x-user": "warm"}).status_code == 200
        own.kill()
        responses = [http.get("/", headers={"x-user": "z"}) for _ in range(5)]
        own.start()
        # The breaker's probe finds Redis again; calls go back to it.
        wait_until(
            lambda: (
                http.get("/", headers={"x-user": "back"}).status_code and mw.stats.probes_ok >= 1
            ),
            10,
            "the breaker to close",
        )
        calls = mw.stats.redis_calls
        assert http.get("/", headers={"x-user": "back2"}).status_code == 200
        assert mw.stats.redis_calls == calls + 1
    return [x.status_code for x in responses], responses, mw


def test_fail_open_admits_while_redis_is_down(own_server: Server) -> None:
    codes, responses, mw = run_outage(own_server, FallbackMode.FAIL_OPEN)
    assert codes == [200] * 5
    # The fields are the account's (a share of 3, counting down), not a full quota.
    remaining = [int(x.headers["RateLimit"].split("r=")[1].split(";")[0]) for x in responses]
    assert remaining == [2, 1, 0, 0, 0]
    assert mw.stats.breaker_opened >= 1 and mw.stats.fallback_admitted >= 5


def test_fail_closed_denies_while_redis_is_down(own_server: Server) -> None:
    codes, responses, mw = run_outage(own_server, FallbackMode.FAIL_CLOSED)
    assert codes == [429] * 5
    assert responses[-1].headers["Retry-After"] == "1"
    assert mw.stats.fallback_denied >= 5


def test_local_only_keeps_the_instance_share(own_server: Server) -> None:
    # 4 per minute over 2 instances: ceil(4 / 2 * 1.1) = 3 here.
    codes, _, mw = run_outage(own_server, FallbackMode.LOCAL_ONLY)
    assert codes == [200, 200, 200, 429, 429]
    assert mw.stats.breaker_skipped >= 1


def gated_app(gate: threading.Event, inside: list[int]) -> Starlette:
    lock = threading.Lock()

    async def slow(request: object) -> PlainTextResponse:
        with lock:
            inside[0] += 1
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, 30)
        return PlainTextResponse("done")

    async def boom(request: object) -> PlainTextResponse:
        raise RuntimeError("the app failed")

    return Starlette(routes=[Route("/slow", slow), Route("/boom", boom), Route("/", hello)])


def test_a_concurrency_rule_caps_requests_in_flight(server: Server, r: redis.Redis) -> None:
    gate, inside = threading.Event(), [0]
    mw = RateLimitMiddleware(
        gated_app(gate, inside),
        client=aioredis.Redis(port=server.port, socket_timeout=1),
        rules=[
            Rule(Sliding(100, 60_000), "per-user"),
            Rule(Concurrency(3, 30_000), "in-flight"),
        ],
        key=header("x-user"),
        deadline=1.0,
    )
    key = "rl:in-flight:alice"
    with running(serve_asgi(mw)) as web, ThreadPoolExecutor(6) as pool:

        def get(path: str) -> httpx.Response:
            with httpx.Client(base_url=web.base, timeout=30) as http:
                return http.get(path, headers={"x-user": "alice"})

        slow = [pool.submit(get, "/slow") for _ in range(6)]
        wait_until(lambda: sum(f.done() for f in slow) == 3 and inside[0] == 3, 20, "3 in, 3 out")
        denied = [f.result() for f in slow if f.done()]
        assert [d.status_code for d in denied] == [429] * 3
        d = denied[0]
        assert d.headers["RateLimit-Policy"] == '"per-user";q=100;w=60, "in-flight";q=3'
        assert d.headers["RateLimit"].startswith('"in-flight";r=0;t=')
        assert 1 <= int(d.headers["Retry-After"]) <= 30
        body = json.loads(d.text)
        assert body["violated-policies"] == ["in-flight"]
        # The same detail as a rate rule's (the contract's vector for concurrency).
        assert body["detail"].startswith('rate limit "in-flight" exceeded; retry after ')
        # The denied requests consumed no rate unit: 3 of 100 used.
        assert r.execute_command("RL.SLIDING", "rl:per-user:alice", 100, 60_000, "COST", 0)[2] == 97
        assert r.execute_command("RL.CONCURRENCY", key, 3, 30_000, "COST", 0)[2] == 0
        gate.set()
        done = [f.result() for f in slow if f.result().status_code == 200]
        assert len(done) == 3 and done[0].text == "done"
        assert done[0].headers["RateLimit-Policy"].endswith('"in-flight";q=3')
        # Every lease released when its response was sent.
        wait_until(
            lambda: r.execute_command("RL.CONCURRENCY", key, 3, 30_000, "COST", 0)[2] == 3,
            10,
            "the leases to be released",
        )
        assert get("/").status_code == 200
        # An app that fails releases its lease too.
        assert get("/boom").status_code == 500
        wait_until(
            lambda: r.execute_command("RL.CONCURRENCY", key, 3, 30_000, "COST", 0)[2] == 3,
            10,
            "the failed request's lease to be released",
        )
    assert mw.stats.leases_released >= 5 and mw.stats.release_errors == 0


def test_a_cancelled_request_releases_its_lease(server: Server, r: redis.Redis) -> None:
    async def go() -> None:
        started = asyncio.Event()

        async def app(scope: object, receive: object, send: object) -> None:
            started.set()
            await asyncio.Event().wait()

        mw = RateLimitMiddleware(
            app,
            client=aioredis.Redis(port=server.port),
            rules=[Rule(Concurrency(1, 30_000), "one")],
            key=lambda scope: "k",
            deadline=1.0,
        )
        sent: list[dict[str, object]] = []

        async def receive() -> dict[str, object]:
            await asyncio.Event().wait()
            return {}

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
        task = asyncio.ensure_future(mw(scope, receive, send))
        await started.wait()
        peek = ["RL.CONCURRENCY", "rl:one:k", 1, 30_000, "COST", 0]
        assert r.execute_command(*peek)[2] == 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert r.execute_command(*peek)[2] == 1
        assert mw.stats.leases_released == 1

    asyncio.run(go())


def test_local_only_caps_in_flight_at_the_instance_share(own_server: Server) -> None:
    gate, inside = threading.Event(), [0]
    mw = RateLimitMiddleware(
        gated_app(gate, inside),
        client=aioredis.Redis(port=own_server.port, socket_timeout=0.3),
        rules=[Rule(Concurrency(4, 30_000), "in-flight")],
        key=header("x-user"),
        deadline=0.3,
        instances=2,  # ceil(4 / 2 * 1.1) = 3 here
        breaker_failures=1,
        breaker_open_for=60,
    )
    with running(serve_asgi(mw)) as web, ThreadPoolExecutor(5) as pool:

        def get(path: str) -> int:
            with httpx.Client(base_url=web.base, timeout=30) as http:
                return http.get(path, headers={"x-user": "z"}).status_code

        assert get("/") == 200  # Redis answered once: the rules are known
        own_server.kill()
        # The first call after the kill is written on an open connection and
        # its answer is lost (it opens the breaker): its lease may exist in
        # Redis, so a unit stays held in the account for lease_ms.
        assert get("/") == 200
        lost = mw.local._held("in-flight", "rl:in-flight:z", time.monotonic())
        assert lost <= 1 and mw.stats.breaker_opened == 1
        admitted = 3 - lost
        slow = [pool.submit(get, "/slow") for _ in range(5)]
        wait_until(
            lambda: sum(f.done() for f in slow) == 5 - admitted and inside[0] == admitted,
            20,
            f"{admitted} in, the others out",
        )
        gate.set()
        assert sorted(f.result() for f in slow) == [200] * admitted + [429] * (5 - admitted)
        assert get("/slow") == 200  # the local units were given back


def test_a_concurrency_policy_rule_takes_leases(server: Server, r: redis.Redis) -> None:
    r.execute_command("RL.POLICY", "SET", "exports", "CONCURRENCY", 1, 30_000)
    gate, inside = threading.Event(), [0]
    mw = RateLimitMiddleware(
        gated_app(gate, inside),
        client=aioredis.Redis(port=server.port, socket_timeout=1),
        rules=[Rule(Policy("exports"), "exports", fixed_key="exports")],
        key=header("x-user"),
        deadline=1.0,
    )
    with running(serve_asgi(mw)) as web, ThreadPoolExecutor(2) as pool:

        def get(path: str) -> httpx.Response:
            with httpx.Client(base_url=web.base, timeout=30) as http:
                return http.get(path, headers={"x-user": "u"})

        first = pool.submit(get, "/slow")
        wait_until(lambda: inside[0] == 1, 20, "the first request inside")
        second = get("/slow")
        assert second.status_code == 429
        assert second.headers["RateLimit-Policy"] == '"exports";q=1'
        gate.set()
        assert first.result().status_code == 200
        wait_until(lambda: get("/").status_code == 200, 10, "the lease back")


@pytest.mark.parametrize(
    "spec",
    [Sliding(5, 1000), FixedWindow(5, 1000), TokenBucket(5, 5, 1000)],
    ids=["sliding", "fixed_window", "token_bucket"],
)
def test_a_one_second_window_says_t_1_right_after_its_first_admission(
    server: Server, r: redis.Redis, spec: Algorithm
) -> None:
    """`t` is `ceil(reset_ms / 1000)`, the draft's delay in whole seconds,
    never shorter than the wait: a window of 1 s that began with this request
    resets within 1 s, so `t=1`, never `t=2` (the server's `reset_ms` never
    exceeds the window). Not the hash window: its units leave at bucket
    boundaries, up to a bucket after the window, and its `t` says so."""
    mw = app_with(server.port, [Rule(spec, "per-user")])
    with running(serve_asgi(mw)) as web, httpx.Client(base_url=web.base) as http:
        for user in ("a", "b", "c"):
            ok = http.get("/", headers={"x-user": user})
            assert ok.status_code == 200
            assert ok.headers["RateLimit"] == '"per-user";r=4;t=1'
            assert ok.headers["RateLimit-Policy"] == '"per-user";q=5;w=1'


def test_an_error_reply_is_decided_by_the_fallback_and_charges_nothing(
    server: Server, r: redis.Redis
) -> None:
    """An error reply (here WRONGTYPE: the rule's key holds a string) is an
    answer: Redis applied nothing, so the account is not charged for it, and
    the fallback decides the request (it was a 500)."""
    r.set("rl:per-user:z", "not a limiter")
    mw = app_with(
        server.port,
        [Rule(Sliding(4, 60_000), "per-user")],
        instances=2,  # a share of 3
        breaker_failures=100,
    )
    with running(serve_asgi(mw)) as web, httpx.Client(base_url=web.base) as http:
        codes = [http.get("/", headers={"x-user": "z"}).status_code for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]
    assert mw.stats.redis_errors == 5 and mw.stats.fallback_admitted == 3
    # The account holds the 3 units the fallback admitted, not the 5 calls.
    assert mw.local._log("per-user", "rl:per-user:z", Sliding(4, 60_000), time.time()).total == 3
