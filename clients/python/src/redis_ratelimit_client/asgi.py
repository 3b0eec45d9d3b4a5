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

With an `AsyncProtection` (the protection loop, `protection.py`), the
middleware counts the outcome of every request its policy rules admitted
(an error: a 5xx answer, an exception or a timeout of the app; the
`is_error` predicate decides), and each `RouteOptions` may be marked non-core:
while a policy of the rules is at stage 1 or 2, such a route answers its
`degrade` handler (or a 429) without a call to Redis. A denial on a route
with a `degrade` handler answers the handler instead of the 429.

Every name this module exported stays importable from here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Awaitable, MutableMapping, Sequence
from typing import Any, Callable, Union

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from . import algorithms as algorithms
from .aio import AsyncClient
from .decision import Decision
from .deny_cache import DenyCache as DenyCache
from .errors import InvalidArgument
from .events import DenyEvents
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
from .protection import DEGRADE, AsyncProtection
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


def server_error_or_exception(status: int | None, error: BaseException | None) -> bool:
    """The default outcome predicate: an error is a 5xx answer, or an
    exception or a timeout of the app (`error` set; `status` None when no
    answer started)."""
    return error is not None or (status is not None and status >= 500)


#: Whether a finished request is an error: `(status, exception)`.
ErrorPredicate = Callable[[Union[int, None], Union[BaseException, None]], bool]


@dataclasses.dataclass(frozen=True)
class RouteOptions:
    """What the middleware does on one path (`prefix=True`: every path
    under it).

    `core`: a core route is always limited; a non-core one, while a policy
    of the rules is at stage 1 (degrade) or 2 (break), answers `degrade`
    without a call to Redis, or a 429 when it has none. `degrade`: an ASGI
    app (a Starlette `Response` is one) answering in place of the 429 of a
    denial, with a cached or default answer. `limited=False`: the route
    passes unlimited (health checks, status pages).
    """

    path: str
    core: bool = True
    degrade: ASGIApp | None = None
    limited: bool = True
    prefix: bool = False

    def matches(self, path: str) -> bool:
        return path.startswith(self.path) if self.prefix else path == self.path


class RateLimitMiddleware:
    """Limits every HTTP request of `app` by `rules`, keyed by `key(scope)`.

    `client`: an `AsyncClient` or a `redis.asyncio.Redis`/`RedisCluster`.
    `key`: the identity of a request (IP, header, user) from its ASGI scope,
    or None, which answers 400 (or passes unlimited with
    `on_missing_key="allow"`). The other settings are the `AsyncLimiter`'s
    (`limiter`), which decides.

    The protection loop: `protection` (an `AsyncProtection` watching the
    rules' policies; started with the app, closed at its shutdown, and
    attached to the limiter so that a global policy rule's local level runs
    at the policy's scale), `routes` (the first that matches a path applies;
    a path none matches is a core route without a degrade handler),
    `is_error` (the outcome predicate, `(status, exception) -> bool`) and
    `timeout` (seconds an admitted request may take: past it, the app is
    cancelled, answered 504 when no answer started, and counted an error).

    Observability: `metrics` (a prometheus_client `CollectorRegistry`, `True`
    for its default `REGISTRY`, or a `Metrics`) counts every decision (the
    app serves the registry on a route of its own, say `/metrics`, marked
    `limited=False`); `deny_events` (a `DenyEvents`) records every denial
    with the request's `client_ip` (the peer address) and `user_agent`, and
    is closed (its rest shipped) at the app's shutdown.
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
        protection: AsyncProtection | None = None,
        routes: Sequence[RouteOptions] = (),
        is_error: ErrorPredicate = server_error_or_exception,
        timeout: float | None = None,
        metrics: object = None,
        deny_events: DenyEvents | None = None,
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
            metrics=metrics,
            deny_events=deny_events,
        )
        self.key = key
        self.x_ratelimit_headers = x_ratelimit_headers
        self.on_missing_key = on_missing_key
        if timeout is not None and not timeout > 0:
            raise InvalidArgument("timeout must be more than 0 s", param="timeout")
        self.protection = protection
        self.routes = list(routes)
        self.is_error = is_error
        self.timeout = timeout
        #: The policy rules: (rule index, policy name); only they report outcomes.
        self.policy_rules = [
            (i, r.spec.name) for i, r in enumerate(self.rules) if isinstance(r.spec, Policy)
        ]
        #: Requests answered by a degrade handler (`stage`: a non-core route
        #: at stage 1 or 2, no Redis call; `denied`: in place of a 429) and
        #: non-core requests answered 429 at stage 1 or 2 without a handler.
        self.degraded = {"stage": 0, "denied": 0, "stage_429": 0}
        if protection is not None:
            watched = set(protection.policies)
            missing = [p for _, p in self.policy_rules if p not in watched]
            if missing:
                raise InvalidArgument(
                    f"the protection does not watch the policies {missing} of the rules",
                    param="protection",
                )
            protection.attach(self.limiter)

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
        if self.protection is not None:
            self.protection.start()
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
        route = self._route(scope)
        if route is not None and not route.limited:
            await self.app(scope, receive, send)
            return
        # Started by the first request when no lifespan started it; never
        # again once the app's shutdown closed it (nothing would stop it).
        p = self.protection
        if p is not None and not p.running and not p.closed:
            p.start()
        if route is not None and not route.core:
            stage_rule = self._stage_rule()
            if stage_rule is not None:
                await self._degraded(route, stage_rule, scope, receive, send)
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
        if self.limiter.deny_events is None:
            admission: Admission = await self.limiter.check(identity)
        else:
            admission = await self.limiter.check(
                identity, client_ip=client_ip(scope), user_agent=_user_agent(scope)
            )
        d, index, held = admission.decision, admission.index, admission.held
        extra = self.headers(d, index) if self.limiter._algorithms is not None else []
        if not d.allowed:
            if route is not None and route.degrade is not None:
                self.degraded["denied"] += 1
                await route.degrade(scope, receive, send)
                return
            name = self.rules[index].name
            await self._problem(send, 429, DENIED_TITLE, denial_detail(name, d), extra, name)
            return

        released = False
        status: int | None = None

        async def send_with_headers(message: Message) -> None:
            nonlocal released, status
            if message["type"] == "http.response.start":
                status = int(message["status"])
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

        # The outcome, once the app is done: a cancellation (the client went
        # away) is none, and is not counted.
        try:
            try:
                if self.timeout is None:
                    await self.app(scope, receive, send_with_headers)
                else:
                    await asyncio.wait_for(
                        self.app(scope, receive, send_with_headers), self.timeout
                    )
            except asyncio.TimeoutError as e:
                self._outcome(status, e)
                if self.timeout is None or status is not None:
                    raise
                await self._problem(
                    send, 504, "Gateway Timeout", "the request took too long", [], None
                )
            except Exception as e:
                self._outcome(status, e)
                raise
            else:
                self._outcome(status, None)
        finally:
            if held and not released:
                released = True
                task = self.limiter._release_later(held)
                if task is not None:
                    await asyncio.shield(task)

    # -- the protection loop --------------------------------------------------

    def _route(self, scope: Scope) -> RouteOptions | None:
        path = scope.get("path", "")
        for route in self.routes:
            if route.matches(path):
                return route
        return None

    def _stage_rule(self) -> int | None:
        """The policy rule at the highest stage, if any is at 1 or more."""
        if self.protection is None:
            return None
        best: tuple[int, int] | None = None
        for i, name in self.policy_rules:
            stage = self.protection.stage(name)
            if stage >= DEGRADE and (best is None or stage > best[0]):
                best = stage, i
        return None if best is None else best[1]

    async def _degraded(
        self, route: RouteOptions, index: int, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """A non-core route while a policy is at stage 1 or 2: its degrade
        handler, or a 429 (the policy's fields, no call to Redis)."""
        if route.degrade is not None:
            self.degraded["stage"] += 1
            await route.degrade(scope, receive, send)
            return
        self.degraded["stage_429"] += 1
        algo = self.limiter._algorithm(index)
        wait = math.ceil(self.protection.stage_poll * 1000) if self.protection else 1000
        d = Decision(False, _limit_of(algo) if algo is not None else 0, 0, wait, wait)
        extra = self.headers(d, index) if self.limiter._algorithms is not None else []
        name = self.rules[index].name
        detail = f"rule {name!r} is degraded: this route is not served at the moment"
        await self._problem(send, 429, DENIED_TITLE, detail, extra, name)

    def _outcome(self, status: int | None, error: BaseException | None) -> None:
        """Counts an admitted request's outcome for every policy rule."""
        if self.protection is None or not self.policy_rules:
            return
        failed = self.is_error(status, error)
        for _, name in self.policy_rules:
            self.protection.record(name, failed)

    def _startup_on(self, receive: Receive, send: Send) -> Receive:
        """The lifespan's `receive`, which runs `startup` before the app sees
        `lifespan.startup`: the server serves no request before it is done.
        A failure (the module missing, a policy not set) fails the start-up,
        with its message, whatever the app does with lifespan events."""

        async def receive_after_startup() -> Message:
            message = await receive()
            if message.get("type") == "lifespan.shutdown" and self.protection is not None:
                await self.protection.aclose()
            if message.get("type") == "lifespan.shutdown" and self.limiter._grants:
                await self.limiter.aclose()  # the batched rules' held units back
            events = self.limiter.deny_events
            if message.get("type") == "lifespan.shutdown" and events is not None:
                # Its rest shipped (at most its timeout), off the event loop.
                await asyncio.get_running_loop().run_in_executor(None, events.close)
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


def _user_agent(scope: Scope) -> str | None:
    """The User-Agent for a deny event: UTF-8 (what a client sends for a
    non-ASCII value), else latin-1 (every byte a character); the event cuts
    it to `MAX_HEADER_BYTES`."""
    for k, v in scope.get("headers", []):
        if k.lower() == b"user-agent":
            raw = bytes(v)
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError:
                return raw.decode("latin-1")
    return None
