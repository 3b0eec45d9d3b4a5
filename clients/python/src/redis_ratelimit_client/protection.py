"""The protection loop, the kit's side (SPEC "The protection loop").

The server decides, once for every instance, a policy's scale (ADAPT: the
limits shrink while its error rate is high) and its stage (STAGES: 0
normal, 1 degrade, 2 break, from its deny ratio). A `Protection` (threads)
or an `AsyncProtection` (an asyncio task) is what an instance runs around it:

- `record(policy, error)` counts the outcome of a request the policy
  admitted, in memory: nothing on the request's path touches the network;
  `record_denied(policy)` counts a call of the policy that a limiter denied
  without asking the server (its deny cache, the local level of a global
  rule: an attached limiter counts these itself);
- every `report_interval` it sends `RL.OUTCOME name ok errors [DENIED n]`
  to every master for each policy with counts, and forgets them: a failed
  send loses its counts (no retry, nothing grows while Redis is away);
- every `stage_poll` it reads `RL.POLICY STATS name` on every master: the
  highest stage wins, the lowest scale; with no successful read for
  `stage_hold`, the stage falls back to 0 (the limiter's own fallback
  decides while Redis is away);
- at stage 2 it forces open the `CircuitBreaker` the policy names, and
  releases it when the stage falls below 2 (or the loop is closed);
- the local level of a limiter's global policy rule (`attach`) runs at the
  scale last read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Callable, Union

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ResponseError
from redis.retry import Retry

from .aio import AsyncClient
from .aio import send_once as async_send_once
from .breaker import BreakerState, CircuitBreaker
from .client import Client, connect_once
from .errors import InvalidArgument
from .metrics import Metrics, metrics_of
from .protocol import STATS_FIELDS as STATS_FIELDS
from .protocol import WINDOW_FIELDS as WINDOW_FIELDS
from .protocol import PolicyStats as PolicyStats
from .protocol import Window as Window
from .protocol import outcome_args as outcome_args
from .protocol import server_name
from .protocol import stats_args as stats_args
from .spec import check_policy_name
from .spec import scaled as scaled
from .spec import scaled_algorithm as scaled_algorithm

log = logging.getLogger("redis_ratelimit_client")

#: The contract's `protection.kits` defaults, in milliseconds.
REPORT_INTERVAL_MS = 1000
STAGE_POLL_MS = 1000
STAGE_HOLD_MS = 5000

#: The stages: 0 normal, 1 degrade (non-core routes answer their degrade
#: handler), 2 break (the policy's breaker is forced open).
NORMAL, DEGRADE, BREAK = 0, 1, 2


@dataclasses.dataclass
class ProtectionStats:
    """What the loop did: reports sent (one per policy and master) and
    failed, the local denials sent (`DENIED`), the counts a failed report
    lost, stage reads and failed reads."""

    reports_sent: int = 0
    reports_failed: int = 0
    denied_sent: int = 0
    lost_ok: int = 0
    lost_errors: int = 0
    lost_denied: int = 0
    polls: int = 0
    polls_failed: int = 0


#: What the loop reads per (policy, master): (stage, scale, when, by its clock).
_Read = tuple[int, int, float]


class _Loop:
    """Everything of a Protection but its sending: the counts, the reads,
    the breakers and the limiters it rescales."""

    def __init__(
        self,
        policies: Sequence[str],
        *,
        report_interval: float,
        stage_poll: float,
        stage_hold: float,
        breakers: Mapping[str, CircuitBreaker] | None,
        clock: Callable[[], float],
        metrics: object = None,
    ) -> None:
        if isinstance(policies, str):
            raise InvalidArgument("policies is a list of policy names", param="policies")
        for name, value in (
            ("report_interval", report_interval),
            ("stage_poll", stage_poll),
        ):
            if not value > 0:
                raise InvalidArgument(f"{name} must be more than 0 s", param=name)
        # A read older than stage_hold is dropped: a hold not longer than
        # the time between two polls drops every stage before the next read.
        if not stage_hold > stage_poll:
            raise InvalidArgument(
                f"stage_hold must be more than stage_poll ({stage_poll} s)", param="stage_hold"
            )
        self.policies = [check_policy_name(p) for p in policies]
        for p in breakers or {}:
            if p not in self.policies:
                raise InvalidArgument(
                    f"breaker for policy {p!r}, which this Protection does not watch",
                    param="breakers",
                )
        self.report_interval = report_interval
        self.stage_poll = stage_poll
        self.stage_hold = stage_hold
        self.breakers: dict[str, CircuitBreaker] = dict(breakers or {})
        self.stats = ProtectionStats()
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}
        self._reads: dict[tuple[str, str], _Read] = {}
        self._scales: dict[str, int] = {}
        self._forced: set[str] = set()
        self._limiters: list[Any] = []
        self._failing = False
        #: Closed (`close`/`aclose`): the middleware does not start it again.
        self.closed = False
        self._metrics: list[Metrics] = []
        m = metrics_of(metrics)
        if m is not None:
            self.bind_metrics(m)

    def bind_metrics(self, metrics: Metrics) -> None:
        """Exposes this loop in `metrics`: `ratelimit_scale{rule}` and
        `ratelimit_stage{rule}` of each policy (the `rule` label of a policy
        rule is its policy's name), and `ratelimit_breaker_open{breaker}` of
        each breaker it forces, read at each scrape. An attached limiter
        with metrics binds its own."""
        if any(m is metrics for m in self._metrics):
            return
        self._metrics.append(metrics)
        for p in self.policies:
            metrics.watch_scale(p, self, _reader(_Loop.scale, p))
            metrics.watch_stage(p, self, _reader(_Loop.stage, p))
        for b in self.breakers.values():
            metrics.watch_breaker(b.name, b, _breaker_open)

    # -- the request's side: in memory only ---------------------------------

    def record(self, policy: str, error: bool) -> None:
        """Counts one outcome of a request `policy` admitted: sent with the
        next report, in the background."""
        with self._lock:
            c = self._counts.get(policy)
            if c is None:
                c = self._counts[policy] = [0, 0, 0]
            c[1 if error else 0] += 1

    def record_denied(self, policy: str, n: int = 1) -> None:
        """Counts `n` calls of `policy` denied without asking the server (a
        deny cache hit, a local level's denial): sent as `DENIED n` with the
        next report, so the server's stages see them. A limiter `attach`ed
        to this loop counts its own."""
        with self._lock:
            c = self._counts.get(policy)
            if c is None:
                c = self._counts[policy] = [0, 0, 0]
            c[2] += n

    def record_ok(self, policy: str) -> None:
        self.record(policy, False)

    def record_error(self, policy: str) -> None:
        self.record(policy, True)

    def pending(self) -> dict[str, tuple[int, int, int]]:
        """The counts not sent yet, per policy: (ok, errors, denied)."""
        with self._lock:
            return {p: (c[0], c[1], c[2]) for p, c in self._counts.items()}

    def _take(self) -> list[tuple[str, int, int, int]]:
        with self._lock:
            counts, self._counts = self._counts, {}
        return [(p, ok, err, den) for p, (ok, err, den) in counts.items() if ok or err or den]

    # -- what the server decided ---------------------------------------------

    def stage(self, policy: str) -> int:
        """The policy's stage: the highest that a master answered within
        `stage_hold`; 0 when none did."""
        now = self._clock()
        with self._lock:
            fresh = [
                s
                for (p, _), (s, _, at) in self._reads.items()
                if p == policy and now - at <= self.stage_hold
            ]
        return max(fresh, default=NORMAL)

    def scale(self, policy: str) -> int:
        """The policy's scale in percent: the lowest that the masters
        answered at their last reads (100 before any)."""
        with self._lock:
            return self._scales.get(policy, 100)

    def breaker(self, policy: str) -> CircuitBreaker | None:
        """The breaker `policy` names, if any."""
        return self.breakers.get(policy)

    def attach(self, limiter: Any) -> None:
        """Runs the local level of `limiter`'s global rules that name one of
        these policies at the scale last read (a `Limiter`, an
        `AsyncLimiter`: anything with `rescale(policy, scale)`), and has it
        count the calls of these policies it denies without the server
        (`record_denied`)."""
        self._limiters.append(limiter)
        for p in self.policies:
            limiter.rescale(p, self.scale(p))
        watch = getattr(limiter, "watch", None)
        if watch is not None:
            watch(self)
        m = getattr(limiter, "metrics", None)
        if isinstance(m, Metrics):
            self.bind_metrics(m)

    def _read(self, policy: str, master: str, stats: PolicyStats) -> None:
        with self._lock:
            self._reads[(policy, master)] = (stats.stage, stats.scale, self._clock())

    def _settle(self, masters: Sequence[str]) -> None:
        """After a round of reads: each policy's scale (the lowest of the
        masters' last reads), the limiters rescaled, the breakers forced
        open or released."""
        for policy in self.policies:
            with self._lock:
                got = [self._reads[(policy, m)][1] for m in masters if (policy, m) in self._reads]
                before = self._scales.get(policy, 100)
                now_scale = min(got) if got else before
                self._scales[policy] = now_scale
            if now_scale != before:
                for limiter in self._limiters:
                    limiter.rescale(policy, now_scale)
            self._apply_breaker(policy)

    def _apply_breaker(self, policy: str) -> None:
        b = self.breakers.get(policy)
        if b is None:
            return
        if self.stage(policy) >= BREAK:
            if policy not in self._forced:
                self._forced.add(policy)
                b.force_open()
                log.warning(
                    "redis-ratelimit: policy %r at stage 2: breaker %r open", policy, b.name
                )
        elif policy in self._forced:
            self._forced.discard(policy)
            b.release()
            log.info("redis-ratelimit: policy %r below stage 2: breaker %r closed", policy, b.name)

    def _failed(self, what: str, master: str, e: BaseException) -> None:
        if not self._failing:
            self._failing = True
            log.warning("redis-ratelimit: protection %s on %s failed (%s)", what, master, e)
        else:
            log.debug("redis-ratelimit: protection %s on %s failed (%s)", what, master, e)

    def _lost(self, ok: int, errors: int, denied: int) -> None:
        self.stats.reports_failed += 1
        self.stats.lost_ok += ok
        self.stats.lost_errors += errors
        self.stats.lost_denied += denied

    def _sent(self, denied: int) -> None:
        self.stats.reports_sent += 1
        self.stats.denied_sent += denied

    def _release_all(self) -> None:
        """At close: the breakers this loop forced open are released (no
        loop keeps them up to date any more)."""
        for policy in list(self._forced):
            self._forced.discard(policy)
            b = self.breakers[policy]
            b.release()
            log.info("redis-ratelimit: protection closed: breaker %r released", b.name)

    def state(self) -> dict[str, dict[str, object]]:
        """Per policy: its stage, scale and breaker state (for a status page)."""
        out: dict[str, dict[str, object]] = {}
        for p in self.policies:
            b = self.breakers.get(p)
            out[p] = {
                "stage": self.stage(p),
                "scale": self.scale(p),
                "breaker": None if b is None else b.state.value,
            }
        return out


#: What a `Protection` is built on: the kit's client, a redis-py client
#: (standalone or cluster), or several (several standalone masters).
SyncTarget = Union[Client, redis.Redis, RedisCluster]
AsyncTarget = Union[AsyncClient, aioredis.Redis, AsyncRedisCluster]


class Protection(_Loop):
    """The loop on the sync clients, in a background thread (`start`,
    `close`, or `with`).

    `client`: a `Client`, a `redis.Redis`, a `RedisCluster` (every master),
    or a list of them (several masters). `policies`: the names it watches.
    `breakers`: the `CircuitBreaker` each policy names. The intervals are
    seconds (the contract's `protection.kits`: 1, 1 and 5). `timeout`: the
    seconds one report or read may take (default 1): the loop sends on a
    connection of its own per master with that socket timeout and no
    retries, whatever the client's settings, so a server that hangs holds
    neither a stage nor a breaker past `stage_hold + timeout`. `metrics`: a
    prometheus_client registry (or `True`, or a `Metrics`) showing the
    policies' scale and stage and the breakers' state (`bind_metrics`).
    """

    def __init__(
        self,
        client: SyncTarget | Sequence[SyncTarget],
        policies: Sequence[str],
        *,
        report_interval: float = REPORT_INTERVAL_MS / 1000,
        stage_poll: float = STAGE_POLL_MS / 1000,
        stage_hold: float = STAGE_HOLD_MS / 1000,
        breakers: Mapping[str, CircuitBreaker] | None = None,
        timeout: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        metrics: object = None,
    ) -> None:
        super().__init__(
            policies,
            report_interval=report_interval,
            stage_poll=stage_poll,
            stage_hold=stage_hold,
            breakers=breakers,
            clock=clock,
            metrics=metrics,
        )
        if not timeout > 0:
            raise InvalidArgument("timeout must be more than 0 s", param="timeout")
        self.timeout = timeout
        self._targets: list[SyncTarget] = (
            list(client) if isinstance(client, (list, tuple)) else [client]  # type: ignore[list-item]
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The loop's own connection per master, and the lock of their use.
        self._conns: dict[str, Any] = {}
        self._io = threading.Lock()

    def _masters(self) -> list[tuple[str, redis.Redis]]:
        out: list[tuple[str, redis.Redis]] = []
        for t in self._targets:
            rc = t.redis if isinstance(t, Client) else t
            if isinstance(rc, RedisCluster):
                for n in rc.get_primaries():
                    out.append((n.name, rc.get_redis_connection(n)))
            else:
                out.append((server_name(rc), rc))
        return out

    def _send(self, name: str, rc: redis.Redis, args: list[str | int]) -> PolicyStats:
        """One command on the loop's own connection to master `name`: one
        attempt, `timeout` to connect and to answer."""
        with self._io:
            conn = self._conns.get(name)
            if conn is None:
                pool = rc.connection_pool
                kwargs = {
                    **pool.connection_kwargs,
                    "socket_timeout": self.timeout,
                    "socket_connect_timeout": self.timeout,
                    "retry": Retry(NoBackoff(), 0),
                }
                conn = self._conns[name] = pool.connection_class(**kwargs)
            try:
                connect_once(conn)
                conn.send_command(*args)
                reply = conn.read_response()
            except ResponseError:
                raise
            except BaseException:
                conn.disconnect()
                raise
        return PolicyStats.from_reply(reply)

    def report(self) -> None:
        """Sends the counts (`RL.OUTCOME`) to every master, once."""
        counts = self._take()
        if not counts:
            return
        try:
            masters = self._masters()
        except Exception as e:
            self._failed("report", "the cluster", e)
            for _, ok, errors, denied in counts:
                self._lost(ok, errors, denied)
            return
        for policy, ok, errors, denied in counts:
            for name, r in masters:
                try:
                    self._read(
                        policy, name, self._send(name, r, outcome_args(policy, ok, errors, denied))
                    )
                    self._sent(denied)
                except Exception as e:
                    self._failed("report", name, e)
                    self._lost(ok, errors, denied)
        self._settle([n for n, _ in masters])

    def poll(self) -> None:
        """Reads every policy's `RL.POLICY STATS` on every master, once."""
        masters = self._masters()
        ok = True
        for policy in self.policies:
            for name, r in masters:
                self.stats.polls += 1
                try:
                    self._read(policy, name, self._send(name, r, stats_args(policy)))
                except Exception as e:
                    ok = False
                    self.stats.polls_failed += 1
                    self._failed("stage poll", name, e)
        if ok:
            self._failing = False
        self._settle([n for n, _ in masters])

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Protection:
        """Starts the background thread (a stage poll at once)."""
        if not self.running:
            self.closed = False
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="rl-protection", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        next_report = self._clock() + self.report_interval
        next_poll = self._clock()
        while not self._stop.is_set():
            now = self._clock()
            if now >= next_poll:
                next_poll = now + self.stage_poll
                self._guarded(self.poll)
            if now >= next_report:
                next_report = now + self.report_interval
                self._guarded(self.report)
            self._stop.wait(max(0.0, min(next_poll, next_report) - self._clock()))

    def _guarded(self, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception as e:  # pragma: no cover - the loop must survive anything
            log.exception("redis-ratelimit: protection loop step failed: %s", e)
        # A stage held past `stage_hold` releases its breaker even when no read succeeds.
        for p in self.policies:
            self._apply_breaker(p)

    def close(self) -> None:
        """Stops the thread, sends the last counts once (best effort) and
        releases the breakers it forced open."""
        self.closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self._guarded(self.report)
        self._release_all()
        with self._io:
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.disconnect()

    def __enter__(self) -> Protection:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncProtection(_Loop):
    """The loop on `redis.asyncio`, in a task of the running event loop
    (`start`, `aclose`, or `async with`); as `Protection`. `timeout`: the
    seconds one report or read may take (default 1)."""

    def __init__(
        self,
        client: AsyncTarget | Sequence[AsyncTarget],
        policies: Sequence[str],
        *,
        report_interval: float = REPORT_INTERVAL_MS / 1000,
        stage_poll: float = STAGE_POLL_MS / 1000,
        stage_hold: float = STAGE_HOLD_MS / 1000,
        breakers: Mapping[str, CircuitBreaker] | None = None,
        timeout: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        metrics: object = None,
    ) -> None:
        super().__init__(
            policies,
            report_interval=report_interval,
            stage_poll=stage_poll,
            stage_hold=stage_hold,
            breakers=breakers,
            clock=clock,
            metrics=metrics,
        )
        if not timeout > 0:
            raise InvalidArgument("timeout must be more than 0 s", param="timeout")
        self.timeout = timeout
        self._targets: list[AsyncTarget] = (
            list(client) if isinstance(client, (list, tuple)) else [client]  # type: ignore[list-item]
        )
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    async def _masters(self) -> list[tuple[str, Callable[[list[str | int]], Awaitable[Any]]]]:
        out: list[tuple[str, Callable[[list[str | int]], Awaitable[Any]]]] = []
        for t in self._targets:
            rc = t.redis if isinstance(t, AsyncClient) else t
            if isinstance(rc, AsyncRedisCluster):
                if not rc.nodes_manager.default_node:
                    await rc.initialize()
                for n in rc.get_primaries():
                    out.append((n.name, _node_sender(n)))
            else:
                out.append((server_name(rc), _redis_sender(rc)))
        return out

    async def _call(
        self, send: Callable[[list[str | int]], Awaitable[Any]], args: list[str | int]
    ) -> PolicyStats:
        return PolicyStats.from_reply(await asyncio.wait_for(send(args), self.timeout))

    async def report(self) -> None:
        """Sends the counts (`RL.OUTCOME`) to every master, once."""
        counts = self._take()
        if not counts:
            return
        try:
            masters = await asyncio.wait_for(self._masters(), self.timeout)
        except Exception as e:
            self._failed("report", "the cluster", e)
            for _, ok, errors, denied in counts:
                self._lost(ok, errors, denied)
            return
        for policy, ok, errors, denied in counts:
            for name, send in masters:
                try:
                    args = outcome_args(policy, ok, errors, denied)
                    self._read(policy, name, await self._call(send, args))
                    self._sent(denied)
                except Exception as e:
                    self._failed("report", name, e)
                    self._lost(ok, errors, denied)
        self._settle([n for n, _ in masters])

    async def poll(self) -> None:
        """Reads every policy's `RL.POLICY STATS` on every master, once."""
        try:
            masters = await asyncio.wait_for(self._masters(), self.timeout)
        except Exception as e:
            self.stats.polls_failed += 1
            self._failed("stage poll", "the cluster", e)
            return
        ok = True
        for policy in self.policies:
            for name, send in masters:
                self.stats.polls += 1
                try:
                    self._read(policy, name, await self._call(send, stats_args(policy)))
                except Exception as e:
                    ok = False
                    self.stats.polls_failed += 1
                    self._failed("stage poll", name, e)
        if ok:
            self._failing = False
        self._settle([n for n, _ in masters])

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> AsyncProtection:
        """Starts the task on the running event loop (a stage poll at once)."""
        if not self.running:
            self.closed = False
            self._stopping = False
            self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def _run(self) -> None:
        next_report = self._clock() + self.report_interval
        next_poll = self._clock()
        # The flag as well as the cancellation: Python 3.11's wait_for may
        # swallow a cancellation that meets its inner call's end.
        while not self._stopping:
            now = self._clock()
            if now >= next_poll:
                next_poll = now + self.stage_poll
                await self._guarded(self.poll)
            if now >= next_report:
                next_report = now + self.report_interval
                await self._guarded(self.report)
            await asyncio.sleep(max(0.0, min(next_poll, next_report) - self._clock()))

    async def _guarded(self, step: Callable[[], Awaitable[None]]) -> None:
        try:
            await step()
        except Exception as e:  # pragma: no cover - the loop must survive anything
            log.exception("redis-ratelimit: protection loop step failed: %s", e)
        for p in self.policies:
            self._apply_breaker(p)

    async def aclose(self) -> None:
        """Stops the task, sends the last counts once (best effort) and
        releases the breakers it forced open."""
        task, self._task = self._task, None
        self.closed = True
        self._stopping = True
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=self.timeout + self.stage_poll)
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: logged by the loop already
        await self._guarded(self.report)
        self._release_all()

    async def __aenter__(self) -> AsyncProtection:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _reader(read: Callable[[_Loop, str], int], policy: str) -> Callable[[_Loop], float]:
    """A gauge's read of `policy` on the loop it is given."""
    return lambda loop: float(read(loop, policy))


def _breaker_open(b: CircuitBreaker) -> bool:
    return b.state is not BreakerState.CLOSED


def _redis_sender(rc: aioredis.Redis) -> Callable[[list[str | int]], Awaitable[Any]]:
    async def send(args: list[str | int]) -> Any:
        return await async_send_once(rc, args)

    return send


def _node_sender(node: Any) -> Callable[[list[str | int]], Awaitable[Any]]:
    async def send(args: list[str | int]) -> Any:
        return await node.execute_command(*args)

    return send


__all__ = [
    "BREAK",
    "DEGRADE",
    "NORMAL",
    "REPORT_INTERVAL_MS",
    "STAGE_HOLD_MS",
    "STAGE_POLL_MS",
    "STATS_FIELDS",
    "WINDOW_FIELDS",
    "AsyncProtection",
    "PolicyStats",
    "Protection",
    "ProtectionStats",
    "Window",
    "outcome_args",
    "scaled",
    "scaled_algorithm",
    "stats_args",
]
