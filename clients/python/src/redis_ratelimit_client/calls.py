"""The typed limiter calls, written once for both clients.

`Client` (sync) and `AsyncClient` (asyncio) each implement `limit` (send
one limiter command, read its decision); every typed call here builds its
spec and request and returns what `limit` returns: a `Decision` for
`Client`, an awaitable of one for `AsyncClient`. So the signatures, checks
and docs of the typed calls are one text, as `limits` shares its resources
between its sync and async trees.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from .protocol import Key
from .request import RequestLike, deprecated_request
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
    `Request.refund(n)`; default `COST 1`). `**deprecated`: the former
    `cost=`, `force=`, `refund=` (a bare int is the former cost), taken for
    one release with a `DeprecationWarning`.
    """

    def limit(
        self,
        key: Key,
        spec: Spec,
        request: RequestLike = None,
        **deprecated: Any,
    ) -> R:
        """One limiter call: `RL.<ALGORITHM> key ...`, or `RL.HIT` for a Policy."""
        raise NotImplementedError

    def _typed(self, key: Key, spec: Spec, request: RequestLike, deprecated: dict[str, Any]) -> R:
        return self.limit(key, spec, deprecated_request(request, deprecated, stacklevel=5))

    def token_bucket(
        self,
        key: Key,
        capacity: int,
        refill_count: int,
        refill_ms: int,
        request: RequestLike = None,
        **deprecated: Any,
    ) -> R:
        """`RL.TOKENBUCKET key capacity refill_count refill_ms`."""
        return self._typed(key, TokenBucket(capacity, refill_count, refill_ms), request, deprecated)

    def leaky_bucket(
        self,
        key: Key,
        capacity: int,
        leak_count: int,
        leak_ms: int,
        request: RequestLike = None,
        **deprecated: Any,
    ) -> R:
        """`RL.LEAKYBUCKET key capacity leak_count leak_ms`."""
        return self._typed(key, LeakyBucket(capacity, leak_count, leak_ms), request, deprecated)

    def sliding(
        self,
        key: Key,
        limit: int,
        window_ms: int,
        request: RequestLike = None,
        **deprecated: Any,
    ) -> R:
        """`RL.SLIDING key limit window_ms`."""
        return self._typed(key, Sliding(limit, window_ms), request, deprecated)

    def hash_window(
        self,
        key: Key,
        limit: int,
        window_ms: int,
        bucket_ms: int,
        request: RequestLike = None,
        **deprecated: Any,
    ) -> R:
        """`RL.HASHWINDOW key limit window_ms bucket_ms`."""
        return self._typed(key, HashWindow(limit, window_ms, bucket_ms), request, deprecated)

    def fixed_window(
        self,
        key: Key,
        limit: int,
        window_ms: int,
        request: RequestLike = None,
        **deprecated: Any,
    ) -> R:
        """`RL.FIXEDWINDOW key limit window_ms`."""
        return self._typed(key, FixedWindow(limit, window_ms), request, deprecated)

    def quota(
        self,
        key: Key,
        limit: int,
        period: PeriodLike,
        zone: str | None = None,
        request: RequestLike = None,
        **deprecated: Any,
    ) -> R:
        """`RL.QUOTA key limit DAY|WEEK|MONTH|YEAR [TZ zone]`: at most `limit`
        units per calendar period in `zone` (None: UTC). `reset_after` runs to
        the end of the period, a denial's `retry_after` to the next one."""
        return self._typed(key, Quota(limit, period, zone), request, deprecated)

    def hit(
        self,
        policy: str,
        key: Key,
        request: RequestLike = None,
        **deprecated: Any,
    ) -> R:
        """`RL.HIT policy key`: routed by `key` (argv[2]), not by the name."""
        return self._typed(key, Policy(policy), request, deprecated)

    def concurrency(
        self,
        key: Key,
        limit: int,
        lease_ms: int,
        request: RequestLike = None,
        **deprecated: Any,
    ) -> R:
        """`RL.CONCURRENCY key limit lease_ms`: `decision.lease` is the lease
        granted (None when denied). A lost reply is covered by the lease's
        expiry: it is never sent again."""
        return self._typed(key, Concurrency(limit, lease_ms), request, deprecated)
