"""The ASGI middleware in a Starlette app under uvicorn, over real HTTP."""

from __future__ import annotations

import json
import re

import httpx
import redis
import redis.asyncio as aioredis
from conftest import Server, running, serve_asgi, wait_until
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from redis_ratelimit import FixedWindow, Policy, Sliding, TokenBucket
from redis_ratelimit.asgi import FallbackMode, RateLimitMiddleware, Rule, header


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
        ok = http.get("/", headers={"x-user": "alice"})
        assert ok.status_code == 200 and ok.text == "hello"
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
    r.execute_command("RL.POLICY", "SET", "global-api", "FIXEDWINDOW", 3, 60_000)
    rules = [
        Rule(TokenBucket(10, 10, 1000), "per-user", key_prefix="{api}:user:"),
        Rule(Policy("global-api"), "global", fixed_key="{api}:global"),
    ]
    mw = app_with(server.port, rules)
    with running(serve_asgi(mw)) as web, httpx.Client(base_url=web.base) as http:
        codes = [http.get("/", headers={"x-user": f"u{i}"}).status_code for i in range(4)]
        assert codes == [200, 200, 200, 429]
        denied = http.get("/", headers={"x-user": "u9"})
        assert denied.headers["RateLimit-Policy"] == ('"per-user";q=10;w=1, "global";q=3;w=60')
        assert denied.headers["RateLimit"].startswith('"global";r=0;t=')
        assert json.loads(denied.text)["violated-policies"] == ["global"]
    # All or nothing: the denied users kept their tokens.
    assert r.execute_command("RL.TOKENBUCKET", "{api}:user:u3", 10, 10, 1000, "COST", 0)[2] == 10


def test_the_deny_cache_answers_without_a_round_trip(server: Server, r: redis.Redis) -> None:
    mw = app_with(server.port, [Rule(FixedWindow(1, 60_000), "per-user")])
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
    codes, _, mw = run_outage(own_server, FallbackMode.FAIL_OPEN)
    assert codes == [200] * 5
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
