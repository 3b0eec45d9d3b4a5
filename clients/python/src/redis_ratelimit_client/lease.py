"""Leases of `RL.CONCURRENCY`, held by `with client.lease(...)` or
`async with aclient.lease(...)`.

A lease ends when its block exits (`RL.RELEASE`, also on an exception or a
cancellation) or by itself `lease_ms` after it was granted or last renewed,
so a holder that crashes frees its units. With `renew=True` a background
thread (sync) or task (asyncio) renews it every third of `lease_ms`, for work
that may outlast it.

A release that fails (Redis away) is logged and not raised: the lease then
ends at its expiry, and the work it guarded has been done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from .decision import Decision
from .errors import InvalidArgument

if TYPE_CHECKING:
    from .aio import AsyncClient
    from .client import Client
    from .protocol import Key


log = logging.getLogger("redis_ratelimit_client")


class Lease:
    """A lease held on `key`: its `id`, the `decision` that granted it.

    `lost` turns True when a renewal answered 0 (the lease had ended: it
    expired, or its key was deleted), so the work may check it.
    """

    def __init__(self, client: Client, key: Key, decision: Decision, lease_ms: int | None) -> None:
        assert decision.lease is not None
        self.client = client
        self.key = key
        self.id: int = decision.lease
        self.decision = decision
        self.lease_ms = lease_ms
        self.released = False
        self.lost = False
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def renew(self, lease_ms: int | None = None) -> bool:
        """`RL.RENEW`: True if the lease was live and now ends `lease_ms` from now."""
        ms = lease_ms if lease_ms is not None else self.lease_ms
        if ms is None:
            raise InvalidArgument("renew needs lease_ms (a policy's lease: give renew_ms)")
        ok = self.client.renew(self.key, self.id, ms)
        if not ok:
            self.lost = True
        return ok

    def release(self) -> bool:
        """`RL.RELEASE` (once): True if the lease was still live."""
        self.stop_renewing()
        if self.released:
            return False
        self.released = True
        return self.client.release(self.key, self.id)

    def start_renewing(self, every: float) -> None:
        def run() -> None:
            while not self._stop.wait(every):
                try:
                    if not self.renew():
                        log.warning("redis-ratelimit: lease %d on %r had ended", self.id, self.key)
                        return
                except (RedisError, OSError) as e:
                    log.warning("redis-ratelimit: renewing lease %d failed (%s)", self.id, e)

        self._renewer = threading.Thread(target=run, name=f"rl-renew-{self.id}", daemon=True)
        self._renewer.start()

    def stop_renewing(self) -> None:
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()
        self._renewer = None

    def _end(self) -> None:
        try:
            self.release()
        except (RedisError, OSError) as e:
            log.warning(
                "redis-ratelimit: releasing lease %d failed (%s); it ends at its expiry", self.id, e
            )

    def __repr__(self) -> str:
        return f"Lease(key={self.key!r}, id={self.id}, released={self.released})"


class AsyncLease:
    """The asyncio form of `Lease`: `await lease.renew()`, `await lease.release()`."""

    def __init__(
        self, client: AsyncClient, key: Key, decision: Decision, lease_ms: int | None
    ) -> None:
        assert decision.lease is not None
        self.client = client
        self.key = key
        self.id: int = decision.lease
        self.decision = decision
        self.lease_ms = lease_ms
        self.released = False
        self.lost = False
        self._renewer: asyncio.Task[None] | None = None

    async def renew(self, lease_ms: int | None = None) -> bool:
        ms = lease_ms if lease_ms is not None else self.lease_ms
        if ms is None:
            raise InvalidArgument("renew needs lease_ms (a policy's lease: give renew_ms)")
        ok = await self.client.renew(self.key, self.id, ms)
        if not ok:
            self.lost = True
        return ok

    async def release(self) -> bool:
        await self.stop_renewing()
        if self.released:
            return False
        self.released = True
        return await self.client.release(self.key, self.id)

    def start_renewing(self, every: float) -> None:
        async def run() -> None:
            while True:
                await asyncio.sleep(every)
                try:
                    if not await self.renew():
                        log.warning("redis-ratelimit: lease %d on %r had ended", self.id, self.key)
                        return
                except (RedisError, OSError) as e:
                    log.warning("redis-ratelimit: renewing lease %d failed (%s)", self.id, e)

        self._renewer = asyncio.ensure_future(run())

    async def stop_renewing(self) -> None:
        task, self._renewer = self._renewer, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _end(self) -> None:
        # A task of its own, shielded: a cancelled holder still gives its units back.
        task = asyncio.ensure_future(self._release_logged())
        await asyncio.shield(task)

    async def _release_logged(self) -> None:
        try:
            await self.release()
        except (RedisError, OSError) as e:
            log.warning(
                "redis-ratelimit: releasing lease %d failed (%s); it ends at its expiry", self.id, e
            )

    def __repr__(self) -> str:
        return f"AsyncLease(key={self.key!r}, id={self.id}, released={self.released})"


def renew_interval(lease_ms: int | None, renew_every: float | None) -> float:
    if renew_every is not None:
        if renew_every <= 0:
            raise InvalidArgument("renew_every must be positive")
        return renew_every
    if lease_ms is None:
        raise InvalidArgument("renewing a policy's lease needs renew_ms")
    return lease_ms / 3000.0
