"""Typed calls on redis-py: standalone, Sentinel-managed and `RedisCluster`.

Every limiter call is one command sent once on one connection to the master
that owns the key: the kit never retries a limiter write (a call that timed
out may have been admitted), whatever `retry` the redis-py client was built
with. A `MOVED` reply (nothing was executed) refreshes the cluster's slot
table and is the one case sent again.

The commands' arguments and the replies' meaning are `protocol.py`'s, shared
with `aio.py`; the names this module exported before they moved there (the
`X as X` imports) stay importable from here.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Literal

import redis
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .blocking import DedicatedPools
from .calls import TypedCalls
from .decision import Decision
from .errors import BadArgument as BadArgument
from .errors import Denied as Denied
from .errors import InvalidArgument as InvalidArgument
from .errors import ModuleMissing as ModuleMissing
from .errors import ModuleNotLoaded as ModuleNotLoaded
from .errors import ServerError as ServerError
from .errors import WrongType as WrongType
from .errors import not_sent
from .lease import Lease, renew_interval
from .protocol import _TAKES_COMMAND_NAME as _TAKES_COMMAND_NAME
from .protocol import _UNKNOWN_RL as _UNKNOWN_RL
from .protocol import (
    LOG_LEN,
    LOG_RESET,
    MODULE_LIST,
    POLICY_LIST,
    Arg,
    Key,
    LogEntry,
    PolicyStats,
    acquire_deadline,
    all_args,
    block_args,
    is_moved,
    is_upto,
    lease_ms_of,
    lease_of,
    limit_args,
    loaded_version,
    log_get_args,
    map_error,
    outcome_args,
    parse_live,
    parse_log_len,
    parse_logs,
    parse_policy,
    parse_policy_del,
    parse_policy_list,
    policy_del_args,
    policy_get_args,
    policy_scale_args,
    policy_set_args,
    release_args,
    renew_args,
    server_name,
    stats_args,
    waiting,
)
from .protocol import _takes_command_name as _takes_command_name
from .protocol import check_key as check_key
from .protocol import check_lease as check_lease
from .protocol import check_lease_ms as check_lease_ms
from .protocol import decode as decode
from .protocol import module_version as module_version
from .protocol import parse_log as parse_log
from .protocol import request_args as request_args
from .protocol import spec_args as spec_args
from .request import Request as Request
from .request import RequestLike, deprecated_request, to_request
from .spec import ALGORITHMS as ALGORITHMS
from .spec import (
    Adapt,
    Algorithm,
    Concurrency,
    Policy,
    PolicyMode,
    Spec,
    Stages,
)
from .spec import FixedWindow as FixedWindow
from .spec import HashWindow as HashWindow
from .spec import LeakyBucket as LeakyBucket
from .spec import PeriodLike as PeriodLike
from .spec import Quota as Quota
from .spec import Sliding as Sliding
from .spec import TokenBucket as TokenBucket
from .spec import _check_int as _check_int
from .spec import check_policy_name as check_policy_name


def send_once(client: redis.Redis, args: Sequence[Arg]) -> Any:
    """Sends one command on one connection of `client`, without retries."""
    return send_many_once(client, [args])[0]


def connect_once(conn: Any) -> None:
    """Connects `conn` (a no-op when open) with one attempt. redis-py's
    `connect()` runs the connect and handshake under the client's `retry`
    (since redis-py 6, 10 times with backoff by default): against a stopped
    server one call then took some 11 socket timeouts plus seconds of
    backoff, far beyond the limiter's deadline."""
    if _connects_once(type(conn)):
        conn.connect_check_health(check_health=True, retry_socket_connect=False)
    else:
        conn.connect()  # an older redis-py: connect() retries only as the client says


def _connects_once(cls: type) -> bool:
    """Whether `cls` can connect without the client's retry (redis-py 6+)."""
    known = _CONNECTS_ONCE.get(cls)
    if known is None:
        once = getattr(cls, "connect_check_health", None)
        known = once is not None and "retry_socket_connect" in inspect.signature(once).parameters
        _CONNECTS_ONCE[cls] = known
    return known


_CONNECTS_ONCE: dict[type, bool] = {}


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
        try:
            connect_once(conn)  # a no-op on an open connection
        except BaseException as e:
            not_sent(e)
            raise
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


class Client(TypedCalls[Decision]):
    """The module's commands on a redis-py client.

    `client` is a `redis.Redis` (also one from `Sentinel.master_for`) or a
    `redis.cluster.RedisCluster`. `check_module=True` asks `MODULE LIST` at
    once (every master in a cluster) and raises `ModuleMissing` naming the
    server that lacks it.
    """

    def __init__(self, client: redis.Redis | RedisCluster, *, check_module: bool = True):
        self.redis = client
        self.is_cluster = isinstance(client, RedisCluster)
        self.module_version: int | None = None
        self._blocking = DedicatedPools()
        if check_module:
            self.check_module()

    def close(self) -> None:
        """Closes the connections `acquire` opened (not the redis-py client's)."""
        self._blocking.close()

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

    def _send_many(
        self,
        key: Key | None,
        commands: Sequence[Sequence[Arg]],
        via: Callable[[redis.Redis], redis.Redis] | None = None,
    ) -> list[Any]:
        """Commands on one key, in one round trip to the key's master (on a
        connection of `via(master)` when given)."""
        if not self.is_cluster:
            assert isinstance(self.redis, redis.Redis)
            target = via(self.redis) if via else self.redis
            try:
                return send_many_once(target, commands)
            except ResponseError as e:
                raise map_error(e, key, server_name(self.redis)) from e
        rc = self.redis
        assert isinstance(rc, RedisCluster)
        for attempt in (0, 1):
            node = rc.get_node_from_key(key) if key is not None else rc.get_random_node()
            target = rc.get_redis_connection(node)
            try:
                return send_many_once(via(target) if via else target, commands)
            except ResponseError as e:
                if is_moved(e) and attempt == 0:
                    rc.nodes_manager.initialize()
                    continue
                raise map_error(e, key, node.name) from e
        raise AssertionError("unreachable")

    def _everywhere(self, args: Sequence[Arg]) -> list[Any]:
        out = []
        for r in self._masters():
            try:
                out.append(send_once(r, args))
            except ResponseError as e:
                raise map_error(e, None, server_name(r)) from e
        return out

    def check_module(self) -> int:
        """`MODULE LIST` on every master: the module's version (the lowest in
        a cluster), kept in `module_version`; `ModuleMissing` names a server
        without it."""
        versions = []
        for r in self._masters():
            versions.append(loaded_version(send_once(r, MODULE_LIST), server_name(r)))
        self.module_version = low = min(versions)
        return low

    # -- limiters ---------------------------------------------------------

    def limit(
        self,
        key: Key,
        spec: Spec,
        request: RequestLike = None,
        **deprecated: Any,
    ) -> Decision:
        """One limiter call: `RL.<ALGORITHM> key ...`, or `RL.HIT` for a Policy."""
        req = deprecated_request(request, deprecated)
        args = limit_args(key, spec, req)
        return Decision.from_reply(self._send(key, args), upto=is_upto(req))

    def all(
        self,
        limits: Sequence[tuple[Key, Spec]],
        request: RequestLike = None,
        *,
        cost: int | None = None,
        force: bool | None = None,
    ) -> Decision:
        """`RL.ALL`: all or nothing; in a cluster the keys share one slot."""
        req = to_request(request, cost, force, refundable=False)
        args = all_args(limits, req)
        reply = self._send(limits[0][0], args)
        return Decision.from_reply(reply, all_reply=True, upto=is_upto(req))

    def release(self, key: Key, lease: int) -> bool:
        """`RL.RELEASE key lease`: True if the lease was live (it is now ended)."""
        return parse_live(self._send(key, release_args(key, lease)))

    def renew(self, key: Key, lease: int, lease_ms: int) -> bool:
        """`RL.RENEW key lease lease_ms`: True if the lease was live (it now
        ends `lease_ms` from now)."""
        return parse_live(self._send(key, renew_args(key, lease, lease_ms)))

    @contextlib.contextmanager
    def lease(
        self,
        key: Key,
        spec: Concurrency | Policy,
        request: RequestLike = None,
        *,
        cost: int | None = None,
        timeout_ms: int | None = None,
        renew: bool = False,
        renew_ms: int | None = None,
        renew_every: float | None = None,
    ) -> Iterator[Lease]:
        """Holds a lease for the `with` block, released on exit (also on an
        exception). Denied: raises `Denied` with the decision.

        `timeout_ms`: wait for it with `BLOCK` (as `acquire`; 0 waits without
        a limit). `renew`: renew it in a background thread every
        `renew_every` seconds (a third of the lease by default) with
        `renew_ms` (default: the spec's `lease_ms`; a policy's lease needs it).
        """
        req = to_request(request, cost, refundable=False)
        lease_ms = lease_ms_of(spec, req, renew_ms)
        every = renew_interval(lease_ms, renew_every) if renew else 0.0
        if timeout_ms is None:
            d = self.limit(key, spec, req)
        else:
            d = self.acquire(key, spec, req, timeout_ms=timeout_ms)
        held = lease_of(self, key, d, lease_ms, spec, Lease)
        if renew:
            held.start_renewing(every)
        try:
            yield held
        finally:
            held._end()

    # -- waiting: BLOCK ---------------------------------------------------

    def acquire(
        self,
        key: Key,
        spec: Spec,
        request: RequestLike = None,
        *,
        cost: int | None = None,
        timeout_ms: int,
    ) -> Decision:
        """Waits in the server (`BLOCK timeout_ms`, 0: without a limit) until
        the request is admitted, then returns the admission; a denial (the
        timeout passed, or it could never wait that little) is returned as
        the denial. An admitted leaky bucket returns after its `wait_ms`, when
        the caller may act.

        It runs on a connection of its own (never the client's shared ones),
        whose socket timeout is the BLOCK timeout plus max(1 s, 10 %). It is
        sent once, never retried."""
        req = waiting(to_request(request, cost))
        args = [*limit_args(key, spec, req), *block_args(timeout_ms)]
        reply = self._send_blocking(key, args, timeout_ms)
        d = Decision.from_reply(reply, upto=is_upto(req))
        return self._after_wait(d)

    def acquire_all(
        self,
        limits: Sequence[tuple[Key, Spec]],
        request: RequestLike = None,
        *,
        cost: int | None = None,
        timeout_ms: int,
    ) -> Decision:
        """`RL.ALL ... BLOCK timeout_ms`: waits until every limiter admits at once."""
        req = waiting(to_request(request, cost))
        args = [*all_args(limits, req), *block_args(timeout_ms)]
        reply = self._send_blocking(limits[0][0], args, timeout_ms)
        d = Decision.from_reply(reply, all_reply=True, upto=is_upto(req))
        return self._after_wait(d)

    def _send_blocking(self, key: Key, args: Sequence[Arg], timeout_ms: int) -> Any:
        deadline = acquire_deadline(timeout_ms)
        return self._send_many(key, [args], via=lambda r: self._blocking.get(r, deadline))[0]

    @staticmethod
    def _after_wait(d: Decision) -> Decision:
        if d.allowed and d.wait_ms > 0:
            time.sleep(d.wait_ms / 1000.0)
        return d

    # -- policies and the deny log ----------------------------------------

    def policy_set(
        self,
        name: str,
        spec: Algorithm,
        mode: PolicyMode = PolicyMode.ENFORCE,
        rollout: int = 100,
        *,
        adapt: Adapt | Literal["OFF"] | None = None,
        stages: Stages | None = None,
        window_ms: int | None = None,
    ) -> None:
        """`RL.POLICY SET` on every master; `adapt`, `stages` and
        `window_ms`: the policy's protection loop (`ADAPT OFF` with "OFF")."""
        args = policy_set_args(name, spec, mode, rollout, adapt, stages, window_ms)
        self._everywhere(args)

    def policy_scale(self, name: str, pct: int) -> None:
        """`RL.POLICY SCALE name pct` on every master: the policy's scale by hand."""
        self._everywhere(policy_scale_args(name, pct))

    def policy_stats(self, name: str) -> list[PolicyStats]:
        """`RL.POLICY STATS name` of every master."""
        return [PolicyStats.from_reply(x) for x in self._everywhere(stats_args(name))]

    def outcome(self, name: str, ok: int, errors: int, denied: int = 0) -> list[PolicyStats]:
        """`RL.OUTCOME name ok errors [DENIED n]` on every master (a
        `Protection` sends these in the background): each master's stats
        after it. `denied`: calls denied without the server (sent when > 0)."""
        args = outcome_args(name, ok, errors, denied)
        return [PolicyStats.from_reply(x) for x in self._everywhere(args)]

    def policy_get(self, name: str) -> dict[str, object] | None:
        return parse_policy(self._send(None, policy_get_args(name)))

    def policy_del(self, name: str) -> bool:
        """`RL.POLICY DEL` on every master; True if any had it."""
        return parse_policy_del(self._everywhere(policy_del_args(name)))

    def policy_list(self) -> list[str]:
        return parse_policy_list(self._send(None, POLICY_LIST))

    def log_get(self, count: int = 10) -> list[LogEntry]:
        """The newest denials (of every master in a cluster, newest first)."""
        return parse_logs(self._everywhere(log_get_args(count)), count)

    def log_len(self) -> int:
        return parse_log_len(self._everywhere(LOG_LEN))

    def log_reset(self) -> None:
        self._everywhere(LOG_RESET)
