"""The protection loop end to end: two instances of the example service
(`examples/asgi_middleware.py`, each its own client, limiter, protection
loop, breaker and backend) served by uvicorn over real HTTP, sharing one
redis-server with the module. Conditions are polled with a deadline."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import httpx
import pytest
import redis
from conftest import Server, ThreadServer, running, serve_asgi, wait_until

from redis_ratelimit_client import PolicyStats
from redis_ratelimit_client.asgi import RateLimitMiddleware

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "asgi_middleware.py"


def load_example(server: Server, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("RL_REDIS", f"127.0.0.1:{server.port}")
    for name, value in {
        "RL_REPORT_INTERVAL": "0.2",
        "RL_STAGE_POLL": "0.1",
        "RL_STAGE_HOLD": "2",
        "RL_DEADLINE": "0.5",
        "INSTANCES": "2",
    }.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("example_protection", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Instance:
    def __init__(self, app: Any, web: ThreadServer) -> None:
        self.app = app
        self.web = web
        self.http = httpx.Client(base_url=web.base, timeout=5)

    def get(self, path: str, user: str) -> httpx.Response:
        return self.http.get(path, headers={"x-user": user})

    def state(self) -> dict[str, Any]:
        return self.http.get("/protection").json()  # type: ignore[no-any-return]

    def fail_every(self, n: int) -> None:
        assert self.http.post(f"/backend?fail_every={n}").status_code == 200

    @property
    def middleware(self) -> RateLimitMiddleware:
        """The app's rate-limit middleware (built with its first request)."""
        m = self.app.middleware_stack
        while not isinstance(m, RateLimitMiddleware):
            m = m.app
        return m


@contextlib.contextmanager
def two_instances(server: Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Instance]]:
    module = load_example(server, monkeypatch)
    instances = [
        Instance(app, serve_asgi(app, lifespan="on"))
        for app in (module.create_app(), module.create_app())
    ]
    try:
        yield instances
    finally:
        for i in instances:
            i.http.close()
            i.web.stop()
    # The app's shutdown stopped the loop (and uvicorn did not wait for it).
    for i in instances:
        assert not i.web.thread.is_alive() and not i.app.state.protection.running


@contextlib.contextmanager
def traffic(step: Callable[[int], None]) -> Iterator[threading.Event]:
    """Runs `step(n)` for n = 0, 1, ... in a thread until the block ends."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        for n in itertools.count():
            if stop.is_set():
                return
            try:
                step(n)
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)
                return
            time.sleep(0.003)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield stop
    finally:
        stop.set()
        t.join(10)
    assert not errors, errors


def server_stats(r: redis.Redis) -> PolicyStats:
    return PolicyStats.from_reply(r.execute_command("RL.POLICY", "STATS", "api"))


def set_policy(r: redis.Redis, spec: str) -> None:
    r.execute_command("RL.POLICY", "SET", "api", *spec.split())


def test_errors_of_the_backend_lower_the_scale_on_both_instances_and_the_replica(
    server: Server, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_policy(
        r, "TOKENBUCKET 1000 1000 1000 ADAPT ERRORS 5 FACTOR 80 RECOVER 20 WINDOW 1000 MINCALLS 20"
    )
    replica = Server(args=["--replicaof", "127.0.0.1", str(server.port)])
    try:
        rr = replica.client()
        wait_until(lambda: rr.info("replication")["master_link_status"] == "up", 10, "the replica")
        with two_instances(server, monkeypatch) as (a, b):
            for i in (a, b):
                i.fail_every(10)  # every 10th backend call fails: a 503, an error
            codes: list[int] = []

            def step(n: int) -> None:
                codes.append((a, b)[n % 2].get("/", "alice").status_code)

            with traffic(step):
                # The first scale below 100 that a sees is 80: one window's decrease.
                seen = wait_until(
                    lambda: [s for s in (a.state()["scale"],) if s < 100], 10, "a drop"
                )
                assert seen == [80]
                wait_until(lambda: b.state()["scale"] <= 80, 5, "the drop on b")
                wait_until(
                    lambda: server_stats(rr).scale == server_stats(r).scale < 100,
                    5,
                    "the replica's scale",
                )
                for i in (a, b):
                    i.fail_every(0)
                low = min(a.state()["scale"], b.state()["scale"])
                wait_until(lambda: a.state()["scale"] == b.state()["scale"] == 100, 20, "recovery")
                wait_until(lambda: server_stats(rr).scale == 100, 5, "the replica recovered")
            assert low < 100
            assert set(codes) <= {200, 503} and codes.count(503) > 0
            # Outcomes went out in the background: a report per interval, not per request.
            sent = a.app.state.protection.stats.reports_sent
            assert 0 < sent < codes.count(200) / 4
    finally:
        replica.stop()


def test_a_flood_moves_the_stage_to_1_then_2_and_back_one_step_per_window(
    server: Server, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 10 per user, then one a minute: a user past 10 is denied at every call,
    # mostly from each instance's deny cache (the default, 1 s at most), whose
    # denials go to the server with the reports (DENIED n).
    set_policy(r, "TOKENBUCKET 10 1 60000 STAGES 30 50 WINDOW 1000")
    with two_instances(server, monkeypatch) as (a, b):
        for _ in range(10):
            assert a.get("/", "flooder").status_code == 200
        fresh = itertools.count()

        def mixed(n: int) -> None:
            # 3 admitted (fresh users), 2 denied (the flooder): 40 % denied.
            inst = (a, b)[n % 2]
            user = "flooder" if n % 5 < 2 else f"user-{next(fresh)}"
            inst.get("/", user)

        with traffic(mixed):
            wait_until(lambda: a.state()["stage"] == b.state()["stage"] == 1, 10, "stage 1")
            # A non-core route degrades without a call to Redis (no key is made for the user).
            res = a.get("/recommendations", "probe")
            assert res.status_code == 200 and res.json() == {
                "recommendations": [],
                "degraded": True,
            }
            assert r.exists("{api}:user:probe") == 0
            # Core routes still go to Redis; the breaker is closed at stage 1.
            assert a.state()["breaker"] == "closed"
            assert a.get("/", "core-user").status_code == 200 and r.exists("{api}:user:core-user")

        def flood(n: int) -> None:
            (a, b)[n % 2].get("/", "flooder")

        with traffic(flood):
            wait_until(lambda: a.state()["stage"] == b.state()["stage"] == 2, 10, "stage 2")
            assert a.state()["breaker"] == b.state()["breaker"] == "forced_open"
            # The breaker spares the backend: a core route admitted answers its default.
            assert a.get("/", "someone").json() == {"hello": "world", "served": "default"}
            assert b.get("/recommendations", "probe").json()["degraded"] is True
        # The flood was answered mostly without the server, and still counted there.
        for i in (a, b):
            stats = i.middleware.stats
            assert stats.deny_cache_hits > 2 * stats.redis_denied, stats
            assert i.app.state.protection.stats.denied_sent > 0

        # The flood stops: one step down per window; the breaker closes below 2.
        seen: list[tuple[int, str]] = []

        def recovered() -> bool:
            s = a.state()
            if not seen or seen[-1] != (s["stage"], s["breaker"]):
                seen.append((s["stage"], s["breaker"]))
            return bool(s["stage"] == 0)

        wait_until(recovered, 10, "stage 0")
        assert seen[0] == (2, "forced_open") or seen[0] == (1, "closed")
        assert (1, "closed") in seen and seen[-1] == (0, "closed")
        assert [st for st, _ in seen] == sorted((st for st, _ in seen), reverse=True)
        wait_until(lambda: b.state()["stage"] == 0, 5, "stage 0 on b")
        res = a.get("/recommendations", "probe")
        assert res.json()["degraded"] is False and r.exists("{api}:user:probe") == 1


def test_a_denial_on_a_route_with_a_degrade_handler_answers_the_handler(
    server: Server, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_policy(r, "TOKENBUCKET 2 1 60000")
    with two_instances(server, monkeypatch) as (a, b):
        answers = [a.get("/recommendations", "bob") for _ in range(2)]
        assert [x.json()["degraded"] for x in answers] == [False, False]
        denied = b.get("/recommendations", "bob")
        assert denied.status_code == 200
        assert denied.json() == {"recommendations": [], "degraded": True}
        # A route without a handler answers the 429.
        core = b.get("/", "bob")
        assert core.status_code == 429 and "Retry-After" in core.headers


def test_reports_stay_off_the_request_path_while_redis_is_away(
    own_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = own_server.client()
    spec = "TOKENBUCKET 1000 1000 1000 STAGES 30 50 WINDOW 86400000"
    set_policy(r, spec)
    with two_instances(own_server, monkeypatch) as (a, b):
        protection = a.app.state.protection
        assert a.get("/", "alice").status_code == 200
        wait_until(lambda: protection.stats.reports_sent > 0, 5, "a report")
        own_server.kill()
        failed = protection.stats.reports_failed
        started = time.monotonic()
        codes = [a.get("/", "alice").status_code for _ in range(30)]
        # The fallback answers at once: no request waits for a report.
        assert codes == [200] * 30 and time.monotonic() - started < 10
        # The failed counts are dropped, not kept for later: nothing grows.
        wait_until(lambda: protection.stats.lost_ok >= 30, 5, "the counts dropped")
        assert protection.stats.reports_failed > failed and protection.pending() == {}
        own_server.start()
        r = own_server.client()
        set_policy(r, spec)
        sent = protection.stats.reports_sent

        def answered() -> bool:
            a.get("/", "alice")
            return bool(protection.stats.reports_sent > sent)

        wait_until(answered, 10, "reports again")
        # Only what came after the restart was counted: the lost counts never came back.
        s = server_stats(r)
        assert 0 < s.current.ok + s.last.ok < 30


# -- the middleware's outcomes, routes and predicate -----------------------------


def outcome_app(server: Server, **options: Any) -> tuple[Any, Any]:
    """A Starlette app behind the middleware, with a protection loop whose
    reports never come (its counts stay pending, to read)."""
    import asyncio

    import redis.asyncio as aioredis
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from redis_ratelimit_client import AsyncProtection, Policy, Sliding
    from redis_ratelimit_client.asgi import RateLimitMiddleware, RouteOptions, Rule, header

    async def ok(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def teapot(request: object) -> PlainTextResponse:
        return PlainTextResponse("teapot", status_code=418)

    async def broken(request: object) -> PlainTextResponse:
        return PlainTextResponse("broken", status_code=502)

    async def raises(request: object) -> PlainTextResponse:
        raise RuntimeError("the handler failed")

    async def slow(request: object) -> PlainTextResponse:
        await asyncio.sleep(5)
        return PlainTextResponse("late")

    inner = Starlette(
        routes=[
            Route(p, h)
            for p, h in [
                ("/ok", ok),
                ("/teapot", teapot),
                ("/broken", broken),
                ("/raises", raises),
                ("/slow", slow),
                ("/extra", ok),
                ("/health", ok),
            ]
        ]
    )
    client = aioredis.Redis(port=server.port, socket_timeout=1)
    protection = AsyncProtection(client, ["api"], report_interval=3600, stage_poll=0.1)
    mw = RateLimitMiddleware(
        inner,
        client=client,
        rules=[
            Rule(Policy("api"), "api", key_prefix="{o}:"),
            Rule(Sliding(1000, 1000), "inline", key_prefix="{o}:i:"),
        ],
        key=header("x-user"),
        deadline=1.0,
        protection=protection,
        routes=[RouteOptions("/extra", core=False), RouteOptions("/health", limited=False)],
        **options,
    )
    return mw, protection


def test_outcomes_are_counted_for_the_policy_rules_5xx_exception_and_timeout(
    server: Server, r: redis.Redis
) -> None:
    set_policy(r, "TOKENBUCKET 1000 1000 1000 STAGES 30 50")
    mw, protection = outcome_app(server, timeout=0.3)
    with running(serve_asgi(mw)) as web, httpx.Client(base_url=web.base) as http:
        # A connection each: uvicorn closes one after an exception of the app.
        get = lambda p: httpx.get(web.base + p, headers={"x-user": "u"}).status_code  # noqa: E731
        assert [get(p) for p in ("/ok", "/teapot", "/broken", "/raises", "/slow")] == [
            200,
            418,
            502,
            500,
            504,
        ]
        # Only the policy rule reports: one ok per success, one error per failure
        # (counted once the app is done, which may be after the answer is sent).
        wait_until(lambda: protection.pending() == {"api": (2, 3, 0)}, 5, "the outcomes")
        assert http.get("/health").status_code == 200  # not limited, not counted
        assert protection.pending() == {"api": (2, 3, 0)}


def test_the_error_predicate_is_configurable(server: Server, r: redis.Redis) -> None:
    set_policy(r, "TOKENBUCKET 1000 1000 1000 STAGES 30 50")
    mw, protection = outcome_app(
        server, is_error=lambda status, exc: exc is not None or status in (418, 502)
    )
    with running(serve_asgi(mw)) as web, httpx.Client(base_url=web.base) as http:
        for p in ("/ok", "/teapot", "/broken"):
            http.get(p, headers={"x-user": "u"})
        wait_until(lambda: protection.pending() == {"api": (1, 2, 0)}, 5, "the outcomes")


def test_a_non_core_route_without_a_handler_answers_429_at_stage_1_without_redis(
    server: Server, r: redis.Redis
) -> None:
    set_policy(r, "TOKENBUCKET 2 1 60000 STAGES 30 50 WINDOW 1000")
    mw, protection = outcome_app(server)
    with running(serve_asgi(mw)) as web, httpx.Client(base_url=web.base) as http:
        assert http.get("/extra", headers={"x-user": "first"}).status_code == 200
        for _ in range(10):
            r.execute_command("RL.HIT", "api", "{o}:flooder")
        wait_until(lambda: protection.stage("api") >= 1, 5, "stage 1 or 2")
        res = http.get("/extra", headers={"x-user": "probe"})
        assert res.status_code == 429 and res.headers["content-type"] == "application/problem+json"
        assert "Retry-After" in res.headers and "q=2" in res.headers["RateLimit-Policy"]
        assert r.exists("{o}:probe") == 0  # no call to Redis
        assert mw.degraded["stage_429"] == 1


def test_a_closed_protection_is_not_started_again_by_a_late_request(
    server: Server, r: redis.Redis
) -> None:
    import asyncio

    set_policy(r, "TOKENBUCKET 1000 1000 1000 STAGES 30 50")
    mw, protection = outcome_app(server)

    async def run() -> None:
        events = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return next(events)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async def lifespan_app(scope: Any, receive: Any, send: Any) -> None:
            await receive()
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})

        mw.app, inner = lifespan_app, mw.app
        await mw({"type": "lifespan"}, receive, send)
        assert not protection.running
        mw.app = inner
        # A request that arrives while the server shuts down.
        scope = {
            "type": "http",
            "method": "GET",
            "path": "/ok",
            "headers": [(b"x-user", b"late")],
        }

        async def no_body() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        await mw(scope, no_body, send)
        restarted = protection.running  # its task would run (and poll) with nobody to stop it
        await protection.aclose()
        assert not restarted

    asyncio.run(run())
