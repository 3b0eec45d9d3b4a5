"""This instance's accounts, in process (as the Rust kit's `local.rs`): the
core's algorithms (`algorithms.py`) at this instance's share of each limit,
and the requests in flight of concurrency rules. The middleware charges them
with what Redis admitted, and its local-only fallback decides on them.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, NamedTuple

from . import algorithms
from .decision import Decision
from .spec import (
    _OFFSET,
    Algorithm,
    Concurrency,
    FixedWindow,
    HashWindow,
    LeakyBucket,
    Period,
    Quota,
    Sliding,
    TokenBucket,
    _limit_of,
)


class LocalLimiter:
    """This instance's accounts: per rule and key, the core's algorithm at
    this instance's share `s` of the limit, in process (`algorithms.py`, in
    integer arithmetic: the same decisions as the server's at that share),
    and a count of requests in flight for concurrency.

    An account is the rule's algorithm with `s` for its limit or capacity;
    a bucket's refill count is scaled as the capacity is, `ceil(count * 11
    / (instances * 10))` (at least 1, at most the count), so its refill
    period stays. A change of the rule's parameters (or of the share)
    carries what was consumed over, as the server does; a change of
    algorithm starts the account afresh.

    The same accounts serve two purposes. Every unit Redis admitted for this
    instance, and every unit of a call whose answer was lost (it may have been
    counted), is charged to them, forced (`COST n FORCE`: an account may go
    into debt, at most `s` units beyond empty). The local-only fallback
    admits only what an account still has, so it never adds to what Redis may
    already have counted for this instance. Bounded like the deny cache.

    `now` is Unix time: a `Micros` (whole microseconds, what the middleware
    passes: `Micros.now()`), or seconds as a float (`time.time()`), taken to
    the nearest microsecond. Requests in flight count by `time.monotonic()`.
    """

    def __init__(self, max_entries: int = 100_000, instances: int = 1) -> None:
        self.max_entries = max_entries
        #: Instances sharing each limit: the refill of a bucket's share.
        self.instances = instances
        self._accounts: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._in_flight: dict[tuple[str, str], int] = {}
        #: Leases whose grant may have been lost: held until their expiry.
        self._lost_leases: dict[tuple[str, str], list[float]] = {}

    # -- requests in flight (concurrency rules) ---------------------------

    def _held(self, rule: str, key: str, now: float) -> int:
        lost = self._lost_leases.get((rule, key))
        if lost:
            lost[:] = [t for t in lost if t > now]
            if not lost:
                del self._lost_leases[(rule, key)]
        return self._in_flight.get((rule, key), 0) + len(lost or [])

    def hold(
        self, rule: str, key: str, share: int, *, force: bool = False, now: float | None = None
    ) -> Decision:
        """One unit held until `unhold`: admitted while fewer than `share`
        are held; `force` holds it anyway (a lease Redis granted)."""
        held = self._held(rule, key, time.monotonic() if now is None else now)
        if held >= share and not force:
            return Decision(False, share, 0, 1000, 1000)
        self._in_flight[(rule, key)] = self._in_flight.get((rule, key), 0) + 1
        return Decision(True, share, max(share - held - 1, 0), 0, 0)

    def unhold(self, rule: str, key: str) -> None:
        held = self._in_flight.get((rule, key), 0) - 1
        if held > 0:
            self._in_flight[(rule, key)] = held
        else:
            self._in_flight.pop((rule, key), None)

    def hold_lost(self, rule: str, key: str, share: int, lease_ms: int, now: float) -> Decision:
        """A lease call whose answer was lost: the lease may exist in Redis,
        so a unit stays held until it would have expired, whatever the
        decision; admitted if a unit was free before it."""
        held = self._held(rule, key, now)
        self._lost_leases.setdefault((rule, key), []).append(now + lease_ms / 1000.0)
        if held >= share:
            return Decision(False, share, 0, min(lease_ms, 1000), lease_ms)
        return Decision(True, share, max(share - held - 1, 0), 0, lease_ms)

    # -- rates --------------------------------------------------------------

    def _local(self, spec: Algorithm, share: int, now_us: int) -> tuple[Any, tuple[int, ...]]:
        """The account's algorithm and its parameters at the share."""
        assert not isinstance(spec, Concurrency)
        if isinstance(spec, (TokenBucket, LeakyBucket)):
            algo = (
                algorithms.TokenBucket if isinstance(spec, TokenBucket) else algorithms.LeakyBucket
            )
            count, per_ms = spec.params()[1:]
            return algo, (share, share_of(count, self.instances), per_ms)
        if isinstance(spec, FixedWindow):
            return algorithms.FixedWindow, (share, spec.window_ms)
        if isinstance(spec, Sliding):
            return algorithms.SlidingLog, (share, spec.window_ms)
        if isinstance(spec, HashWindow):
            return algorithms.HashWindow, (share, spec.window_ms, spec.bucket_ms)
        return algorithms.Quota, (
            share,
            _PERIODS.index(Period(spec.period)),
            _quota_end(spec, now_us),
        )

    def _account(
        self, rule: str, key: str, spec: Algorithm, share: int, now_us: int
    ) -> tuple[Any, tuple[int, ...], Any]:
        """The account's algorithm, parameters and state (idle if new, or if
        the rule's algorithm changed)."""
        algo, params = self._local(spec, share, now_us)
        entry = self._accounts.get((rule, key))
        if entry is None or entry[0] is not algo:
            if entry is None and len(self._accounts) >= self.max_entries:
                self._accounts.clear()
            entry = (algo, algo.idle(params, now_us))
            self._accounts[(rule, key)] = entry
        return algo, params, entry[1]

    def run(
        self,
        rule: str,
        key: str,
        spec: Algorithm,
        share: int,
        request: algorithms.Request,
        now: float | Micros,
        *,
        peek: bool = False,
    ) -> Decision:
        """One request on the account (`COST n`, `COST n FORCE`, `REFUND n`),
        as the core's `run` answers it at the share; `limit` is the rule's.
        `peek`: what it would answer, changing nothing."""
        now_us = _micros(now)
        algo, params, state = self._account(rule, key, spec, share, now_us)
        step = algorithms.decide if peek else algorithms.run
        d, _ = step(algo, state, params, request, now_us)
        return Decision(d.allowed, _limit_of(spec), d.remaining, d.wait_ms, d.reset_ms)

    def peek(
        self,
        rule: str,
        key: str,
        spec: Algorithm,
        share: int,
        request: algorithms.Request,
        now: float | Micros,
    ) -> Decision:
        """What `run` would answer, changing nothing."""
        return self.run(rule, key, spec, share, request, now, peek=True)

    def has_room(
        self, rule: str, key: str, spec: Algorithm, share: int, now: float | Micros
    ) -> bool:
        """Whether the account has a unit left."""
        return self.peek(rule, key, spec, share, _COST_1, now).allowed

    def charge(
        self,
        rule: str,
        key: str,
        spec: Algorithm,
        share: int,
        now: float | Micros,
        units: int = 1,
    ) -> Decision:
        """Forced (`COST units FORCE`): takes `units` even beyond what is left
        (at most `share` units of debt); what `COST units` would have
        answered, admitted."""
        return self.run(rule, key, spec, share, algorithms.Request(algorithms.FORCE, units), now)

    def refund(
        self,
        rule: str,
        key: str,
        spec: Algorithm,
        share: int,
        now: float | Micros,
        units: int = 1,
    ) -> Decision:
        """`REFUND units`: gives back up to `units` the account holds
        consumed; its fields after it."""
        return self.run(rule, key, spec, share, algorithms.Request(algorithms.REFUND, units), now)

    def fields(
        self, rule: str, key: str, spec: Algorithm, share: int, now: float | Micros
    ) -> Decision:
        """The account's fields as they stand (`COST 0`: an admission's)."""
        return self.run(rule, key, spec, share, _COST_0, now)

    def denial(
        self, rule: str, key: str, spec: Algorithm, share: int, now: float | Micros
    ) -> Decision:
        """The account's answer to one more unit, as a denial (when it has
        none left: `wait_ms` says when it will)."""
        return dataclasses.replace(self.peek(rule, key, spec, share, _COST_1, now), allowed=False)

    def decide(
        self, rule: str, key: str, spec: Algorithm, share: int, now: float | Micros
    ) -> Decision:
        """One unit if the account has it (taken), else a denial."""
        return self.run(rule, key, spec, share, _COST_1, now)

    def _log(self, rule: str, key: str, spec: Sliding | HashWindow, now: float | Micros) -> _Held:
        """Units a sliding log or hash window account holds in its window."""
        now_us = _micros(now)
        entry = self._accounts.get((rule, key))
        if entry is None:
            return _Held(0)
        state = entry[1]
        if isinstance(state, algorithms.LogState):
            return _Held(state.live_units(state.first_live(spec.window_ms, now_us)))
        assert isinstance(state, algorithms.RingState)
        return _Held(state.held_at(max(now_us // (state.bucket_ms * 1000), state.newest)))


class Micros(int):
    """Unix time in whole microseconds, as the accounts count it."""

    @staticmethod
    def now() -> Micros:
        return Micros(time.time_ns() // 1000)


def _micros(now: float | Micros) -> int:
    """`now` in microseconds: a `Micros` as it is, seconds to the nearest."""
    if isinstance(now, Micros):
        return int(now)
    return round(now * 1_000_000)


class _Held(NamedTuple):
    total: int


_COST_0 = algorithms.Request(algorithms.COST, 0)
_COST_1 = algorithms.Request(algorithms.COST, 1)
_PERIODS = list(Period)


def share_of(total: int, instances: int) -> int:
    """One instance's part of `total`: `ceil(total * 11 / (instances * 10))`,
    at least 1 and at most `total` (as the Rust kit's `Share::Instances`)."""
    return max(1, min(total, -(-total * 11 // (max(instances, 1) * 10))))


def _quota_end(spec: Quota, now_us: int) -> int:
    """The end (Unix us) of the quota's period that contains `now_us`; 0 in
    UTC (the algorithm's own calendar, in integers). A fixed offset shifts
    UTC's calendar; a zone name is read from the time-zone database."""
    if spec.zone is None:
        return 0
    period = _PERIODS.index(Period(spec.period))
    m = _OFFSET.match(spec.zone)
    if m:
        minutes = int(m.group(1)) * 60 + int(m.group(2))
        off_us = (-1 if spec.zone[0] == "-" else 1) * minutes * 60_000_000
        return algorithms.utc_period_end(period, now_us + off_us) - off_us
    # Period edges are whole seconds in every zone.
    return round(spec.period_end(now_us // 1_000_000)) * 1_000_000
