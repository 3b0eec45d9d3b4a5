"""The tagged request (`Request.cost/force/refund`) and the deprecated
`cost=`/`force=`/`refund=` keywords, against a real redis-server."""

from __future__ import annotations

import asyncio
import warnings

import pytest
import redis
import redis.asyncio as aioredis
from conftest import Server

from redis_ratelimit_client import (
    AsyncClient,
    Client,
    Concurrency,
    InvalidArgument,
    Request,
    RequestKind,
    Sliding,
)


@pytest.fixture
def c(r: redis.Redis) -> Client:
    return Client(r)


def test_a_request_has_one_kind_and_its_options() -> None:
    assert Request.cost().args() == [] and Request.cost(1) == Request(RequestKind.COST, 1)
    assert Request.cost(0).args() == ["COST", 0]
    assert Request.force(3).args() == ["COST", 3, "FORCE"]
    assert Request.refund(2).args() == ["REFUND", 2]
    assert Request("refund", 2).kind is RequestKind.REFUND
    # FORCE with REFUND: no kind says both, and the fields are frozen.
    with pytest.raises(InvalidArgument) as e:
        Request("force+refund", 1)  # type: ignore[arg-type]
    assert e.value.param == "request"
    with pytest.raises(AttributeError):
        Request.force(1).kind = RequestKind.REFUND  # type: ignore[misc]


@pytest.mark.parametrize(
    ("build", "param"),
    [
        (lambda: Request.cost(-1), "COST"),
        (lambda: Request.cost(1.5), "COST"),
        (lambda: Request.cost(True), "COST"),
        (lambda: Request.force((1 << 40) + 1), "COST"),
        (lambda: Request.refund(-1), "REFUND"),
        (lambda: Request.refund((1 << 40) + 1), "REFUND"),
    ],
)
def test_a_bad_request_names_its_option(build, param: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        build()
    assert e.value.param == param and param in str(e.value)


def test_cost_force_and_refund_as_requests(c: Client) -> None:
    assert c.sliding("k", 5, 10_000, Request.cost(5)).remaining == 0
    assert not c.sliding("k", 5, 10_000).allowed
    forced = c.sliding("k", 5, 10_000, Request.force(1))
    assert forced.allowed and forced.remaining == 0
    assert c.sliding("k", 5, 10_000, Request.refund(4)).remaining == 3
    assert c.limit("k", Sliding(5, 10_000), Request.cost(0)).remaining == 3
    assert c.all([("k", Sliding(5, 10_000))], Request.force(0)).allowed


def test_the_deprecated_keywords_still_work_with_a_warning(c: Client) -> None:
    with pytest.warns(DeprecationWarning, match="Request.cost"):
        assert c.sliding("d", 5, 10_000, cost=2).remaining == 3
    with pytest.warns(DeprecationWarning):
        assert c.sliding("d", 5, 10_000, 3).remaining == 0
    with pytest.warns(DeprecationWarning):
        assert c.sliding("d", 5, 10_000, cost=1, force=True).allowed
    with pytest.warns(DeprecationWarning):
        assert c.sliding("d", 5, 10_000, refund=2).remaining == 1
    with pytest.warns(DeprecationWarning):
        assert c.all([("d", Sliding(5, 10_000))], cost=0).remaining == 1


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda c: c.sliding("k", 5, 1000, force=True, refund=1), "REFUND"),
        (lambda c: c.sliding("k", 5, 1000, cost=2, refund=1), "REFUND"),
        (lambda c: c.sliding("k", 5, 1000, Request.cost(1), cost=1), "request"),
        (lambda c: c.sliding("k", 5, 1000, "2"), "request"),
        (lambda c: c.all([("k", Sliding(1, 1000))], Request.refund(1)), "REFUND"),
        (lambda c: c.acquire("k", Sliding(1, 1000), Request.force(1), timeout_ms=10), "FORCE"),
        (lambda c: c.acquire("k", Sliding(1, 1000), Request.refund(1), timeout_ms=1), "REFUND"),
        (lambda c: c.lease("k", Concurrency(1, 1000), Request.refund(1)).__enter__(), "REFUND"),
    ],
)
def test_refused_before_anything_is_sent(c: Client, r: redis.Redis, call, param: str) -> None:
    with pytest.raises(InvalidArgument) as e, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        call(c)
    assert e.value.param == param
    assert r.dbsize() == 0


def test_the_async_client_takes_the_same_requests(server: Server, r: redis.Redis) -> None:
    async def main() -> None:
        a = await AsyncClient.create(aioredis.Redis(host="127.0.0.1", port=server.port))
        try:
            assert (await a.fixed_window("a", 3, 60_000, Request.cost(3))).remaining == 0
            assert (await a.fixed_window("a", 3, 60_000, Request.force(2))).allowed
            assert (await a.fixed_window("a", 3, 60_000, Request.refund(5))).remaining == 3
            with pytest.warns(DeprecationWarning):
                assert (await a.fixed_window("a", 3, 60_000, cost=0)).remaining == 3
            with pytest.raises(InvalidArgument) as e, pytest.warns(DeprecationWarning):
                await a.limit("a", Sliding(1, 1000), force=True, refund=1)
            assert e.value.param == "REFUND"
        finally:
            await a.redis.aclose()

    asyncio.run(main())
