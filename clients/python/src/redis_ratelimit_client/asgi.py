"""An ASGI middleware (Starlette, FastAPI, any ASGI app) with the Rust layer's answers.

A denial is a 429 with `Retry-After: ceil(wait_ms / 1000)`, the IETF fields
(`RateLimit-Policy`, `RateLimit`; also on admitted responses) and an
`application/problem+json` body. In front of Redis: a deny cache; behind it a
fallback (fail open, fail closed, or a local limiter at this instance's
share) when Redis errors, misses the deadline or the breaker is open.

A `Concurrency` rule caps the requests in flight per key: a lease is taken
when the request starts and released when its response has been sent, or
when the app fails or the request is cancelled.

The deny cache is `deny_cache.py`'s, the local accounts (`LocalLimiter`)
`local.py`'s, the HTTP fields and the problem body `headers.py`'s, the rules
`spec.py`'s; every name this module exported stays importable from here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import math
import time
from collections.abc import Awaitable, MutableMapping, Sequence
from typing import Any, Callable, Union

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from . import algorithms as algorithms
from .aio import AsyncClient
from .decision import Decision
from .deny_cache import DenyCache as DenyCache
from .errors import (
    InvalidArgument,
    ModuleMissing,
    RateLimitError,
    ServerError,
    WrongType,
    answer_lost,
)
from .headers import DENIED_TITLE as DENIED_TITLE
from .headers import QUOTA_EXCEEDED as QUOTA_EXCEEDED
from .headers import denial_detail as denial_detail
from .headers import problem, ratelimit_headers
from .headers import problem_json as problem_json
from .local import _COST_0 as _COST_0
from .local import _COST_1 as _COST_1
from .local import _PERIODS as _PERIODS
from .local import LocalLimiter as LocalLimiter
from .local import Micros as Micros
from .local import _Held as _Held
from .local import _micros as _micros
from .local import _quota_end as _quota_end
from .local import share_of as share_of
from .protocol import _takes_command_name
from .protocol import spec_from_policy as spec_from_policy
from .spec import _OFFSET as _OFFSET
from .spec import (
    Algorithm,
    Concurrency,
    Policy,
    Quota,
)
from .spec import FixedWindow as FixedWindow
from .spec import HashWindow as HashWindow
from .spec import LeakyBucket as LeakyBucket
from .spec import Period as Period
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


class FallbackMode(str, enum.Enum):
    """What decides while Redis is away."""

    FAIL_OPEN = "fail_open"
    FAIL_CLOSED = "fail_closed"
    LOCAL_ONLY = "local_only"


#: What an admitted request holds until its response is done, as (key, rule
#: name, lease id): a lease in Redis, or with None a unit of the local fallback.
Held = tuple[str, str, Union[int, None]]


def check_zones(rules: Sequence[Rule], algos: Sequence[Algorithm]) -> None:
    """Several rate rules go in one `RL.ALL`, whose inline specs count quotas
    in UTC: an inline zoned quota must then be the only one (beside
    concurrency caps). A zoned quota policy counts in its zone anywhere."""
    rated = [r.spec for r, a in zip(rules, algos) if not isinstance(a, Concurrency)]
    if len(rated) > 1:
        for a in rated:
            if isinstance(a, Quota) and a.zone is not None:
                raise InvalidArgument(
                    f"zone: a quota in {a.zone!r} beside other rules would go in one RL.ALL, "
                    "which counts quotas in UTC only: give it a middleware of its own"
                )


@dataclasses.dataclass
class Stats:
    redis_calls: int = 0
    redis_admitted: int = 0
    redis_denied: int = 0
    redis_errors: int = 0
    redis_timeouts: int = 0
    deny_cache_hits: int = 0
    fallback_admitted: int = 0
    fallback_denied: int = 0
    breaker_skipped: int = 0
    breaker_opened: int = 0
    probes: int = 0
    probes_ok: int = 0
    key_missing: int = 0
    leases_released: int = 0
    release_errors: int = 0


class RateLimitMiddleware:
    """Limits every HTTP request of `app` by `rules`, keyed by `key(scope)`.

    `client`: an `AsyncClient` or a `redis.asyncio.Redis`/`RedisCluster`.
    `key`: the identity of a request (IP, header, user) from its ASGI scope,
    or None, which answers 400 (or passes unlimited with
    `on_missing_key="allow"`).
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
        if not rules:
            raise InvalidArgument("at least one rule")
        if len({r.name for r in rules}) != len(rules):
            raise InvalidArgument("rule names must differ")
        if instances < 1:
            raise InvalidArgument("instances must be at least 1")
        self.app = app
        self.client = client if isinstance(client, AsyncClient) else AsyncClient(client)
        self.rules = list(rules)
        self.key = key
        self.fallback = FallbackMode(fallback)
        self.deadline = deadline
        self.deny_cache = DenyCache(deny_cache_max)
        self.instances = instances
        self.local = LocalLimiter(instances=instances)
        self.breaker_failures = breaker_failures
        self.breaker_open_for = breaker_open_for
        self.x_ratelimit_headers = x_ratelimit_headers
        self.on_missing_key = on_missing_key
        self.connections = connections
        self.stats = Stats()
        self._algorithms: list[Algorithm] | None = None
        if not any(isinstance(r.spec, Policy) for r in self.rules):
            self._algorithms = [r.spec for r in self.rules]  # type: ignore[misc]
            check_zones(self.rules, self._algorithms)
        self._ready = False
        self._resolving: asyncio.Lock | None = None
        self._failures = 0
        self._open = False
        self._open_until = 0.0
        self._probe: asyncio.Task[None] | None = None
        self._releasing: set[asyncio.Task[None]] = set()

    # -- setup ----------------------------------------------------------

    async def startup(self) -> None:
        """Opens a connection and checks it (`PING`, `MODULE LIST`), and reads
        the rules' policies, before the first request: run by the ASGI
        lifespan's startup, else by the first request (raises
        `ModuleMissing`, `InvalidArgument` for a missing policy; Redis away is
        logged, and the fallback serves until it answers)."""
        try:
            await self._resolve()
        except (RedisError, OSError, asyncio.TimeoutError) as e:
            log.warning("redis-ratelimit: Redis away at start-up (%s); the fallback serves", e)

    async def _resolve(self) -> None:
        """The algorithm of each rule (policies read once, for `w` and the fallback)."""
        if self._ready:
            return
        if self._resolving is None:
            self._resolving = asyncio.Lock()
        async with self._resolving:  # one check for a burst of first requests
            if not self._ready:
                await self._check_and_read()

    async def _check_and_read(self) -> None:
        await self.client.redis.ping()
        await self.client.check_module()
        await self._open_connections()
        if self._algorithms is None:
            algos: list[Algorithm] = []
            for r in self.rules:
                if isinstance(r.spec, Policy):
                    p = await self.client.policy_get(r.spec.name)
                    if p is None:
                        raise InvalidArgument(f"policy {r.spec.name!r} is not set on the server")
                    algos.append(spec_from_policy(p))
                else:
                    algos.append(r.spec)
            check_zones(self.rules, algos)
            self._algorithms = algos
        self._ready = True

    async def _open_connections(self) -> None:
        """Opens `connections` connections of a standalone client's pool at
        once (a connection costs a connect and redis-py's handshake, several
        round trips: a cold burst that opened one per request missed its
        deadline on a loaded host)."""
        pool = getattr(self.client.redis, "connection_pool", None)
        if pool is None or self.connections <= 1:
            return
        wanted = min(self.connections, getattr(pool, "max_connections", self.connections))
        name = ("PING",) if _takes_command_name(pool) else ()
        opened = await asyncio.gather(*(pool.get_connection(*name) for _ in range(wanted)))
        for conn in opened:
            await pool.release(conn)

    def share(self, algo: Algorithm) -> int:
        """This instance's share: `ceil(limit / instances * 1.1)`, at least 1
        and at most the limit (in integers: a float's 10 * 1.1 is
        11.000000000000002)."""
        return share_of(_limit_of(algo), self.instances)

    # -- deciding -------------------------------------------------------

    async def decide(self, identity: str) -> tuple[Decision, int, str, list[Held]]:
        """(decision, index of the rule it is about, path, what an admission
        holds until its response is done: give it to `release`)."""
        now = time.monotonic()
        keys = [r.key_for(identity) for r in self.rules]
        for i, (r, k) in enumerate(zip(self.rules, keys)):
            cached = self.deny_cache.get(r.name, k, now)
            if cached is not None:
                self.stats.deny_cache_hits += 1
                return cached, i, "deny_cache", []
        if self._open:
            self.stats.breaker_skipped += 1
            if now >= self._open_until:
                self._start_probe()
            return self._decided_locally(keys, [])
        held: list[Held] = []
        # The rules whose call is on its way: a lost answer may have been counted.
        sent: list[int] = []
        try:
            self.stats.redis_calls += 1
            d, index = await asyncio.wait_for(self._call(keys, held, sent), self.deadline)
        except asyncio.TimeoutError:
            self.stats.redis_timeouts += 1
            self._failed(now)
            self._release_later(held)
            return self._decided_locally(keys, sent)
        except (RedisError, OSError, ServerError, ModuleMissing, WrongType) as e:
            # A lost answer is charged; an error reply (READONLY after a
            # failover, LOADING, the module gone, WRONGTYPE) charges nothing:
            # Redis applied nothing.
            self.stats.redis_errors += 1
            log.warning("redis-ratelimit: Redis failed (%s); the fallback decides", e)
            self._failed(now)
            self._release_later(held)
            return self._decided_locally(keys, sent if answer_lost(e) else [])
        except BaseException:
            self._release_later(held)
            raise
        self._failures = 0
        if d.allowed:
            self.stats.redis_admitted += 1
        else:
            self.stats.redis_denied += 1
            if not isinstance(self._algorithm(index), Concurrency):
                # A concurrency denial may end at the next release: never cached.
                self.deny_cache.put(self.rules[index].name, keys[index], d, now)
            self._release_later(held)
            held = []
        return d, index, "redis", held

    def _decided_locally(
        self, keys: list[str], lost: list[int]
    ) -> tuple[Decision, int, str, list[Held]]:
        d, index, held = self._fallback(keys, lost)
        return d, index, "fallback", held

    def _algorithm(self, index: int) -> Algorithm | None:
        algos = self._algorithms or []
        return algos[index] if index < len(algos) else None

    async def _call(
        self, keys: list[str], held: list[Held], sent: list[int]
    ) -> tuple[Decision, int]:
        """Leases first (each its own call: RL.ALL refuses CONCURRENCY), then
        the rate rules in one call; a denial gives the leases back. `sent`:
        the rules of the call on its way. Every unit Redis admits is charged
        to this instance's accounts."""
        algos = self._algorithms or [r.spec for r in self.rules]  # type: ignore[misc]
        leased = [i for i, a in enumerate(algos) if isinstance(a, Concurrency)]
        rated = [i for i in range(len(self.rules)) if i not in leased]
        decisions: list[tuple[Decision, int]] = []
        for i in leased:
            sent[:] = [i]
            d = await self.client.limit(keys[i], self.rules[i].spec)
            sent.clear()
            if d.lease is not None:
                # Held in the account too until its release: the fallback
                # counts it among this instance's requests in flight.
                self.local.hold(self.rules[i].name, keys[i], self.share(algos[i]), force=True)
                held.append((keys[i], self.rules[i].name, d.lease))
            if not d.allowed:
                return d, i
            decisions.append((d, i))
        if rated:
            sent[:] = rated
            if len(rated) == 1:
                i = rated[0]
                d = await self.client.limit(keys[i], self.rules[i].spec)
                index = i
            else:
                d = await self.client.all([(keys[i], self.rules[i].spec) for i in rated])
                index = rated[d.denied_by or 0] if not d.allowed else self._rated_rule_of(d, rated)
            sent.clear()
            if not d.allowed:
                return d, index
            now = Micros.now()
            for i in rated:
                self.local.charge(self.rules[i].name, keys[i], algos[i], self.share(algos[i]), now)
            decisions.append((d, index))
        return min(decisions, key=lambda di: di[0].remaining)

    def _rated_rule_of(self, d: Decision, rated: list[int]) -> int:
        """The rule an admitted RL.ALL reported (the most restrictive one)."""
        algos = self._algorithms or []
        for i in rated:
            if i < len(algos) and _limit_of(algos[i]) == d.limit:
                return i
        return rated[0]

    async def release(self, held: list[Held]) -> None:
        """Gives back what an admitted request held; a failure is logged (the
        lease then ends at its expiry)."""
        for key, rule, lease in held:
            self.local.unhold(rule, key)
            if lease is None:
                continue
            try:
                await asyncio.wait_for(
                    self.client.release(key, lease), max(self.deadline * 10, 0.1)
                )
                self.stats.leases_released += 1
            except (RedisError, OSError, asyncio.TimeoutError) as e:
                self.stats.release_errors += 1
                log.warning("redis-ratelimit: releasing lease %d of %r failed (%s)", lease, key, e)

    def _release_later(self, held: list[Held]) -> asyncio.Task[None] | None:
        """Releases in a task of its own, which a cancellation cannot stop."""
        if not held:
            return None
        task = asyncio.ensure_future(self.release(list(held)))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)
        return task

    def _failed(self, now: float) -> None:
        self._failures += 1
        if self._failures >= self.breaker_failures and not self._open:
            self._open = True
            self.stats.breaker_opened += 1
            log.warning("redis-ratelimit: breaker open for %.1f s", self.breaker_open_for)
            self._open_until = now + self.breaker_open_for

    def _start_probe(self) -> None:
        """After `open_for`, one PING in the background; its answer closes the breaker."""
        if self._probe is not None and not self._probe.done():
            return

        async def probe() -> None:
            self.stats.probes += 1
            try:
                await asyncio.wait_for(self.client.redis.ping(), max(self.deadline * 10, 0.1))
            except Exception:
                self._open_until = time.monotonic() + self.breaker_open_for
                return
            self.stats.probes_ok += 1
            self._failures = 0
            self._open = False
            log.info("redis-ratelimit: Redis answers again; breaker closed")

        self._probe = asyncio.ensure_future(probe())

    def _fallback(self, keys: list[str], lost: list[int]) -> tuple[Decision, int, list[Held]]:
        """(decision, rule index, the local units an admission holds).

        `lost`: the rules whose call's answer was lost (a timeout, a
        connection dropped after sending): Redis may have counted the request
        there, so it is charged to their accounts whatever is decided."""
        algos = self._algorithms or []
        if not algos:
            self.stats.fallback_admitted += 1
            return Decision(True, 0, 0, 0, 0), 0, []
        now, mono = Micros.now(), time.monotonic()
        shares = [self.share(a) for a in algos]
        if self.fallback is not FallbackMode.LOCAL_ONLY:
            for i in lost:
                self._charge_lost(i, keys[i], algos[i], shares[i], now, mono)
            if self.fallback is FallbackMode.FAIL_CLOSED:
                self.stats.fallback_denied += 1
                wait = math.ceil(self.breaker_open_for * 1000)
                return Decision(False, _limit_of(algos[0]), 0, wait, wait), 0, []
            # Fail open: charged too (forced), so the fields count down.
            for i, (a, r, k) in enumerate(zip(algos, self.rules, keys)):
                if i not in lost and not isinstance(a, Concurrency):
                    self.local.charge(r.name, k, a, shares[i], now)
            self.stats.fallback_admitted += 1
            d, index = self._account_fields(keys, algos, shares, now)
            return d, index, []
        # Local only: admitted if every account has a unit, all or nothing.
        denied: tuple[Decision, int] | None = None
        for i, (a, r, k) in enumerate(zip(algos, self.rules, keys)):
            if isinstance(a, Concurrency):
                room = self.local._held(r.name, k, mono) < shares[i]
            else:
                room = self.local.has_room(r.name, k, a, shares[i], now)
            if not room and denied is None:
                if isinstance(a, Concurrency):
                    denied = Decision(False, _limit_of(a), 0, 1000, 1000), i
                else:
                    denied = self.local.denial(r.name, k, a, shares[i], now), i
        held: list[Held] = []
        best: tuple[Decision, int] | None = None
        for i, (a, r, k) in enumerate(zip(algos, self.rules, keys)):
            if i in lost:
                d = self._charge_lost(i, k, a, shares[i], now, mono)
            elif denied is not None:
                continue
            elif isinstance(a, Concurrency):
                d = self.local.hold(r.name, k, shares[i], now=mono)
                d = dataclasses.replace(d, limit=_limit_of(a))
                held.append((k, r.name, None))
            else:
                d = self.local.charge(r.name, k, a, shares[i], now)
            if best is None or d.remaining < best[0].remaining:
                best = d, i
        if denied is not None:
            self.stats.fallback_denied += 1
            return denied[0], denied[1], []
        self.stats.fallback_admitted += 1
        assert best is not None
        return dataclasses.replace(best[0], allowed=True, wait_ms=0), best[1], held

    def _charge_lost(
        self, i: int, key: str, algo: Algorithm, share: int, now: Micros, mono: float
    ) -> Decision:
        """Charges a lost call's unit to rule `i`'s account: a rate unit, or
        a lease held until it would have expired."""
        name = self.rules[i].name
        if isinstance(algo, Concurrency):
            d = self.local.hold_lost(name, key, share, algo.lease_ms, mono)
            return dataclasses.replace(d, limit=algo.limit)
        return self.local.charge(name, key, algo, share, now)

    def _account_fields(
        self, keys: list[str], algos: list[Algorithm], shares: list[int], now: Micros
    ) -> tuple[Decision, int]:
        """A fail-open admission: the fields of the rate account with the
        least left (never a full quota)."""
        best: tuple[Decision, int] | None = None
        mono = time.monotonic()
        for i, (a, r, k) in enumerate(zip(algos, self.rules, keys)):
            if isinstance(a, Concurrency):
                held = self.local._held(r.name, k, mono)
                d = Decision(True, _limit_of(a), max(shares[i] - held, 0), 0, 0)
            else:
                d = self.local.fields(r.name, k, a, shares[i], now)
            if best is None or d.remaining < best[0].remaining:
                best = d, i
        assert best is not None
        return best

    # -- HTTP -----------------------------------------------------------

    def headers(self, d: Decision, index: int) -> list[tuple[bytes, bytes]]:
        """The rate-limit fields of a response about rule `index` (`headers.py`)."""
        algos = self._algorithms or []
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
        try:
            await self._resolve()
        except (RedisError, OSError, asyncio.TimeoutError) as e:
            log.warning("redis-ratelimit: cannot read the rules yet (%s)", e)
        except RateLimitError:
            raise
        if not self._ready:  # Redis away before its first answer: the fallback
            keys = [r.key_for(identity) for r in self.rules]
            d, index, held = self._fallback(keys, [])
        else:
            d, index, _, held = await self.decide(identity)
        extra = self.headers(d, index) if self._algorithms is not None else []
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
                task = self._release_later(held)
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
