"""An ASGI middleware (Starlette, FastAPI, any ASGI app) with the Rust layer's answers.

A denial is a 429 with `Retry-After: ceil(wait_ms / 1000)`, the IETF fields
(`RateLimit-Policy`, `RateLimit`; also on admitted responses) and an
`application/problem+json` body. In front of Redis: a deny cache; behind it a
fallback (fail open, fail closed, or a local limiter at this instance's
share) when Redis errors, misses the deadline or the breaker is open.

A `Concurrency` rule caps the requests in flight per key: a lease is taken
when the request starts and released when its response has been sent, or
when the app fails or the request is cancelled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import math
import time
from collections.abc import Awaitable, MutableMapping, Sequence
from typing import Any, Callable, Union

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from .aio import AsyncClient
from .model import (
    Algorithm,
    BadArgument,
    Concurrency,
    Decision,
    FixedWindow,
    HashWindow,
    LeakyBucket,
    Policy,
    Quota,
    RateLimitError,
    Sliding,
    Spec,
    TokenBucket,
)

log = logging.getLogger("redis_ratelimit_client")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"


class FallbackMode(str, enum.Enum):
    """What decides while Redis is away."""

    FAIL_OPEN = "fail_open"
    FAIL_CLOSED = "fail_closed"
    LOCAL_ONLY = "local_only"


@dataclasses.dataclass(frozen=True)
class Rule:
    """A named limit: an algorithm inline, or a `Policy` kept in the server.

    The limiter key is `key_prefix + identity` (default prefix
    `rl:<name>:`), or `fixed_key` for a limit shared by everyone.
    """

    spec: Spec
    name: str
    key_prefix: str | None = None
    fixed_key: str | None = None

    def key_for(self, identity: str) -> str:
        if self.fixed_key is not None:
            return self.fixed_key
        prefix = self.key_prefix if self.key_prefix is not None else f"rl:{self.name}:"
        return prefix + identity


def _limit_of(spec: Algorithm) -> int:
    return spec.capacity if isinstance(spec, (TokenBucket, LeakyBucket)) else spec.limit


#: What an admitted request holds until its response is done, as (key, rule
#: name, lease id): a lease in Redis, or with None a unit of the local fallback.
Held = tuple[str, str, Union[int, None]]


def spec_from_policy(policy: dict[str, object]) -> Algorithm:
    """The algorithm of an `RL.POLICY GET` reply."""
    algo = str(policy.get("algorithm", "")).upper()
    raw = list(policy.get("params", []))  # type: ignore[call-overload]
    if algo == "QUOTA" and len(raw) == 2:
        # `[limit, "DAY"]`: the period as its word; a `zone` field when not UTC.
        zone = policy.get("zone")
        return Quota(int(raw[0]), str(raw[1]), None if zone is None else str(zone))  # type: ignore[arg-type]
    params = [int(p) for p in raw]
    table: dict[str, Callable[..., Algorithm]] = {
        "TOKENBUCKET": TokenBucket,
        "LEAKYBUCKET": LeakyBucket,
        "SLIDING": Sliding,
        "HASHWINDOW": HashWindow,
        "FIXEDWINDOW": FixedWindow,
        "CONCURRENCY": Concurrency,
    }
    if algo not in table:
        raise BadArgument(f"policy {policy.get('name')!r} has algorithm {algo!r}, unknown here")
    return table[algo](*params)


def check_zones(rules: Sequence[Rule], algos: Sequence[Algorithm]) -> None:
    """Several rate rules go in one `RL.ALL`, whose inline specs count quotas
    in UTC: an inline zoned quota must then be the only one (beside
    concurrency caps). A zoned quota policy counts in its zone anywhere."""
    rated = [r.spec for r, a in zip(rules, algos) if not isinstance(a, Concurrency)]
    if len(rated) > 1:
        for a in rated:
            if isinstance(a, Quota) and a.zone is not None:
                raise BadArgument(
                    f"zone: a quota in {a.zone!r} beside other rules would go in one RL.ALL, "
                    "which counts quotas in UTC only: give it a middleware of its own"
                )


class DenyCache:
    """Denials remembered in process for `min(wait_ms, max)`; bounded."""

    def __init__(self, max_s: float = 1.0, max_entries: int = 10_000) -> None:
        self.max_s = max_s
        self.max_entries = max_entries
        self._entries: dict[tuple[str, str], tuple[float, float, Decision]] = {}

    def get(self, rule: str, key: str, now: float) -> Decision | None:
        hit = self._entries.get((rule, key))
        if hit is None:
            return None
        stored, until, d = hit
        if now >= until:
            del self._entries[(rule, key)]
            return None
        # wait_ms and reset_ms count down, so Retry-After does.
        elapsed = int((now - stored) * 1000)
        return dataclasses.replace(
            d, wait_ms=max(d.wait_ms - elapsed, 1), reset_ms=max(d.reset_ms - elapsed, 0)
        )

    def put(self, rule: str, key: str, d: Decision, now: float) -> None:
        if d.wait_ms <= 0 or self.max_s <= 0:
            return
        if len(self._entries) >= self.max_entries:
            self._entries = {k: v for k, v in self._entries.items() if v[1] > now}
            if len(self._entries) >= self.max_entries:
                del self._entries[min(self._entries, key=lambda k: self._entries[k][1])]
        self._entries[(rule, key)] = (now, now + min(d.wait_ms / 1000.0, self.max_s), d)

    def __len__(self) -> int:
        return len(self._entries)


class LocalLimiter:
    """The in-process fallback: a bucket for buckets, a fixed window for windows.

    It keeps this instance's share of each limit; bounded like the deny cache.
    """

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self._state: dict[tuple[str, str], list[float]] = {}
        self._in_flight: dict[tuple[str, str], int] = {}

    def hold(self, rule: str, key: str, share: int) -> Decision:
        """A concurrency rule in process: one unit held until `unhold`."""
        held = self._in_flight.get((rule, key), 0)
        if held >= share:
            return Decision(False, share, 0, 1000, 1000)
        self._in_flight[(rule, key)] = held + 1
        return Decision(True, share, share - held - 1, 0, 0)

    def unhold(self, rule: str, key: str) -> None:
        held = self._in_flight.get((rule, key), 0) - 1
        if held > 0:
            self._in_flight[(rule, key)] = held
        else:
            self._in_flight.pop((rule, key), None)

    def decide(self, rule: str, key: str, spec: Algorithm, share: int, now: float) -> Decision:
        assert not isinstance(spec, Concurrency), "concurrency goes through hold()"
        if len(self._state) >= self.max_entries:
            self._state.clear()
        st = self._state.setdefault((rule, key), [])
        if isinstance(spec, (TokenBucket, LeakyBucket)):
            count, per_ms = (
                (spec.refill_count, spec.refill_ms)
                if isinstance(spec, TokenBucket)
                else (spec.leak_count, spec.leak_ms)
            )
            rate = count * share / _limit_of(spec) / per_ms  # units per ms
            if not st:
                st += [float(share), now]
            tokens = min(float(share), st[0] + (now - st[1]) * 1000 * rate)
            st[0], st[1] = tokens, now
            reset_ms = math.ceil((share - tokens) / rate) if rate else 0
            if tokens >= 1:
                st[0] = tokens - 1
                return Decision(True, share, int(st[0]), 0, math.ceil((share - st[0]) / rate))
            return Decision(False, share, 0, math.ceil((1 - tokens) / rate), reset_ms)
        if isinstance(spec, Quota):
            # The calendar period in the quota's zone (zoneinfo for names).
            end = spec.period_end(now)
            if not st or st[0] != end:
                st[:] = [end, 0.0]
            reset_ms = max(1, math.ceil((end - now) * 1000))
            if st[1] + 1 <= share:
                st[1] += 1
                return Decision(True, share, int(share - st[1]), 0, reset_ms)
            return Decision(False, share, 0, reset_ms, reset_ms)
        window_ms = spec.window_ms
        start = math.floor(now * 1000 / window_ms) * window_ms
        if not st or st[0] != start:
            st[:] = [float(start), 0.0]
        reset_ms = max(1, math.ceil(start + window_ms - now * 1000))
        if st[1] + 1 <= share:
            st[1] += 1
            return Decision(True, share, int(share - st[1]), 0, reset_ms)
        return Decision(False, share, 0, reset_ms, reset_ms)


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
        deadline: float = 0.005,
        deny_cache_max: float = 1.0,
        instances: int = 1,
        breaker_failures: int = 5,
        breaker_open_for: float = 1.0,
        x_ratelimit_headers: bool = False,
        on_missing_key: str = "deny",
    ) -> None:
        if not rules:
            raise BadArgument("at least one rule")
        if len({r.name for r in rules}) != len(rules):
            raise BadArgument("rule names must differ")
        if instances < 1:
            raise BadArgument("instances must be at least 1")
        self.app = app
        self.client = client if isinstance(client, AsyncClient) else AsyncClient(client)
        self.rules = list(rules)
        self.key = key
        self.fallback = FallbackMode(fallback)
        self.deadline = deadline
        self.deny_cache = DenyCache(deny_cache_max)
        self.local = LocalLimiter()
        self.instances = instances
        self.breaker_failures = breaker_failures
        self.breaker_open_for = breaker_open_for
        self.x_ratelimit_headers = x_ratelimit_headers
        self.on_missing_key = on_missing_key
        self.stats = Stats()
        self._algorithms: list[Algorithm] | None = None
        if not any(isinstance(r.spec, Policy) for r in self.rules):
            self._algorithms = [r.spec for r in self.rules]  # type: ignore[misc]
            check_zones(self.rules, self._algorithms)
        self._ready = False
        self._failures = 0
        self._open = False
        self._open_until = 0.0
        self._probe: asyncio.Task[None] | None = None
        self._releasing: set[asyncio.Task[None]] = set()

    # -- setup ----------------------------------------------------------

    async def startup(self) -> None:
        """`MODULE LIST` and the rules' policies; done by the first request if
        not called (raises `ModuleNotLoaded`, `BadArgument` for a missing policy)."""
        await self._resolve()

    async def _resolve(self) -> None:
        """The algorithm of each rule (policies read once, for `w` and the fallback)."""
        if self._ready:
            return
        await self.client.check_module()
        if self._algorithms is None:
            algos: list[Algorithm] = []
            for r in self.rules:
                if isinstance(r.spec, Policy):
                    p = await self.client.policy_get(r.spec.name)
                    if p is None:
                        raise BadArgument(f"policy {r.spec.name!r} is not set on the server")
                    algos.append(spec_from_policy(p))
                else:
                    algos.append(r.spec)
            check_zones(self.rules, algos)
            self._algorithms = algos
        self._ready = True

    def share(self, algo: Algorithm) -> int:
        total = _limit_of(algo)
        return max(1, min(total, math.ceil(total / self.instances * 1.1)))

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
            return self._decided_locally(identity, keys, now)
        held: list[Held] = []
        try:
            self.stats.redis_calls += 1
            d, index = await asyncio.wait_for(self._call(keys, held), self.deadline)
        except asyncio.TimeoutError:
            self.stats.redis_timeouts += 1
            self._failed(now)
            self._release_later(held)
            return self._decided_locally(identity, keys, now)
        except (RedisError, OSError) as e:
            self.stats.redis_errors += 1
            log.warning("redis-ratelimit: Redis failed (%s); the fallback decides", e)
            self._failed(now)
            self._release_later(held)
            return self._decided_locally(identity, keys, now)
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
        self, identity: str, keys: list[str], now: float
    ) -> tuple[Decision, int, str, list[Held]]:
        d, index, held = self._fallback(identity, keys, now)
        return d, index, "fallback", held

    def _algorithm(self, index: int) -> Algorithm | None:
        algos = self._algorithms or []
        return algos[index] if index < len(algos) else None

    async def _call(self, keys: list[str], held: list[Held]) -> tuple[Decision, int]:
        """Leases first (each its own call: RL.ALL refuses CONCURRENCY), then
        the rate rules in one call; a denial gives the leases back."""
        algos = self._algorithms or [r.spec for r in self.rules]  # type: ignore[misc]
        leased = [i for i, a in enumerate(algos) if isinstance(a, Concurrency)]
        rated = [i for i in range(len(self.rules)) if i not in leased]
        decisions: list[tuple[Decision, int]] = []
        for i in leased:
            d = await self.client.limit(keys[i], self.rules[i].spec)
            if d.lease is not None:
                held.append((keys[i], self.rules[i].name, d.lease))
            if not d.allowed:
                return d, i
            decisions.append((d, i))
        if len(rated) == 1:
            i = rated[0]
            d = await self.client.limit(keys[i], self.rules[i].spec)
            if not d.allowed:
                return d, i
            decisions.append((d, i))
        elif rated:
            d = await self.client.all([(keys[i], self.rules[i].spec) for i in rated])
            if not d.allowed:
                return d, rated[d.denied_by or 0]
            decisions.append((d, self._rated_rule_of(d, rated)))
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
            if lease is None:
                self.local.unhold(rule, key)
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

    def _fallback(
        self, identity: str, keys: list[str], now: float
    ) -> tuple[Decision, int, list[Held]]:
        """(decision, rule index, the local units an admission holds)."""
        algos = self._algorithms or []
        if self.fallback is FallbackMode.FAIL_OPEN or not algos:
            limit = _limit_of(algos[0]) if algos else 0
            self.stats.fallback_admitted += 1
            return Decision(True, limit, limit, 0, 0), 0, []
        if self.fallback is FallbackMode.FAIL_CLOSED:
            self.stats.fallback_denied += 1
            wait = math.ceil(self.breaker_open_for * 1000)
            return Decision(False, _limit_of(algos[0]), 0, wait, wait), 0, []
        best: tuple[Decision, int] | None = None
        held: list[Held] = []
        for i, (a, r, k) in enumerate(zip(algos, self.rules, keys)):
            if isinstance(a, Concurrency):
                d = self.local.hold(r.name, k, self.share(a))
                if d.allowed:
                    held.append((k, r.name, None))
            else:
                d = self.local.decide(r.name, k, a, self.share(a), time.time())
            if not d.allowed:
                self.stats.fallback_denied += 1
                for key, rule, _ in held:
                    self.local.unhold(rule, key)
                return d, i, []
            if best is None or d.remaining < best[0].remaining:
                best = d, i
        self.stats.fallback_admitted += 1
        assert best is not None
        return best[0], best[1], held

    # -- HTTP -----------------------------------------------------------

    def headers(self, d: Decision, index: int) -> list[tuple[bytes, bytes]]:
        algos = self._algorithms or []
        policy = ", ".join(
            f'"{r.name}";q={_limit_of(a)}' + ("" if w is None else f";w={w}")
            for r, a in zip(self.rules, algos)
            for w in [a.window_s()]
        )
        t = -(-d.reset_ms // 1000)
        out = [
            (b"ratelimit-policy", policy.encode()),
            (b"ratelimit", f'"{self.rules[index].name}";r={d.remaining};t={t}'.encode()),
        ]
        if not d.allowed and d.retry_after_s is not None:
            out.append((b"retry-after", str(d.retry_after_s).encode()))
        if self.x_ratelimit_headers:
            out += [
                (b"x-ratelimit-limit", str(d.limit).encode()),
                (b"x-ratelimit-remaining", str(d.remaining).encode()),
                (b"x-ratelimit-reset", str(t).encode()),
            ]
        return out

    async def _problem(
        self,
        send: Send,
        status: int,
        title: str,
        detail: str,
        extra: list[tuple[bytes, bytes]],
        violated: str | None,
    ) -> None:
        body: dict[str, object] = {
            "detail": detail,
            "status": status,
            "title": title,
            "type": QUOTA_EXCEEDED if status == 429 else "about:blank",
        }
        if violated is not None:
            body["violated-policies"] = [violated]
        raw = json.dumps(body, sort_keys=True).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/problem+json"),
                    (b"content-length", str(len(raw)).encode()),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": raw})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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
            d, index, held = self._fallback(identity, keys, time.monotonic())
        else:
            d, index, _, held = await self.decide(identity)
        extra = self.headers(d, index) if self._algorithms is not None else []
        if not d.allowed:
            name = self.rules[index].name
            leased = isinstance(self._algorithm(index), Concurrency)
            what = "concurrency limit" if leased else "rate limit"
            detail = (
                f"{what} {json.dumps(name)} exceeded; retry after {d.retry_after_s} s"
                if d.retry_after_s is not None
                else f"{what} {json.dumps(name)} exceeded; this request can never pass"
            )
            await self._problem(
                send,
                429,
                "Request cannot be satisfied as assigned quota has been exceeded",
                detail,
                extra,
                name,
            )
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
