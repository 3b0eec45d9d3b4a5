"""An ASGI middleware (Starlette, FastAPI, any ASGI app) with the Rust layer's answers.

A denial is a 429 with `Retry-After: ceil(wait_ms / 1000)`, the IETF fields
(`RateLimit-Policy`, `RateLimit`; also on admitted responses) and an
`application/problem+json` body. The deciding is `limiter.py`'s
`AsyncLimiter` (the deny cache, the local level, the fallback and its
breaker, the stats), the HTTP fields and the problem body `headers.py`'s;
this module is the HTTP around them.

A `Concurrency` rule caps the requests in flight per key: a lease is taken
when the request starts and released when its response has been sent, or
when the app fails or the request is cancelled.

Every name this module exported stays importable from here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, MutableMapping, Sequence
from typing import Any, Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from . import algorithms as algorithms
from .aio import AsyncClient
from .decision import Decision
from .deny_cache import DenyCache as DenyCache
from .errors import InvalidArgument
from .headers import DENIED_TITLE as DENIED_TITLE
from .headers import QUOTA_EXCEEDED as QUOTA_EXCEEDED
from .headers import denial_detail as denial_detail
from .headers import problem, ratelimit_headers
from .headers import problem_json as problem_json
from .limiter import Admission, AsyncLimiter
from .limiter import FallbackMode as FallbackMode
from .limiter import Held as Held
from .limiter import Stats as Stats
from .limiter import check_zones as check_zones
from .local import _COST_0 as _COST_0
from .local import _COST_1 as _COST_1
from .local import _PERIODS as _PERIODS
from .local import LocalLimiter as LocalLimiter
from .local import Micros as Micros
from .local import _Held as _Held
from .local import _micros as _micros
from .local import _quota_end as _quota_end
from .local import share_of as share_of
from .protocol import spec_from_policy as spec_from_policy
from .spec import _OFFSET as _OFFSET
from .spec import Algorithm as Algorithm
from .spec import Concurrency as Concurrency
from .spec import FixedWindow as FixedWindow
from .spec import HashWindow as HashWindow
from .spec import LeakyBucket as LeakyBucket
from .spec import Period as Period
from .spec import Policy as Policy
from .spec import Quota as Quota
from .spec import Rule as Rule
from .spec import Sliding as Sliding
from .spec import Spec as Spec
from .spec import TokenBucket as TokenBucket
from .spec import _limit_of as _limit_of

log = logging.getLogger("redis_ratelimit_client")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RateLimitMiddleware:
    """Limits every HTTP request of `app` by `rules`, keyed by `key(scope)`.

    `client`: an `AsyncClient` or a `redis.asyncio.Redis`/`RedisCluster`.
    `key`: the identity of a request (IP, header, user) from its ASGI scope,
    or None, which answers 400 (or passes unlimited with
    `on_missing_key="allow"`). The other settings are the `AsyncLimiter`'s
    (`limiter`), which decides.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        client: AsyncClient | aioredis.Redis | Any,
        rules: Sequence[Rule],
        key: Callable[[Scope], str | None],
        fallback: FallbackMode = FallbackMode.LOCAL_ONLY,
        deadline: float = 0.1,
        deny_cache_max: float = 1.0,
        instances: int = 1,
        breaker_failures: int = 5,
        breaker_open_for: float = 1.0,
        x_ratelimit_headers: bool = False,
        on_missing_key: str = "deny",
        connections: int = 16,
    ) -> None:
        if on_missing_key not in ("deny", "allow"):
            raise InvalidArgument(
                'on_missing_key must be "deny" or "allow"', param="on_missing_key"
            )
        self.app = app
        self.limiter = AsyncLimiter(
            client,
            rules,
            fallback=fallback,
            deadline=deadline,
            deny_cache_max=deny_cache_max,
            instances=instances,
            breaker_failures=breaker_failures,
            breaker_open_for=breaker_open_for,
            connections=connections,
        )
        self.key = key
        self.x_ratelimit_headers = x_ratelimit_headers
        self.on_missing_key = on_missing_key

    # -- the limiter's state, as this class exposed it ----------------------

    @property
    def client(self) -> AsyncClient:
        return self.limiter.client

    @property
    def rules(self) -> list[Rule]:
        return self.limiter.rules

    @property
    def stats(self) -> Stats:
        return self.limiter.stats

    @property
    def local(self) -> LocalLimiter:
        return self.limiter.local

    @property
    def deny_cache(self) -> DenyCache:
        return self.limiter.deny_cache

    @property
    def fallback(self) -> FallbackMode:
        return self.limiter.fallback

    @property
    def _ready(self) -> bool:
        return self.limiter.ready

    @property
    def _open(self) -> bool:
        return self.limiter.breaker_open

    def share(self, algo: Algorithm) -> int:
        """This instance's share of `algo`'s limit (`AsyncLimiter.share`)."""
        return self.limiter.share(algo)

    async def startup(self) -> None:
        """Opens connections and checks them (`PING`, `MODULE LIST`), and
        reads the rules' policies, before the first request: run by the ASGI
        lifespan's startup, else by the first request (raises
        `ModuleMissing`, `InvalidArgument` for a missing policy; Redis away is
        logged, and the fallback serves until it answers)."""
        try:
            await self.limiter.startup()
        except (RedisError, OSError, asyncio.TimeoutError) as e:
            log.warning("redis-ratelimit: Redis away at start-up (%s); the fallback serves", e)

    async def decide(self, identity: str) -> tuple[Decision, int, str, list[Held]]:
        """(decision, index of the rule it is about, path, what an admission
        holds until its response is done: give it to `release`)."""
        a = await self.limiter.check(identity)
        return a.decision, a.index, a.path, a.held

    async def release(self, held: list[Held]) -> None:
        """Gives back what an admitted request held (`AsyncLimiter.release`)."""
        await self.limiter.release(held)

    # -- HTTP -----------------------------------------------------------

    def headers(self, d: Decision, index: int) -> list[tuple[bytes, bytes]]:
        """The rate-limit fields of a response about rule `index` (`headers.py`)."""
        algos = self.limiter._algorithms or []
        return ratelimit_headers(self.rules, algos, d, index, self.x_ratelimit_headers)

    async def _problem(
        self,
        send: Send,
        status: int,
        title: str,
        detail: str,
        extra: list[tuple[bytes, bytes]],
        violated: str | None,
    ) -> None:
        raw, fields = problem(status, title, detail, violated)
        await send({"type": "http.response.start", "status": status, "headers": [*fields, *extra]})
        await send({"type": "http.response.body", "body": raw})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._startup_on(receive, send), send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        identity = self.key(scope)
        if identity is None:
            self.stats.key_missing += 1
            if self.on_missing_key == "allow":
                await self.app(scope, receive, send)
                return
            await self._problem(
                send, 400, "Bad Request", "the rate-limit key of this request is missing", [], None
            )
            return
        admission: Admission = await self.limiter.check(identity)
        d, index, held = admission.decision, admission.index, admission.held
        extra = self.headers(d, index) if self.limiter._algorithms is not None else []
        if not d.allowed:
            name = self.rules[index].name
            await self._problem(send, 429, DENIED_TITLE, denial_detail(name, d), extra, name)
            return

        released = False

        async def send_with_headers(message: Message) -> None:
            nonlocal released
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)
            if (
                held
                and not released
                and message["type"] == "http.response.body"
                and not message.get("more_body", False)
            ):
                released = True  # the response is done: the app may still run background work
                await self.release(held)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            if held and not released:
                released = True
                task = self.limiter._release_later(held)
                if task is not None:
                    await asyncio.shield(task)

    def _startup_on(self, receive: Receive, send: Send) -> Receive:
        """The lifespan's `receive`, which runs `startup` before the app sees
        `lifespan.startup`: the server serves no request before it is done.
        A failure (the module missing, a policy not set) fails the start-up,
        with its message, whatever the app does with lifespan events."""

        async def receive_after_startup() -> Message:
            message = await receive()
            if message.get("type") == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as e:
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    raise
            return message

        return receive_after_startup


def client_ip(scope: Scope) -> str | None:
    """A key function: the peer address."""
    client = scope.get("client")
    return str(client[0]) if client else None


def header(name: str) -> Callable[[Scope], str | None]:
    """A key function: the value of a request header (None when absent)."""
    wanted = name.lower().encode()

    def key(scope: Scope) -> str | None:
        for k, v in scope.get("headers", []):
            if k.lower() == wanted:
                return bytes(v).decode("latin-1")
        return None

    return key
