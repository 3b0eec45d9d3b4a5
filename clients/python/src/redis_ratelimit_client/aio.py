"""The typed calls on `redis.asyncio`: standalone, Sentinel-managed and cluster.

The same calls as `redis_ratelimit_client.Client`, awaited; each is one command sent
once to the master that owns the key, never retried by the kit. Their
arguments and the replies' meaning are `protocol.py`'s, shared with
`client.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Coroutine, Sequence
from typing import Any, Callable, Literal

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .blocking import AsyncDedicatedPools
from .calls import TypedCalls
from .decision import Decision
from .errors import ModuleMissing as ModuleMissing
from .errors import ModuleNotLoaded as ModuleNotLoaded
from .errors import not_sent
from .lease import AsyncLease, renew_interval
from .protocol import (
    LOG_LEN,
    LOG_RESET,
    MODULE_LIST,
    POLICY_LIST,
    Arg,
    Key,
    LogEntry,
    PolicyStats,
    _takes_command_name,
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
from .protocol import check_key as check_key
from .protocol import check_lease as check_lease
from .protocol import check_lease_ms as check_lease_ms
from .protocol import decode as decode
from .protocol import module_version as module_version
from .protocol import parse_log as parse_log
from .request import Request as Request
from .request import RequestLike, deprecated_request, to_request
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


async def send_once(client: aioredis.Redis, args: Sequence[Arg]) -> Any:
    """Sends one command on one connection of `client`, without retries."""
    return (await send_many_once(client, [args]))[0]


async def send_many_once(client: aioredis.Redis, commands: Sequence[Sequence[Arg]]) -> list[Any]:
    """Sends commands in one write on one connection (one round trip), once."""
    pool = client.connection_pool
    if _takes_command_name(pool):
        conn = await pool.get_connection("RL")
    else:
        conn = await pool.get_connection()
    try:
        try:
            await conn.connect()  # a no-op on an open connection
        except BaseException as e:
            not_sent(e)
            if isinstance(e, (RedisConnectionError, RedisTimeoutError, OSError)):
                await conn.disconnect()
            raise
        return await _exchange(conn, commands)
    finally:
        await pool.release(conn)


async def _exchange(conn: Any, commands: Sequence[Sequence[Arg]]) -> list[Any]:
    """Writes commands at once on `conn` and reads every reply; an error
    reply is raised after all are read, so the connection stays in step. A
    connection that failed is closed."""
    try:
        await conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        error: ResponseError | None = None
        for _ in commands:
            try:
                replies.append(await conn.read_response())
            except ResponseError as e:
                error = error or e
                replies.append(e)
        if error is not None:
            raise error
        return replies
    except (RedisConnectionError, RedisTimeoutError, OSError):
        await conn.disconnect()
        raise


class AsyncClient(TypedCalls[Coroutine[Any, Any, Decision]]):
    """The module's commands on `redis.asyncio.Redis` or its `RedisCluster`.

    Build it with `await AsyncClient.create(client)`, which checks
    `MODULE LIST` (every master in a cluster).
    """

    def __init__(self, client: aioredis.Redis | AsyncRedisCluster):
        self.redis = client
        self.is_cluster = isinstance(client, AsyncRedisCluster)
        self.module_version: int | None = None
        self._blocking = AsyncDedicatedPools()

    async def close(self) -> None:
        """Closes the connections `acquire` opened (not the redis-py client's)."""
        await self._blocking.close()

    @classmethod
    async def create(
        cls, client: aioredis.Redis | AsyncRedisCluster, *, check_module: bool = True
    ) -> AsyncClient:
        self = cls(client)
        if check_module:
            await self.check_module()
        return self

    async def _node_call(self, node: Any, args: Sequence[Arg]) -> Any:
        return await node.execute_command(*args)

    async def _node_many(self, node: Any, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        if len(commands) == 1:
            return [await self._node_call(node, commands[0])]
        # A node's own connection, one write, every reply read, no retry.
        conn = node.acquire_connection()
        try:
            return await _exchange(conn, commands)
        finally:
            node.release(conn)

    async def _send(self, key: Key | None, args: Sequence[Arg]) -> Any:
        return (await self._send_many(key, [args]))[0]

    async def _send_many(
        self,
        key: Key | None,
        commands: Sequence[Sequence[Arg]],
        via: Callable[[Any], Awaitable[aioredis.Redis]] | None = None,
    ) -> list[Any]:
        """Commands on one key, in one round trip to its master (on a
        connection of `await via(master or node)` when given)."""
        if not self.is_cluster:
            assert isinstance(self.redis, aioredis.Redis)
            target = await via(self.redis) if via else self.redis
            try:
                return await send_many_once(target, commands)
            except ResponseError as e:
                raise map_error(e, key, server_name(self.redis)) from e
        rc = self.redis
        assert isinstance(rc, AsyncRedisCluster)
        if not rc.nodes_manager.default_node:
            await rc.initialize()
        for attempt in (0, 1):
            if key is not None:
                k = key.decode() if isinstance(key, bytes) else key
                node = rc.get_node_from_key(k)
            else:
                node = rc.get_random_node()
            try:
                if via is not None:
                    return await send_many_once(await via(node), commands)
                return await self._node_many(node, commands)
            except ResponseError as e:
                if is_moved(e) and attempt == 0:
                    await rc.nodes_manager.initialize()
                    continue
                raise map_error(e, key, node.name if node else "the cluster") from e
        raise AssertionError("unreachable")

    async def _everywhere(self, args: Sequence[Arg]) -> list[Any]:
        server = server_name(self.redis)
        try:
            if not self.is_cluster:
                assert isinstance(self.redis, aioredis.Redis)
                return [await send_once(self.redis, args)]
            rc = self.redis
            assert isinstance(rc, AsyncRedisCluster)
            if not rc.nodes_manager.default_node:
                await rc.initialize()
            out = []
            for n in rc.get_primaries():
                server = n.name
                out.append(await self._node_call(n, args))
            return out
        except ResponseError as e:
            raise map_error(e, None, server) from e

    async def check_module(self) -> int:
        """`MODULE LIST` on every master: the module's version (the lowest in
        a cluster), kept in `module_version`."""
        if not self.is_cluster:
            assert isinstance(self.redis, aioredis.Redis)
            reply = await send_once(self.redis, MODULE_LIST)
            self.module_version = v = loaded_version(reply, server_name(self.redis))
            return v
        rc = self.redis
        assert isinstance(rc, AsyncRedisCluster)
        if not rc.nodes_manager.default_node:
            await rc.initialize()
        versions = []
        for n in rc.get_primaries():
            versions.append(loaded_version(await self._node_call(n, MODULE_LIST), n.name))
        self.module_version = low = min(versions)
        return low

    async def limit(
        self,
        key: Key,
        spec: Spec,
        request: RequestLike = None,
        **deprecated: Any,
    ) -> Decision:
        """One limiter call: `RL.<ALGORITHM> key ...`, or `RL.HIT` for a Policy."""
        req = deprecated_request(request, deprecated)
        args = limit_args(key, spec, req)
        return Decision.from_reply(await self._send(key, args), upto=is_upto(req))

    async def all(
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
        reply = await self._send(limits[0][0], args)
        return Decision.from_reply(reply, all_reply=True, upto=is_upto(req))

    async def release(self, key: Key, lease: int) -> bool:
        return parse_live(await self._send(key, release_args(key, lease)))

    async def renew(self, key: Key, lease: int, lease_ms: int) -> bool:
        return parse_live(await self._send(key, renew_args(key, lease, lease_ms)))

    @contextlib.asynccontextmanager
    async def lease(
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
    ) -> AsyncIterator[AsyncLease]:
        """`async with`: as `Client.lease`, renewing in a background task; the
        release also runs when the block is cancelled."""
        req = to_request(request, cost, refundable=False)
        lease_ms = lease_ms_of(spec, req, renew_ms)
        every = renew_interval(lease_ms, renew_every) if renew else 0.0
        if timeout_ms is None:
            d = await self.limit(key, spec, req)
        else:
            d = await self.acquire(key, spec, req, timeout_ms=timeout_ms)
        held: AsyncLease = lease_of(self, key, d, lease_ms, spec, AsyncLease)
        if renew:
            held.start_renewing(every)
        try:
            yield held
        finally:
            await held._end()

    async def acquire(
        self,
        key: Key,
        spec: Spec,
        request: RequestLike = None,
        *,
        cost: int | None = None,
        timeout_ms: int,
    ) -> Decision:
        """As `Client.acquire`, awaited: on a connection of its own, with the
        BLOCK timeout plus max(1 s, 10 %) as its deadline, sent once; an
        admitted leaky bucket resolves after its `wait_ms`."""
        req = waiting(to_request(request, cost))
        args = [*limit_args(key, spec, req), *block_args(timeout_ms)]
        reply = await self._send_blocking(key, args, timeout_ms)
        d = Decision.from_reply(reply, upto=is_upto(req))
        return await self._after_wait(d)

    async def acquire_all(
        self,
        limits: Sequence[tuple[Key, Spec]],
        request: RequestLike = None,
        *,
        cost: int | None = None,
        timeout_ms: int,
    ) -> Decision:
        req = waiting(to_request(request, cost))
        args = [*all_args(limits, req), *block_args(timeout_ms)]
        reply = await self._send_blocking(limits[0][0], args, timeout_ms)
        d = Decision.from_reply(reply, all_reply=True, upto=is_upto(req))
        return await self._after_wait(d)

    async def _send_blocking(self, key: Key, args: Sequence[Arg], timeout_ms: int) -> Any:
        deadline = acquire_deadline(timeout_ms)

        async def via(base: Any) -> aioredis.Redis:
            return await self._blocking.get(base, deadline)

        return (await self._send_many(key, [args], via=via))[0]

    @staticmethod
    async def _after_wait(d: Decision) -> Decision:
        if d.allowed and d.wait_ms > 0:
            await asyncio.sleep(d.wait_ms / 1000.0)
        return d

    async def policy_set(
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
        await self._everywhere(args)

    async def policy_scale(self, name: str, pct: int) -> None:
        """`RL.POLICY SCALE name pct` on every master: the policy's scale by hand."""
        await self._everywhere(policy_scale_args(name, pct))

    async def policy_stats(self, name: str) -> list[PolicyStats]:
        """`RL.POLICY STATS name` of every master."""
        return [PolicyStats.from_reply(x) for x in await self._everywhere(stats_args(name))]

    async def outcome(self, name: str, ok: int, errors: int, denied: int = 0) -> list[PolicyStats]:
        """`RL.OUTCOME name ok errors [DENIED n]` on every master (a
        `Protection` sends these in the background): each master's stats
        after it. `denied`: calls denied without the server (sent when > 0)."""
        args = outcome_args(name, ok, errors, denied)
        return [PolicyStats.from_reply(x) for x in await self._everywhere(args)]

    async def policy_get(self, name: str) -> dict[str, object] | None:
        return parse_policy(await self._send(None, policy_get_args(name)))

    async def policy_del(self, name: str) -> bool:
        return parse_policy_del(await self._everywhere(policy_del_args(name)))

    async def policy_list(self) -> list[str]:
        return parse_policy_list(await self._send(None, POLICY_LIST))

    async def log_get(self, count: int = 10) -> list[LogEntry]:
        args = log_get_args(count)
        return parse_logs(await self._everywhere(args), count)

    async def log_len(self) -> int:
        return parse_log_len(await self._everywhere(LOG_LEN))

    async def log_reset(self) -> None:
        await self._everywhere(LOG_RESET)
