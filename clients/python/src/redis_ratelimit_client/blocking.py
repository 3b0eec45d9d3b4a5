"""Connections of their own for blocking acquires (`BLOCK timeout_ms`).

A blocked call holds its connection until the server replies, so it must
never run on a connection other calls share; and its socket timeout is the
BLOCK timeout plus a margin, not the few-ms deadline of a limiter call. Each
server (each cluster node) gets, lazily, a pool built from the same
connection class and settings as the caller's client, with only
`socket_timeout` changed. Pools are kept per (server, socket timeout), the
newest few, so an application with a handful of timeouts reuses its
connections.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import redis
import redis.asyncio as aioredis

#: How many (server, timeout) pools each client keeps.
MAX_POOLS = 8


def _pool_kwargs(connection_kwargs: dict[str, Any], socket_timeout: float | None) -> dict[str, Any]:
    kwargs = dict(connection_kwargs)
    kwargs["socket_timeout"] = socket_timeout
    # The connect timeout stays the caller's: only the wait for the reply grows.
    if kwargs.get("socket_connect_timeout") is None:
        kwargs["socket_connect_timeout"] = connection_kwargs.get("socket_timeout")
    return kwargs


class DedicatedPools:
    """Blocking connections for a sync client, per server and socket timeout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: OrderedDict[tuple[int, float | None], tuple[Any, redis.Redis]] = OrderedDict()

    def get(self, base: redis.Redis, socket_timeout: float | None) -> redis.Redis:
        pool = base.connection_pool
        key = (id(pool), socket_timeout)
        with self._lock:
            hit = self._pools.get(key)
            if hit is not None:
                self._pools.move_to_end(key)
                return hit[1]
            dedicated = redis.Redis(
                connection_pool=redis.ConnectionPool(
                    connection_class=pool.connection_class,
                    max_connections=getattr(pool, "max_connections", None),
                    **_pool_kwargs(pool.connection_kwargs, socket_timeout),
                )
            )
            # The base pool is kept beside it, so its id cannot be reused.
            self._pools[key] = (pool, dedicated)
            evicted = []
            while len(self._pools) > MAX_POOLS:
                evicted.append(self._pools.popitem(last=False)[1][1])
        for old in evicted:
            old.connection_pool.disconnect(inuse_connections=False)
        return dedicated

    def close(self) -> None:
        with self._lock:
            pools = [p for _, p in self._pools.values()]
            self._pools.clear()
        for p in pools:
            p.connection_pool.disconnect()


class AsyncDedicatedPools:
    """Blocking connections for an asyncio client: per server (a
    `redis.asyncio.Redis`'s pool or a cluster node) and socket timeout."""

    def __init__(self) -> None:
        self._pools: OrderedDict[tuple[int, float | None], tuple[Any, aioredis.Redis]] = (
            OrderedDict()
        )

    async def get(self, base: Any, socket_timeout: float | None) -> aioredis.Redis:
        """`base`: a `redis.asyncio.Redis` or a cluster `ClusterNode`."""
        source = base.connection_pool if isinstance(base, aioredis.Redis) else base
        key = (id(source), socket_timeout)
        hit = self._pools.get(key)
        if hit is not None:
            self._pools.move_to_end(key)
            return hit[1]
        max_connections = getattr(source, "max_connections", None)
        dedicated = aioredis.Redis(
            connection_pool=aioredis.ConnectionPool(
                connection_class=source.connection_class,
                max_connections=max_connections if isinstance(max_connections, int) else None,
                **_pool_kwargs(source.connection_kwargs, socket_timeout),
            )
        )
        self._pools[key] = (source, dedicated)
        while len(self._pools) > MAX_POOLS:
            old = self._pools.popitem(last=False)[1][1]
            await old.connection_pool.disconnect(inuse_connections=False)
        return dedicated

    async def close(self) -> None:
        pools = [p for _, p in self._pools.values()]
        self._pools.clear()
        for p in pools:
            await p.connection_pool.disconnect()
