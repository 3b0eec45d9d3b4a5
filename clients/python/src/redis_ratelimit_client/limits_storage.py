"""A storage for the `limits` library (5.x), on the module's native commands.

Importing `redis_ratelimit_client` registers the schemes (`limits` registers a
storage class by its `STORAGE_SCHEME` when the class is created):

- `redis+rl://[user:password@]host:port[/db]`, `rediss+rl://...` (TLS),
  `redis+rl+unix:///path/to/redis.sock[?db=n]`, `redis+rl+cluster://h1:p1,h2:p2`,
  `redis+rl+sentinel://h1:p1,h2:p2/service_name`: `RLStorage`
- the same with `async+` in front (`async+redis+rl://...`,
  `async+rediss+rl://...`, `async+redis+rl+unix://...`,
  `async+redis+rl+cluster://...`, `async+redis+rl+sentinel://...`):
  `AsyncRLStorage`

What each strategy runs:

- moving window: `RL.SLIDING` (exact, native). `get_moving_window` derives
  the oldest entry's time from a peek: after a `COST 0` peek answers
  `remaining` r, a peek of `COST r+1` (which cannot pass) answers in
  `wait_ms` the time until the oldest entry leaves; the oldest entry was
  made at `now + wait_ms - window`. Both peeks run in one server-side script,
  atomically, and write nothing; it is sent by its SHA1 (`EVALSHA`), in full
  only when a server answers `NOSCRIPT`.
- sliding-window counter: `RL.HASHWINDOW` with 10 buckets per window (native,
  fixed memory, O(1)); the decision is the module's: the sum of the buckets
  covering the window plus the cost must fit the limit. `get_sliding_window`
  answers that sum as the current window's count (the previous count 0),
  with the time until its oldest unit leaves, from the same two peeks.
- fixed window: plain counters (`INCRBY` + `EXPIRE NX` in one round trip),
  because `limits` asks the storage only for `incr`, without the limit.
"""

from __future__ import annotations

import hashlib
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

import redis
from limits.aio.storage import MovingWindowSupport as AsyncMovingWindowSupport
from limits.aio.storage import SlidingWindowCounterSupport as AsyncSlidingWindowCounterSupport
from limits.aio.storage import Storage as AsyncStorage
from limits.errors import ConfigurationError
from limits.storage import MovingWindowSupport, SlidingWindowCounterSupport, Storage
from redis.exceptions import NoScriptError

from .aio import AsyncClient
from .client import Client
from .errors import RateLimitError, ServerError
from .protocol import Arg
from .spec import MAX_PARAM

#: Buckets per window of the sliding-window counter (`RL.HASHWINDOW`).
SLIDING_COUNTER_BUCKETS = 10

# Two peeks, atomically: `COST 0` answers remaining r; `COST r+1`, which
# cannot pass, answers in wait_ms the time until the oldest unit leaves.
# Neither consumes (a call that cannot pass changes nothing); should the
# clock have moved between them and the second been admitted, it is given
# back at once. ARGV: the command, then its parameters after the key.
OLDEST_PEEK = """
local args = {KEYS[1]}
for i = 2, #ARGV do args[#args + 1] = ARGV[i] end
local n = #args
args[n + 1] = 'COST'
args[n + 2] = 0
local a = redis.call(ARGV[1], unpack(args))
local count = a[2] - a[3]
if count <= 0 then return {0, 0} end
args[n + 2] = a[3] + 1
local b = redis.call(ARGV[1], unpack(args))
if b[1] == 1 then
  args[n + 1] = 'REFUND'
  redis.call(ARGV[1], unpack(args))
end
return {count, b[4]}
"""
#: The script's SHA1: peeks send `EVALSHA`, and `EVAL` (which loads it) only
#: when a server answers `NOSCRIPT` (a restart, a `SCRIPT FLUSH`, a new node).
OLDEST_PEEK_SHA = hashlib.sha1(OLDEST_PEEK.encode()).hexdigest()


def is_noscript(e: ServerError) -> bool:
    return isinstance(e.__cause__, NoScriptError)


def with_script(args: list[Arg]) -> list[Arg]:
    """An `EVALSHA` of the peek script as the `EVAL` that loads it."""
    assert args[0] == "EVALSHA"
    return ["EVAL", OLDEST_PEEK, *args[2:]]


def _uri_parts(uri: str) -> tuple[str, urllib.parse.ParseResult]:
    parsed = urllib.parse.urlparse(uri)
    return parsed.scheme, parsed


def _locations(parsed: urllib.parse.ParseResult) -> list[tuple[str, int]]:
    netloc = parsed.netloc.rsplit("@", 1)[-1]
    out = []
    for loc in netloc.split(","):
        sub = urllib.parse.urlparse(f"x://{loc.strip()}")
        if sub.hostname is None:
            raise ConfigurationError(f"missing host in {parsed.geturl()!r}")
        out.append((sub.hostname, sub.port or 6379))
    return out


#: The redis-py URL scheme of each standalone scheme.
_STANDALONE = {
    "redis+rl": "redis",
    "rediss+rl": "rediss",
    "redis+rl+unix": "unix",
    "async+redis+rl": "redis",
    "async+rediss+rl": "rediss",
    "async+redis+rl+unix": "unix",
}


def _redis_url(uri: str, parsed: urllib.parse.ParseResult) -> str:
    """The redis-py URL of a standalone URI; a missing host (or socket path)
    is named, not left to redis-py's "must specify one of the schemes"."""
    scheme = _STANDALONE[parsed.scheme]
    if scheme == "unix":
        if not parsed.path or parsed.path == "/":
            raise ConfigurationError(
                f"missing socket path in {uri!r}: write {parsed.scheme}:///path/to/redis.sock"
            )
        # urlunparse would drop the `//` of an empty netloc: unix:/path
        query = f"?{parsed.query}" if parsed.query else ""
        return f"unix://{parsed.netloc}{parsed.path}{query}"
    if not parsed.hostname:
        raise ConfigurationError(
            f"missing host in {uri!r}: write {parsed.scheme}://[user:password@]host[:port][/db]"
        )
    return urllib.parse.urlunparse(parsed._replace(scheme=scheme))


def _sentinel_args(
    uri: str, parsed: urllib.parse.ParseResult, options: dict[str, Any]
) -> tuple[list[tuple[str, int]], str, dict[str, Any]]:
    """(the Sentinels, the service name, the password for both)."""
    service = parsed.path.strip("/") or str(options.pop("service_name", ""))
    if not service:
        raise ConfigurationError(f"{parsed.scheme}:// needs the service name as its path")
    kw = {}
    if parsed.password:
        kw["password"] = urllib.parse.unquote(parsed.password)
    return _locations(parsed), service, kw


def sync_client_for(uri: str, options: dict[str, Any]) -> Any:
    scheme, parsed = _uri_parts(uri)
    if scheme in ("redis+rl", "rediss+rl", "redis+rl+unix"):
        return redis.Redis.from_url(_redis_url(uri, parsed), **options)
    if scheme == "redis+rl+cluster":
        from redis.cluster import ClusterNode, RedisCluster

        nodes = [ClusterNode(h, p) for h, p in _locations(parsed)]
        if parsed.password:
            options.setdefault("password", urllib.parse.unquote(parsed.password))
        return RedisCluster(startup_nodes=nodes, **options)
    if scheme == "redis+rl+sentinel":
        from redis.sentinel import Sentinel

        sentinels, service, kw = _sentinel_args(uri, parsed, options)
        return Sentinel(sentinels, sentinel_kwargs=kw, **options).master_for(service, **kw)
    raise ConfigurationError(f"unknown scheme {scheme!r}")


def async_client_for(uri: str, options: dict[str, Any]) -> Any:
    scheme, parsed = _uri_parts(uri)
    import redis.asyncio as aioredis

    if scheme in ("async+redis+rl", "async+rediss+rl", "async+redis+rl+unix"):
        return aioredis.Redis.from_url(_redis_url(uri, parsed), **options)
    if scheme == "async+redis+rl+cluster":
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        nodes = [ClusterNode(h, p) for h, p in _locations(parsed)]
        if parsed.password:
            options.setdefault("password", urllib.parse.unquote(parsed.password))
        return RedisCluster(startup_nodes=nodes, **options)
    if scheme == "async+redis+rl+sentinel":
        from redis.asyncio.sentinel import Sentinel as AsyncSentinel

        sentinels, service, kw = _sentinel_args(uri, parsed, options)
        return AsyncSentinel(sentinels, sentinel_kwargs=kw, **options).master_for(service, **kw)
    raise ConfigurationError(f"unknown scheme {scheme!r}")


class _Keys:
    """Key names, and what each limits call sends."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def counter(self, key: str) -> str:
        return f"{self.prefix}:{key}"

    def moving(self, key: str) -> str:
        return f"{self.prefix}:mw:{key}"

    def sliding(self, key: str) -> str:
        return f"{self.prefix}:swc:{key}"

    @staticmethod
    def window_ms(expiry: int) -> int:
        return int(expiry) * 1000

    def incr(self, key: str, expiry: int, amount: int) -> list[list[Arg]]:
        from .spec import _check_int

        _check_int("expiry", expiry, 1)
        _check_int("amount", amount, 0)
        k = self.counter(key)
        return [["INCRBY", k, amount], ["EXPIRE", k, int(expiry), "NX"]]

    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int) -> list[Arg]:
        return ["RL.SLIDING", self.moving(key), limit, self.window_ms(expiry), "COST", amount]

    def moving_peek(self, key: str, limit: int, expiry: int) -> list[Arg]:
        return [
            "EVALSHA",
            OLDEST_PEEK_SHA,
            1,
            self.moving(key),
            "RL.SLIDING",
            limit,
            self.window_ms(expiry),
        ]

    @staticmethod
    def moving_window(reply: Sequence[int], expiry: int) -> tuple[float, int]:
        now = time.time()
        count, wait_ms = int(reply[0]), int(reply[1])
        if count <= 0:
            return now, 0
        return now + wait_ms / 1000.0 - expiry, count

    def acquire_sliding(self, key: str, limit: int, expiry: int, amount: int) -> list[Arg]:
        window = self.window_ms(expiry)
        return [
            "RL.HASHWINDOW",
            self.sliding(key),
            limit,
            window,
            window // SLIDING_COUNTER_BUCKETS,
            "COST",
            amount,
        ]

    def sliding_peek(self, key: str, expiry: int) -> list[Arg]:
        # The sum of the buckets does not depend on the limit: peek with the
        # largest one, which cannot deny at COST 0. The second peek of the
        # script (COST remaining + 1) answers when the oldest unit leaves.
        window = self.window_ms(expiry)
        return [
            "EVALSHA",
            OLDEST_PEEK_SHA,
            1,
            self.sliding(key),
            "RL.HASHWINDOW",
            MAX_PARAM,
            window,
            window // SLIDING_COUNTER_BUCKETS,
        ]

    @staticmethod
    def sliding_window(reply: Sequence[int], expiry: int) -> tuple[int, float, int, float]:
        count, wait_ms = int(reply[0]), int(reply[1])
        if count <= 0:
            return 0, 0.0, 0, 0.0
        # limits takes `ttl % expiry` as the time to the reset: keep it inside
        # (a unit less than a bucket old may leave up to a bucket after expiry).
        ttl = min(wait_ms / 1000.0, expiry - 0.001)
        return 0, 0.0, count, ttl


def _check_limit_args(limit: int, expiry: int, amount: int) -> None:
    from .spec import _check_int

    _check_int("limit", limit, 1)
    _check_int("expiry", expiry, 1)
    _check_int("amount", amount, 0)


class RLStorage(Storage, MovingWindowSupport, SlidingWindowCounterSupport):
    """`limits` storage on the module: `redis+rl://host:port`.

    `options` go to the redis-py client (`redis.Redis.from_url`,
    `RedisCluster`, `Sentinel`), except `key_prefix` (default `LIMITS`) and
    `connection` (an existing redis-py client to use instead).
    """

    STORAGE_SCHEME = [
        "redis+rl",
        "rediss+rl",
        "redis+rl+unix",
        "redis+rl+cluster",
        "redis+rl+sentinel",
    ]
    DEPENDENCIES = ["redis"]

    def __init__(self, uri: str, wrap_exceptions: bool = False, **options: Any) -> None:
        self.keys = _Keys(str(options.pop("key_prefix", "LIMITS")))
        conn = options.pop("connection", None)
        self.redis = conn if conn is not None else sync_client_for(uri, dict(options))
        self._client: Client | None = None
        super().__init__(uri, wrap_exceptions=wrap_exceptions)

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return (redis.RedisError, RateLimitError)

    @property
    def client(self) -> Client:
        # MODULE LIST on first use, not at construction: an app must start
        # while Redis is down (flask-limiter's swallow_errors decides then).
        if self._client is None:
            self._client = Client(self.redis, check_module=True)
        return self._client

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        return int(
            self.client._send_many(self.keys.counter(key), self.keys.incr(key, expiry, amount))[0]
        )

    def get(self, key: str) -> int:
        value = self.client._send(self.keys.counter(key), ["GET", self.keys.counter(key)])
        return int(value or 0)

    def get_expiry(self, key: str) -> float:
        pttl = int(self.client._send(self.keys.counter(key), ["PTTL", self.keys.counter(key)]))
        return time.time() + max(pttl, 0) / 1000.0

    def check(self) -> bool:
        """True if every master answers and has the module (`MODULE LIST`):
        flask-limiter's in-memory fallback returns to this storage on it."""
        try:
            Client(self.redis, check_module=True)
            return True
        except Exception:
            return False

    def reset(self) -> int | None:
        deleted = 0
        batch: list[Any] = []
        for k in self.redis.scan_iter(match=f"{self.keys.prefix}:*", count=1000):
            batch.append(k)
            if len(batch) >= 500:
                deleted += int(self.redis.delete(*batch))
                batch = []
        if batch:
            deleted += int(self.redis.delete(*batch))
        return deleted

    def clear(self, key: str) -> None:
        for k in (self.keys.counter(key), self.keys.moving(key), self.keys.sliding(key)):
            self.client._send(k, ["DEL", k])

    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        _check_limit_args(limit, expiry, amount)
        reply = self.client._send(
            self.keys.moving(key), self.keys.acquire_entry(key, limit, expiry, amount)
        )
        return bool(int(reply[0]))

    def _peek(self, key: str, args: list[Arg]) -> Any:
        try:
            return self.client._send(key, args)
        except ServerError as e:
            if not is_noscript(e):
                raise
            return self.client._send(key, with_script(args))

    def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        _check_limit_args(limit, expiry, 0)
        reply = self._peek(self.keys.moving(key), self.keys.moving_peek(key, limit, expiry))
        return self.keys.moving_window(reply, expiry)

    def acquire_sliding_window_entry(
        self, key: str, limit: int, expiry: int, amount: int = 1
    ) -> bool:
        _check_limit_args(limit, expiry, amount)
        reply = self.client._send(
            self.keys.sliding(key), self.keys.acquire_sliding(key, limit, expiry, amount)
        )
        return bool(int(reply[0]))

    def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        reply = self._peek(self.keys.sliding(key), self.keys.sliding_peek(key, expiry))
        return self.keys.sliding_window(reply, expiry)

    def clear_sliding_window(self, key: str, expiry: int) -> None:
        self.client._send(self.keys.sliding(key), ["DEL", self.keys.sliding(key)])


class AsyncRLStorage(AsyncStorage, AsyncMovingWindowSupport, AsyncSlidingWindowCounterSupport):
    """The asyncio form: `async+redis+rl://host:port` (`redis.asyncio`)."""

    STORAGE_SCHEME = [
        "async+redis+rl",
        "async+rediss+rl",
        "async+redis+rl+unix",
        "async+redis+rl+cluster",
        "async+redis+rl+sentinel",
    ]
    DEPENDENCIES = ["redis"]

    def __init__(self, uri: str, wrap_exceptions: bool = False, **options: Any) -> None:
        self.keys = _Keys(str(options.pop("key_prefix", "LIMITS")))
        conn = options.pop("connection", None)
        self.redis = conn if conn is not None else async_client_for(uri, dict(options))
        self._client: AsyncClient | None = None
        super().__init__(uri, wrap_exceptions=wrap_exceptions)

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return (redis.RedisError, RateLimitError)

    async def client(self) -> AsyncClient:
        if self._client is None:
            self._client = await AsyncClient.create(self.redis, check_module=True)
        return self._client

    async def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        c = await self.client()
        replies = await c._send_many(self.keys.counter(key), self.keys.incr(key, expiry, amount))
        return int(replies[0])

    async def get(self, key: str) -> int:
        c = await self.client()
        return int(await c._send(self.keys.counter(key), ["GET", self.keys.counter(key)]) or 0)

    async def get_expiry(self, key: str) -> float:
        c = await self.client()
        pttl = int(await c._send(self.keys.counter(key), ["PTTL", self.keys.counter(key)]))
        return time.time() + max(pttl, 0) / 1000.0

    async def check(self) -> bool:
        """True if every master answers and has the module (`MODULE LIST`)."""
        try:
            await AsyncClient.create(self.redis, check_module=True)
            return True
        except Exception:
            return False

    async def reset(self) -> int | None:
        deleted = 0
        keys = [k async for k in self.redis.scan_iter(match=f"{self.keys.prefix}:*")]
        for i in range(0, len(keys), 500):
            deleted += int(await self.redis.delete(*keys[i : i + 500]))
        return deleted

    async def clear(self, key: str) -> None:
        c = await self.client()
        for k in (self.keys.counter(key), self.keys.moving(key), self.keys.sliding(key)):
            await c._send(k, ["DEL", k])

    async def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        _check_limit_args(limit, expiry, amount)
        c = await self.client()
        reply = await c._send(
            self.keys.moving(key), self.keys.acquire_entry(key, limit, expiry, amount)
        )
        return bool(int(reply[0]))

    async def _peek(self, key: str, args: list[Arg]) -> Any:
        c = await self.client()
        try:
            return await c._send(key, args)
        except ServerError as e:
            if not is_noscript(e):
                raise
            return await c._send(key, with_script(args))

    async def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        _check_limit_args(limit, expiry, 0)
        reply = await self._peek(self.keys.moving(key), self.keys.moving_peek(key, limit, expiry))
        return self.keys.moving_window(reply, expiry)

    async def acquire_sliding_window_entry(
        self, key: str, limit: int, expiry: int, amount: int = 1
    ) -> bool:
        _check_limit_args(limit, expiry, amount)
        c = await self.client()
        reply = await c._send(
            self.keys.sliding(key), self.keys.acquire_sliding(key, limit, expiry, amount)
        )
        return bool(int(reply[0]))

    async def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        reply = await self._peek(self.keys.sliding(key), self.keys.sliding_peek(key, expiry))
        return self.keys.sliding_window(reply, expiry)

    async def clear_sliding_window(self, key: str, expiry: int) -> None:
        c = await self.client()
        await c._send(self.keys.sliding(key), ["DEL", self.keys.sliding(key)])
