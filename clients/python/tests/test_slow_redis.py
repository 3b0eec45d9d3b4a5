"""Redis slow for short spells while one key is under a burst: the middleware
with its defaults never admits more than the bound of docs/clients.md.

One instance of N admits at most max(limit, s) units for one key in a window,
s = ceil(limit / N * 1.1) its share: every unit Redis admitted for it, and
every unit of a call whose answer was lost, is charged to its account, and the
local-only fallback admits only what that account still has. A fallback that
counted from zero (before) admitted s more on top of what Redis had admitted.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from conftest import Server, running, serve_asgi, wait_until
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from redis_ratelimit_client import Sliding, TokenBucket
from redis_ratelimit_client.asgi import LocalLimiter, RateLimitMiddleware, Rule, header
from redis_ratelimit_client.model import Algorithm

LIMIT = 5
INSTANCES = 2
SHARE = 3  # ceil(5 / 2 * 1.1)
#: One instance's bound for one key: max(limit, share).
BOUND = max(LIMIT, SHARE)

# Neither can turn over during the test: the bucket refills one unit an hour,
# and a window of 2^40 ms (the largest the module takes; its account's fixed
# window too) has its next boundary in 2039.
RULES: list[Algorithm] = [TokenBucket(LIMIT, 1, 3_600_000), Sliding(LIMIT, 1 << 40)]


def hello(request: object) -> PlainTextResponse:
    return PlainTextResponse("hello")


@pytest.fixture
def ctl(own_server: Server) -> Iterator[redis.Redis]:
    c = own_server.client()
    yield c
    c.close()


def statuses(base: str, n: int) -> list[int]:
    """n requests of one user at once."""

    def get(_: int) -> int:
        with httpx.Client(base_url=base, timeout=30) as http:
            return http.get("/", headers={"x-user": "burst"}).status_code

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(get, range(n)))


@pytest.mark.parametrize("spec", RULES, ids=["token_bucket", "sliding"])
def test_slow_spells_never_admit_more_than_the_bound(
    own_server: Server, ctl: redis.Redis, spec: Algorithm
) -> None:
    mw = RateLimitMiddleware(  # the defaults: deadline, fallback, breaker
        Starlette(routes=[Route("/", hello)]),
        client=aioredis.Redis(port=own_server.port),
        rules=[Rule(spec, "per-user")],
        key=header("x-user"),
        instances=INSTANCES,
    )
    codes: list[int] = []
    with running(serve_asgi(mw)) as web:
        codes += statuses(web.base, 1) + statuses(web.base, 1) + statuses(web.base, 2)
        assert codes == [200] * 4  # Redis admitted 4 of 5 for this instance
        for _ in range(2):
            # A spell: writes wait in Redis until the burst has been answered.
            ctl.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")
            codes += statuses(web.base, 6)
            ctl.execute_command("CLIENT", "UNPAUSE")
            codes += statuses(web.base, 2)
        # A spell of the whole server: DEBUG SLEEP, with a burst behind it.
        sleeper = threading.Thread(target=ctl.execute_command, args=("DEBUG", "SLEEP", "0.5"))
        sleeper.start()
        codes += statuses(web.base, 6)
        sleeper.join()

        def back_in_use() -> bool:
            # An open breaker probes Redis on a request once its time is up,
            # so the wait sends requests; each counts against the bound too.
            if mw.stats.probes_ok or not mw._open:
                return True
            codes.extend(statuses(web.base, 1))
            return False

        wait_until(back_in_use, 10, "Redis back in use")
        codes += statuses(web.base, 3)
    # The spells sent requests to the fallback: by a missed deadline, or by
    # the breaker that the misses opened.
    fallback = mw.stats.fallback_admitted + mw.stats.fallback_denied
    assert mw.stats.redis_timeouts >= 1 and fallback >= 6, (mw.stats, codes)
    assert codes.count(200) <= BOUND, f"{codes.count(200)} admitted against {LIMIT}: {codes}"


def test_lifespan_startup_opens_and_checks_a_connection(server: Server, r: redis.Redis) -> None:
    before = r.info("commandstats").get("cmdstat_module|list", {}).get("calls", 0)
    mw = RateLimitMiddleware(
        Starlette(routes=[Route("/", hello)]),
        client=aioredis.Redis(port=server.port),
        rules=[Rule(Sliding(5, 1000), "per-user")],
        key=header("x-user"),
    )
    with running(serve_asgi(mw, lifespan="on")) as web:
        # Serving: the start-up has run, before any request.
        assert mw._ready
        assert r.info("commandstats")["cmdstat_module|list"]["calls"] == before + 1
        pool = mw.client.redis.connection_pool
        assert len(pool._available_connections) >= 1  # type: ignore[attr-defined]
        with httpx.Client(base_url=web.base) as http:
            assert http.get("/", headers={"x-user": "a"}).status_code == 200
    assert mw.stats.redis_timeouts == 0


def test_lifespan_startup_fails_clearly_without_the_module(plain_server: Server) -> None:
    mw = RateLimitMiddleware(
        Starlette(routes=[Route("/", hello)]),
        client=aioredis.Redis(port=plain_server.port),
        rules=[Rule(Sliding(5, 1000), "per-user")],
        key=header("x-user"),
    )
    sent: list[dict[str, object]] = []

    async def lifespan() -> None:
        messages = [{"type": "lifespan.startup"}]

        async def receive() -> dict[str, object]:
            return messages.pop(0) if messages else {"type": "lifespan.shutdown"}

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        with pytest.raises(Exception, match="not loaded"):
            await mw({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)

    asyncio.run(lifespan())
    assert sent[0]["type"] == "lifespan.startup.failed"
    assert str(plain_server.port) in str(sent[0]["message"])


def test_a_sliding_rules_account_turns_over_with_the_rule() -> None:
    """The account of a sliding window is a sliding log of what was charged:
    units Redis admitted just before a fixed boundary of the window's length
    still fill the account after it (a fixed-window account started afresh
    there, and the fallback admitted its share on top within one window)."""
    local = LocalLimiter()
    spec, share = Sliding(LIMIT, 1000), SHARE
    t = 1_800_000_000.75  # 250 ms before a boundary of 1 s windows
    for _ in range(LIMIT):  # Redis admitted 5 for this instance
        local.charge("r", "k", spec, share, t)
    assert not local.has_room("r", "k", spec, share, t + 0.5)
    d = local.denial("r", "k", spec, share, t + 0.5)
    assert (d.allowed, d.limit, d.remaining, d.wait_ms) == (False, LIMIT, 0, 500)
    assert local.has_room("r", "k", spec, share, t + 1.0)  # the window has slid past them
    # Debt is bounded: at most 2 x share units are kept, the newest.
    for _ in range(100):
        local.charge("r", "k", spec, share, t + 1.0)
    assert local._log("r", "k", spec, t + 1.0).total == 2 * share
    assert local.has_room("r", "k", spec, share, t + 2.0)
