"""Typed calls on redis-py: standalone, Sentinel-managed and `RedisCluster`.

Every limiter call is one command sent once on one connection to the master
that owns the key: the kit never retries a limiter write (a call that timed
out may have been admitted), whatever `retry` the redis-py client was built
with. A `MOVED` reply (nothing was executed) refreshes the cluster's slot
table and is the one case sent again.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, Union

import redis
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .model import (
    Algorithm,
    BadArgument,
    Decision,
    FixedWindow,
    HashWindow,
    LeakyBucket,
    LogEntry,
    ModuleNotLoaded,
    Policy,
    PolicyMode,
    ServerError,
    Sliding,
    Spec,
    TokenBucket,
    WrongType,
    _check_int,
    all_args,
    check_key,
    check_policy_name,
    decode,
    module_version,
    parse_log,
    parse_policy,
    policy_set_args,
    request_args,
    spec_args,
)

Key = Union[str, bytes]
Arg = Union[str, bytes, int]


def server_name(client: Any) -> str:
    """host:port (or the socket path) of a redis-py client, for messages."""
    kw = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    if "path" in kw:
        return f"unix:{kw['path']}"
    if "host" in kw:
        return f"{kw['host']}:{kw.get('port', 6379)}"
    name = getattr(client, "name", None)
    return str(name) if name else repr(client)


def map_error(exc: ResponseError, key: Key | None) -> Exception:
    text = str(exc)
    if text.startswith("WRONGTYPE"):
        shown = key.decode("utf-8", "replace") if isinstance(key, bytes) else (key or "")
        return WrongType(shown, text)
    return ServerError(text)


def is_moved(exc: ResponseError) -> bool:
    return type(exc).__name__ == "MovedError" or str(exc).startswith("MOVED")


_TAKES_COMMAND_NAME: dict[type, bool] = {}


def _takes_command_name(pool: Any) -> bool:
    """redis-py 5 requires `get_connection(command_name)`; 6+ deprecates it."""
    cls = type(pool)
    known = _TAKES_COMMAND_NAME.get(cls)
    if known is None:
        try:
            params = inspect.signature(cls.get_connection).parameters
            p = params.get("command_name")
            known = p is not None and p.default is inspect.Parameter.empty
        except (TypeError, ValueError):
            known = True
        _TAKES_COMMAND_NAME[cls] = known
    return known


def send_once(client: redis.Redis, args: Sequence[Arg]) -> Any:
    """Sends one command on one connection of `client`, without retries."""
    return send_many_once(client, [args])[0]


def send_many_once(client: redis.Redis, commands: Sequence[Sequence[Arg]]) -> list[Any]:
    """Sends commands in one write on one connection (one round trip), once.

    An error reply is raised after every reply is read, so the connection
    stays in step.
    """
    single: Any = getattr(client, "connection", None)  # single_connection_client
    pool = client.connection_pool
    borrowed = single is None
    conn: Any = single
    if borrowed:
        conn = pool.get_connection("RL") if _takes_command_name(pool) else pool.get_connection()
    try:
        conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        error: ResponseError | None = None
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except ResponseError as e:
                error = error or e
                replies.append(e)
        if error is not None:
            raise error
        return replies
    except (RedisConnectionError, RedisTimeoutError, OSError):
        conn.disconnect()
        raise
    finally:
        if borrowed:
            pool.release(conn)


class Client:
    """The module's commands on a redis-py client.

    `client` is a `redis.Redis` (also one from `Sentinel.master_for`) or a
    `redis.cluster.RedisCluster`. `check_module=True` asks `MODULE LIST` at
    once (every master in a cluster) and raises `ModuleNotLoaded` naming the
    server that lacks it.
    """

    def __init__(self, client: redis.Redis | RedisCluster, *, check_module: bool = True):
        self.redis = client
        self.is_cluster = isinstance(client, RedisCluster)
        self.module_version: int | None = None
        if check_module:
            self.check_module()

    @classmethod
    def from_url(cls, url: str, *, check_module: bool = True, **kwargs: Any) -> Client:
        """A client for `redis://...` (`rediss://`, `unix://`)."""
        return cls(redis.Redis.from_url(url, **kwargs), check_module=check_module)

    # -- transport --------------------------------------------------------

    def _masters(self) -> list[redis.Redis]:
        if self.is_cluster:
            rc = self.redis
            assert isinstance(rc, RedisCluster)
            return [rc.get_redis_connection(n) for n in rc.get_primaries()]
        assert isinstance(self.redis, redis.Redis)
        return [self.redis]

    def _send(self, key: Key | None, args: Sequence[Arg]) -> Any:
        return self._send_many(key, [args])[0]

    def _send_many(self, key: Key | None, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """Commands on one key, in one round trip to the key's master."""
        if not self.is_cluster:
            assert isinstance(self.redis, redis.Redis)
            try:
                return send_many_once(self.redis, commands)
            except ResponseError as e:
                raise map_error(e, key) from e
        rc = self.redis
        assert isinstance(rc, RedisCluster)
        for attempt in (0, 1):
            node = rc.get_node_from_key(key) if key is not None else rc.get_random_node()
            try:
                return send_many_once(rc.get_redis_connection(node), commands)
            except ResponseError as e:
                if is_moved(e) and attempt == 0:
                    rc.nodes_manager.initialize()
                    continue
                raise map_error(e, key) from e
        raise AssertionError("unreachable")

    def _everywhere(self, args: Sequence[Arg]) -> list[Any]:
        out = []
        for r in self._masters():
            try:
                out.append(send_once(r, args))
            except ResponseError as e:
                raise map_error(e, None) from e
        return out

    def check_module(self) -> int:
        """`MODULE LIST` on every master: the module's version (the lowest in
        a cluster), kept in `module_version`; `ModuleNotLoaded` names a server
        without it."""
        versions = []
        for r in self._masters():
            v = module_version(send_once(r, ["MODULE", "LIST"]))
            if v is None:
                raise ModuleNotLoaded(server_name(r))
            versions.append(v)
        self.module_version = low = min(versions)
        return low

    # -- limiters ---------------------------------------------------------

    def limit(
        self,
        key: Key,
        spec: Spec,
        cost: int = 1,
        *,
        force: bool = False,
        refund: int | None = None,
    ) -> Decision:
        """One limiter call: `RL.<ALGORITHM> key ...`, or `RL.HIT` for a Policy."""
        args = limit_args(key, spec, cost, force, refund)
        return Decision.from_reply(self._send(key, args))

    def token_bucket(
        self,
        key: Key,
        capacity: int,
        refill_count: int,
        refill_ms: int,
        cost: int = 1,
        *,
        force: bool = False,
        refund: int | None = None,
    ) -> Decision:
        return self.limit(
            key, TokenBucket(capacity, refill_count, refill_ms), cost, force=force, refund=refund
        )

    def leaky_bucket(
        self,
        key: Key,
        capacity: int,
        leak_count: int,
        leak_ms: int,
        cost: int = 1,
        *,
        force: bool = False,
        refund: int | None = None,
    ) -> Decision:
        return self.limit(
            key, LeakyBucket(capacity, leak_count, leak_ms), cost, force=force, refund=refund
        )

    def sliding(
        self,
        key: Key,
        limit: int,
        window_ms: int,
        cost: int = 1,
        *,
        force: bool = False,
        refund: int | None = None,
    ) -> Decision:
        return self.limit(key, Sliding(limit, window_ms), cost, force=force, refund=refund)

    def hash_window(
        self,
        key: Key,
        limit: int,
        window_ms: int,
        bucket_ms: int,
        cost: int = 1,
        *,
        force: bool = False,
        refund: int | None = None,
    ) -> Decision:
        return self.limit(
            key, HashWindow(limit, window_ms, bucket_ms), cost, force=force, refund=refund
        )

    def fixed_window(
        self,
        key: Key,
        limit: int,
        window_ms: int,
        cost: int = 1,
        *,
        force: bool = False,
        refund: int | None = None,
    ) -> Decision:
        return self.limit(key, FixedWindow(limit, window_ms), cost, force=force, refund=refund)

    def hit(
        self,
        policy: str,
        key: Key,
        cost: int = 1,
        *,
        force: bool = False,
        refund: int | None = None,
    ) -> Decision:
        """`RL.HIT policy key`: routed by `key` (argv[2]), not by the name."""
        return self.limit(key, Policy(policy), cost, force=force, refund=refund)

    def all(
        self, limits: Sequence[tuple[Key, Spec]], cost: int = 1, *, force: bool = False
    ) -> Decision:
        """`RL.ALL`: all or nothing; in a cluster the keys share one slot."""
        args = all_args(limits, cost, force)
        return Decision.from_reply(self._send(limits[0][0], args))

    # -- policies and the deny log ----------------------------------------

    def policy_set(
        self, name: str, spec: Algorithm, mode: PolicyMode = PolicyMode.ENFORCE, rollout: int = 100
    ) -> None:
        """`RL.POLICY SET` on every master."""
        self._everywhere(policy_set_args(name, spec, mode, rollout))

    def policy_get(self, name: str) -> dict[str, object] | None:
        return parse_policy(self._send(None, ["RL.POLICY", "GET", check_policy_name(name)]))

    def policy_del(self, name: str) -> bool:
        """`RL.POLICY DEL` on every master; True if any had it."""
        return any(int(r) for r in self._everywhere(["RL.POLICY", "DEL", check_policy_name(name)]))

    def policy_list(self) -> list[str]:
        names = decode(self._send(None, ["RL.POLICY", "LIST"]))
        return [str(n) for n in names] if isinstance(names, list) else []

    def log_get(self, count: int = 10) -> list[LogEntry]:
        """The newest denials (of every master in a cluster, newest first)."""
        _check_int("count", count, 0)
        entries = [e for r in self._everywhere(["RL.LOG", "GET", count]) for e in parse_log(r)]
        return sorted(entries, key=lambda e: e.unix_ms, reverse=True)[:count]

    def log_len(self) -> int:
        return sum(int(r) for r in self._everywhere(["RL.LOG", "LEN"]))

    def log_reset(self) -> None:
        self._everywhere(["RL.LOG", "RESET"])


def limit_args(key: Key, spec: Spec, cost: int, force: bool, refund: int | None) -> list[Arg]:
    check_key(key)
    req = request_args(cost, force=force, refund=refund)
    if isinstance(spec, Policy):
        return ["RL.HIT", spec.name, key, *req]
    if not isinstance(spec, (TokenBucket, LeakyBucket, Sliding, HashWindow, FixedWindow)):
        raise BadArgument(f"a spec must be an algorithm or a Policy, not {type(spec).__name__}")
    return [f"RL.{spec.ALGORITHM}", key, *spec_args(spec)[1:], *req]
