"""The typed limiter calls, written once for both clients.

`Client` (sync) and `AsyncClient` (asyncio) each implement `limit` (send
one limiter command, read its decision); every typed call here builds its
spec and request and returns what `limit` returns: a `Decision` for
`Client`, an awaitable of one for `AsyncClient`. So the signatures, checks
and docs of the typed calls are one text, as `limits` shares its resources
between its sync and async trees.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from .protocol import Key
from .request import RequestLike, to_request
from .spec import (
    Concurrency,
    FixedWindow,
    HashWindow,
    LeakyBucket,
    PeriodLike,
    Policy,
    Quota,
    Sliding,
    Spec,
    TokenBucket,
)

#: What a call returns: `Decision`, or an awaitable of one.
R = TypeVar("R")


class TypedCalls(Generic[R]):
    """The typed calls on top of `limit`.

    `request`: a `Request` (`Request.cost(n)`, `Request.force(n)`,
    `Request.refund(n)`; default `COST 1`). `cost=`, `force=`, `refund=`
    (or a bare int) are the former form, deprecated.
    """

    def limit(
        self,
        key: Key,
        spec: Spec,
        request: RequestLike = None,
        *,
        cost: int | None = None,
        force: bool | None = None,
        refund: int | None = None,
    ) -> R:
        """One limiter call: `RL.<ALGORITHM> key ...`, or `RL.HIT` for a Policy."""
        raise NotImplementedError

    def token_bucket(
        self,
        key: Key,
        capacity: int,
        refill_count: int,
        refill_ms: int,
        request: RequestLike = None,
        *,
        cost: int | None = None,
        force: bool | None = None,
        refund: int | None = None,
    ) -> R:
        """`RL.TOKENBUCKET key capacity refill_count refill_ms`."""
        req = to_request(request, cost, force, refund)
        return self.limit(key, TokenBucket(capacity, refill_count, refill_ms), req)

    def leaky_bucket(
        self,
        key: Key,
        capacity: int,
        leak_count: int,
        leak_ms: int,
        request: RequestLike = None,
        *,
        cost: int | None = None,
        force: bool | None = None,
        refund: int | None = None,
    ) -> R:
        """`RL.LEAKYBUCKET key capacity leak_count leak_ms`."""
        req = to_request(request, cost, force, refund)
        return self.limit(key, LeakyBucket(capacity, leak_count, leak_ms), req)

    def sliding(
        self,
        key: Key,
        limit: int,
        window_ms: int,
        request: RequestLike = None,
        *,
        cost: int | None = None,
        force: bool | None = None,
        refund: int | None = None,
    ) -> R:
        """`RL.SLIDING key limit window_ms`."""
        req = to_request(request, cost, force, refund)
        return self.limit(key, Sliding(limit, window_ms), req)

    def hash_window(
        self,
        key: Key,
        limit: int,
        window_ms: int,
        bucket_ms: int,
        request: RequestLike = None,
        *,
        cost: int | None = None,
        force: bool | None = None,
        refund: int | None = None,
    ) -> R:
        """`RL.HASHWINDOW key limit window_ms bucket_ms`."""
        req = to_request(request, cost, force, refund)
        return self.limit(key, HashWindow(limit, window_ms, bucket_ms), req)

    def fixed_window(
        self,
        key: Key,
        limit: int,
        window_ms: int,
        request: RequestLike = None,
        *,
        cost: int | None = None,
        force: bool | None = None,
        refund: int | None = None,
    ) -> R:
        """`RL.FIXEDWINDOW key limit window_ms`."""
        req = to_request(request, cost, force, refund)
        return self.limit(key, FixedWindow(limit, window_ms), req)

    def quota(
        self,
        key: Key,
        limit: int,
        period: PeriodLike,
        zone: str | None = None,
        request: RequestLike = None,
        *,
        cost: int | None = None,
        force: bool | None = None,
        refund: int | None = None,
    ) -> R:
        """`RL.QUOTA key limit DAY|WEEK|MONTH|YEAR [TZ zone]`: at most `limit`
        units per calendar period in `zone` (None: UTC). `reset_after` runs to
        the end of the period, a denial's `retry_after` to the next one."""
        req = to_request(request, cost, force, refund)
        return self.limit(key, Quota(limit, period, zone), req)

    def hit(
        self,
        policy: str,
        key: Key,
        request: RequestLike = None,
        *,
        cost: int | None = None,
        force: bool | None = None,
        refund: int | None = None,
    ) -> R:
        """`RL.HIT policy key`: routed by `key` (argv[2]), not by the name."""
        req = to_request(request, cost, force, refund)
        return self.limit(key, Policy(policy), req)

    def concurrency(
        self,
        key: Key,
        limit: int,
        lease_ms: int,
        request: RequestLike = None,
        *,
        cost: int | None = None,
        force: bool | None = None,
        refund: int | None = None,
    ) -> R:
        """`RL.CONCURRENCY key limit lease_ms`: `decision.lease` is the lease
        granted (None when denied). A lost reply is covered by the lease's
        expiry: it is never sent again."""
        req = to_request(request, cost, force, refund)
        return self.limit(key, Concurrency(limit, lease_ms), req)
