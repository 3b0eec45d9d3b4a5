"""Calendar quotas (`RL.QUOTA`): the typed calls (sync and asyncio) in UTC, a
fixed offset and an IANA zone; arguments checked before sending, naming what
is wrong; quota policies (in a zone too) through `RL.HIT` and `RL.ALL`,
inline quotas in `RL.ALL` (UTC); the
`Quota` rule in the ASGI middleware (`w` = the period's nominal seconds) and
its local fallback's calendar."""

from __future__ import annotations

import asyncio
import datetime
import json
import time

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from conftest import Server, running, serve_asgi, wait_until
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from redis_ratelimit_client import (
    AsyncClient,
    Client,
    InvalidArgument,
    Period,
    Policy,
    PolicyMode,
    Quota,
    ServerError,
    Sliding,
)
from redis_ratelimit_client.asgi import LocalLimiter, RateLimitMiddleware, Rule, header
from redis_ratelimit_client.request import Request

UTC = datetime.timezone.utc


def to_end(period: str, offset_s: int) -> int:
    """Seconds from now to the end of the day or ISO week at `offset_s` east of UTC."""
    now = int(time.time())
    day = (now + offset_s) // 86_400
    nxt = day + 1 if period == "DAY" else day + 7 - (day + 3) % 7
    return nxt * 86_400 - offset_s - now


def near_end(got_ms: int, *ends: int) -> bool:
    return any((e - 2) * 1000 <= got_ms <= (e + 1) * 1000 for e in ends)


#: Every calendar period these tests count in. A count read across a
#: period's end starts again, so no test runs within 2 minutes of one's end.
PERIODS = [
    Quota(1, "DAY"),  # also the ends of UTC weeks, months and years
    Quota(1, "DAY", "+05:30"),
    Quota(1, "DAY", "Asia/Tokyo"),
    Quota(1, "DAY", "Europe/Paris"),
    Quota(1, "WEEK", "America/New_York"),
    Quota(1, "WEEK", "Europe/Paris"),
]
ROOM_S = 120


@pytest.fixture(autouse=True)
def clear_of_period_ends() -> None:
    """Polls until every period above has `ROOM_S` left: a wait of at most
    2 minutes, near one of the few period ends of a day."""

    def room() -> float:
        now = time.time()
        return min(q.period_end(now) - now for q in PERIODS)

    wait_until(lambda: room() >= ROOM_S, ROOM_S + 30, "2 minutes before any period ends")


@pytest.fixture
def c(r: redis.Redis) -> Client:
    return Client(r)


def test_the_typed_call_counts_per_calendar_period_in_a_zone(c: Client, r: redis.Redis) -> None:
    d = c.quota("q:utc", 3, "DAY", request=Request.cost(2))
    assert (d.allowed, d.limit, d.remaining, d.wait_ms) == (True, 3, 1, 0)
    assert near_end(d.reset_ms, to_end("DAY", 0)), d
    assert near_end(r.pttl("q:utc"), to_end("DAY", 0))
    denied = c.quota("q:utc", 3, Period.DAY, request=Request.cost(2))
    assert not denied.allowed and denied.remaining == 1
    assert near_end(denied.wait_ms, to_end("DAY", 0)), denied
    assert c.quota("q:utc", 3, "day", request=Request.cost(4)).never
    assert c.quota("q:utc", 3, "DAY", request=Request.refund(2)).remaining == 3

    d = c.quota("q:ist", 10, "DAY", "+05:30")
    assert d.allowed and d.remaining == 9
    assert near_end(d.reset_ms, to_end("DAY", 19_800)), d
    d = c.quota("q:ny", 10, Period.WEEK, "America/New_York")
    assert d.allowed and d.remaining == 9
    # New York is 5 hours behind UTC in winter, 4 in summer.
    assert near_end(d.reset_ms, to_end("WEEK", -5 * 3600), to_end("WEEK", -4 * 3600)), d
    assert c.quota("q:m", 5, "MONTH", "UTC").reset_ms <= 31 * 86_400_000
    assert c.quota("q:y", 5, "YEAR").reset_ms <= 366 * 86_400_000


def test_the_asyncio_form(server: Server, r: redis.Redis) -> None:
    async def go() -> None:
        ac = AsyncClient(aioredis.Redis(port=server.port))
        d = await ac.quota("aq", 2, "WEEK", "Europe/Paris", Request.cost(2))
        assert d.allowed and d.remaining == 0
        d = await ac.quota("aq", 2, "WEEK", "Europe/Paris")
        assert not d.allowed and d.retry_after > 0
        await ac.policy_set("weekly", Quota(5, "WEEK"))
        assert (await ac.hit("weekly", "u")).remaining == 4
        await ac.redis.aclose()

    asyncio.run(go())


def test_bad_limits_periods_and_zones_are_refused_before_sending(c: Client, r: redis.Redis) -> None:
    before = r.info("commandstats").get("cmdstat_rl.quota", {}).get("calls", 0)
    with pytest.raises(InvalidArgument, match="^limit must be"):
        c.quota("q", 0, "DAY")
    with pytest.raises(InvalidArgument, match="^period must be one of DAY, WEEK, MONTH, YEAR"):
        c.quota("q", 5, "FORTNIGHT")  # type: ignore[arg-type]
    for zone in ["+26:00", "+05:60", "05:30", "", "../etc/passwd", "/etc/localtime", "Paris x"]:
        with pytest.raises(InvalidArgument, match="^zone: TZ must be UTC, a fixed offset"):
            c.quota("q", 5, "DAY", zone)
    with pytest.raises(InvalidArgument, match="^limit"):
        c.quota("q", True, "DAY")  # type: ignore[arg-type]
    after = r.info("commandstats").get("cmdstat_rl.quota", {}).get("calls", 0)
    assert after == before, "nothing was sent"
    # A well-formed name the server does not know: the server's error.
    with pytest.raises(ServerError, match="TZ must be UTC"):
        c.quota("q", 5, "DAY", "Mars/Olympus_Mons")
    assert Quota(5, "day", "utc") == Quota(5, Period.DAY)


def test_quota_policies_go_through_rl_hit_and_quotas_through_rl_all(
    c: Client, r: redis.Redis
) -> None:
    c.policy_set("daily", Quota(2, "DAY"), PolicyMode.ENFORCE)
    info = c.policy_get("daily")
    assert info is not None and info["algorithm"] == "QUOTA" and info["params"] == [2, "DAY"]
    assert [c.hit("daily", "u1").remaining for _ in range(2)] == [1, 0]
    denied = c.hit("daily", "u1")
    assert not denied.allowed and near_end(denied.wait_ms, to_end("DAY", 0))
    # A policy keeps its zone (TZ among its options): RL.HIT counts in it.
    c.policy_set("tokyo", Quota(2, "DAY", "Asia/Tokyo"))
    info = c.policy_get("tokyo")
    assert info is not None and info["zone"] == "Asia/Tokyo" and info["params"] == [2, "DAY"]
    d = c.hit("tokyo", "t1", Request.cost(2))
    assert d.allowed and near_end(d.reset_ms, to_end("DAY", 9 * 3600)), d

    weekly, burst = Quota(3, "WEEK"), Sliding(10, 60_000)
    assert c.all([("a:w", weekly), ("a:s", burst)], Request.cost(3)).remaining == 0
    d = c.all([("a:s", burst), ("a:w", weekly)])
    assert (d.allowed, d.denied_by) == (False, 1)
    assert near_end(d.wait_ms, to_end("WEEK", 0)), d
    d = c.all([("a:s", burst), ("u1", Policy("daily"))])
    assert (d.allowed, d.denied_by) == (False, 1)
    d = c.all([("a:s", burst), ("t1", Policy("tokyo"))])
    assert (d.allowed, d.denied_by) == (False, 1)
    assert near_end(d.wait_ms, to_end("DAY", 9 * 3600)), d
    # Inline specs of RL.ALL count in UTC: a zoned inline quota is refused.
    with pytest.raises(InvalidArgument, match=r"^zone: RL.ALL \(spec 1\) counts a quota in UTC"):
        c.all([("a:t", Quota(2, "DAY", "+09:00")), ("a:s", burst)])


def hello(request: object) -> PlainTextResponse:
    return PlainTextResponse("hello")


def app_with(port: int, rules: list[Rule]) -> RateLimitMiddleware:
    return RateLimitMiddleware(
        Starlette(routes=[Route("/", hello)]),
        client=aioredis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1),
        rules=rules,
        key=header("x-user"),
        deadline=1.0,
    )


def test_a_quota_rule_in_the_middleware_answers_429_until_the_period_ends(
    server: Server, r: redis.Redis
) -> None:
    rules = [Rule(Quota(2, "DAY"), "daily"), Rule(Sliding(100, 1000), "burst")]
    with running(serve_asgi(app_with(server.port, rules))) as web:
        with httpx.Client(base_url=web.base) as http:
            for _ in range(2):
                ok = http.get("/", headers={"x-user": "ann"})
                assert ok.status_code == 200
                policy = ok.headers["RateLimit-Policy"]
                assert policy == '"daily";q=2;w=86400, "burst";q=100;w=1'
            denied = http.get("/", headers={"x-user": "ann"})
            assert denied.status_code == 429
            end = to_end("DAY", 0)
            assert end - 2 <= int(denied.headers["Retry-After"]) <= end + 1
            assert json.loads(denied.text)["violated-policies"] == ["daily"]
            assert http.get("/", headers={"x-user": "bob"}).status_code == 200

    # A zoned quota on its own: RL.QUOTA ... TZ; a policy quota read for its w.
    r.execute_command("RL.POLICY", "SET", "monthly", "QUOTA", 9, "MONTH")
    r.execute_command("RL.POLICY", "SET", "paris", "QUOTA", 1, "DAY", "TZ", "Europe/Paris")
    rules = [Rule(Quota(1, "WEEK", "Europe/Paris"), "weekly")]
    with running(serve_asgi(app_with(server.port, rules))) as web:
        with httpx.Client(base_url=web.base) as http:
            ok = http.get("/", headers={"x-user": "ann"})
            assert ok.status_code == 200
            assert ok.headers["RateLimit-Policy"] == '"weekly";q=1;w=604800'
            assert http.get("/", headers={"x-user": "ann"}).status_code == 429
    assert r.exists("rl:weekly:ann")
    with running(serve_asgi(app_with(server.port, [Rule(Policy("monthly"), "m")]))) as web:
        with httpx.Client(base_url=web.base) as http:
            ok = http.get("/", headers={"x-user": "ann"})
            assert ok.headers["RateLimit-Policy"] == '"m";q=9;w=2592000'
    # A zoned policy beside another rule: one RL.ALL, counted in Paris.
    rules = [Rule(Policy("paris"), "paris"), Rule(Sliding(100, 1000), "b")]
    with running(serve_asgi(app_with(server.port, rules))) as web:
        with httpx.Client(base_url=web.base) as http:
            assert http.get("/", headers={"x-user": "ann"}).status_code == 200
            denied = http.get("/", headers={"x-user": "ann"})
            assert denied.status_code == 429
            assert denied.headers["RateLimit-Policy"] == '"paris";q=1;w=86400, "b";q=100;w=1'

    # Beside another rule it would go in RL.ALL, which counts in UTC: refused.
    msg = "^zone: a quota in 'Europe/Paris' beside other rules"
    with pytest.raises(InvalidArgument, match=msg):
        app_with(
            server.port,
            [Rule(Quota(1, "WEEK", "Europe/Paris"), "w"), Rule(Sliding(100, 1000), "b")],
        )


def ts(*args: int, tz: datetime.tzinfo = UTC) -> float:
    return datetime.datetime(*args, tzinfo=tz).timestamp()  # type: ignore[misc]


def test_the_local_calendar_across_daylight_saving_months_and_weeks() -> None:
    import zoneinfo

    ny = zoneinfo.ZoneInfo("America/New_York")
    day = Quota(1, "DAY", "America/New_York")
    # 2026-03-08 has 23 hours in New York, 2026-11-01 has 25.
    start = ts(2026, 3, 8, tz=ny)
    assert day.period_end(start + 3600) - start == 23 * 3600
    start = ts(2026, 11, 1, tz=ny)
    assert day.period_end(start + 3600) - start == 25 * 3600
    # +05:30: 2026-12-01T20:00Z is already the 2nd there.
    ist = Quota(1, "DAY", "+05:30")
    assert ist.period_end(ts(2026, 12, 1, 20)) == ts(2026, 12, 2, 18, 30)
    # Months: February 2028 has 29 days; ISO weeks across a year end.
    month = Quota(1, "MONTH")
    assert month.period_end(ts(2028, 2, 10)) == ts(2028, 3, 1)
    assert month.period_end(ts(2026, 12, 31, 23)) == ts(2027, 1, 1)
    week = Quota(1, "WEEK")
    assert week.period_end(ts(2026, 12, 31)) == ts(2027, 1, 4)  # a Thursday to Monday
    assert week.period_end(ts(2027, 1, 4)) == ts(2027, 1, 11)  # Monday 00:00 starts one
    assert Quota(1, "YEAR").period_end(ts(2028, 2, 29)) == ts(2029, 1, 1)
    assert [Quota(1, p).window_s() for p in Period] == [86_400, 604_800, 2_592_000, 31_536_000]


def test_the_local_fallback_counts_a_quota_in_its_period() -> None:
    local = LocalLimiter()
    q = Quota(10, "DAY", "Asia/Tokyo")
    now = ts(2026, 12, 1, 14, 59)  # 23:59 in Tokyo
    assert [local.decide("q", "k", q, 2, now).allowed for _ in range(3)] == [True, True, False]
    d = local.decide("q", "k", q, 2, now)
    assert d.wait_ms == 60_000 and d.reset_ms == 60_000
    # One minute later a new day starts in Tokyo.
    assert local.decide("q", "k", q, 2, now + 60).allowed
