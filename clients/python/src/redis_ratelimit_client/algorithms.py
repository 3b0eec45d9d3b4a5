"""The core's rate-limiting algorithms (core/src/*.rs), in process and in
integer arithmetic: the kit's local level and local-only fallback run them.

Each algorithm is a class of static functions on a mutable state:

- `idle(params, now_us)`: the state of a limiter that has seen no traffic;
- `apply(state, params, cost, now_us)`: decides `COST cost`, changing the
  state only when the request is admitted with `cost > 0`;
- `force(state, params, cost, now_us)`: `COST cost FORCE` (at most `limit`
  units of debt beyond empty): what `apply` would have answered, and
  whether the state changed;
- `refund(state, params, units, now_us)`: `REFUND units`, whether the state
  changed.

`run(algorithm, state, params, request, now_us)` is the core's `run`: the
`Answer` (the five integers of the module's reply) and whether the state
changed. Time is Unix microseconds, an `int`; no float is used anywhere,
so the answers are the core's exactly (the contract's golden sequences
check it: `tests/test_contract.py`). Parameters are tuples of integers in
command order, assumed valid (the spec classes of `model.py` check them);
a quota's are `(limit, period index, end_us)`, `end_us` being the end of
the call's period in its zone (0, or any instant not after the call: the
UTC period's end).

A change of parameters between calls on one state carries what was
consumed over, as in the core.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

#: `wait_ms` of a request that can never be admitted.
NEVER = -1
MAX_PARAM = 1 << 40
MAX_SPAN_MS = 1 << 50
MAX_TIME_US = 1 << 62
#: The sliding log's largest limit (a running count of 24 bits).
MAX_SLIDING_LIMIT = (1 << 24) - 1

COST = "cost"
FORCE = "force"
REFUND = "refund"
#: `UPTO n` (issue 27): the units that fit, at most n, at least 1.
UPTO = "upto"


class Answer(NamedTuple):
    """A decision: the five integers of the module's reply."""

    allowed: bool
    limit: int
    remaining: int
    #: Milliseconds, rounded up; -1 (`NEVER`) when the request can never pass.
    wait_ms: int
    reset_ms: int


class Request(NamedTuple):
    """`COST n` (`kind` "cost"), `COST n FORCE` ("force") or `REFUND n` ("refund")."""

    kind: str
    units: int


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def run(
    algo: Any, state: Any, params: tuple[int, ...], request: Request, now_us: int
) -> tuple[Answer, bool]:
    """The core's `run`: `cost` applies; `force` answers what `cost` would
    have, with `allowed` set; `refund` answers as a `COST 0` after it."""
    kind, n = request
    if kind == COST:
        d: Answer = algo.apply(state, params, n, now_us)
        return d, d.allowed and n > 0
    if kind == FORCE:
        d, changed = algo.force(state, params, n, now_us)
        return d._replace(allowed=True), changed
    if kind == REFUND:
        changed = algo.refund(state, params, n, now_us)
        return decide(algo, state, params, Request(COST, 0), now_us)[0], changed
    if kind == UPTO:
        d = algo.apply(state, params, upto_cost(algo, state, params, n, now_us), now_us)
        return d, d.allowed
    raise ValueError(f"request kind {kind!r}")


def upto_cost(algo: Any, state: Any, params: tuple[int, ...], most: int, now_us: int) -> int:
    """The cost `UPTO most` runs as (the core's `fits`): the units that fit
    now, at most `most`, or 1 when none do (the denial `COST 1` gets). An
    admission's `granted` is that cost; a denial's is 0."""
    fits = min(most, decide(algo, state, params, Request(COST, 0), now_us)[0].remaining)
    return max(fits, 1)


def decide(
    algo: Any, state: Any, params: tuple[int, ...], request: Request, now_us: int
) -> tuple[Answer, bool]:
    """What `run` would answer, changing nothing."""
    return run(algo, copy.deepcopy(state), params, request, now_us)


# -- token bucket and leaky bucket: GCRA in ticks ---------------------------


class GcraState:
    """The TAT (whole microseconds and ticks of `1 / refill_count` us) and
    the rate it is kept at."""

    __slots__ = ("tat_us", "tat_frac", "refill_count", "refill_ms")

    def __init__(self, tat_us: int, tat_frac: int, refill_count: int, refill_ms: int) -> None:
        self.tat_us = tat_us
        self.tat_frac = tat_frac
        self.refill_count = refill_count
        self.refill_ms = refill_ms

    def __deepcopy__(self, memo: dict[int, object]) -> GcraState:
        return GcraState(self.tat_us, self.tat_frac, self.refill_count, self.refill_ms)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GcraState) and self.fields() == other.fields()

    __hash__ = None  # type: ignore[assignment]

    def fields(self) -> tuple[int, int, int, int]:
        return (self.tat_us, self.tat_frac, self.refill_count, self.refill_ms)

    def tat_ticks(self) -> int:
        return self.tat_us * self.refill_count + self.tat_frac

    def own_deficit(self, now_us: int) -> int:
        return max(self.tat_ticks() - now_us * self.refill_count, 0)

    def deficit(self, capacity: int, rc: int, rms: int, now_us: int) -> int:
        """Time still to refill, in ticks of the parameters' rate (the
        deficit of another rate converted, its fractional token rounded up)."""
        old = self.own_deficit(now_us)
        old_period = self.refill_ms * 1000
        new_period = rms * 1000
        if old_period == new_period:
            d = old
        else:
            whole, frac = divmod(old, old_period)
            d = whole * new_period + _ceil_div(frac * new_period, old_period)
        return min(d, MAX_SPAN_MS * rc * 1000)

    def set_tat(self, rc: int, rms: int, tat_ticks: int) -> None:
        self.tat_us, self.tat_frac = divmod(tat_ticks, rc)
        self.refill_count = rc
        self.refill_ms = rms


def _gcra(state: GcraState, params: tuple[int, ...], cost: int, now_us: int) -> tuple[Answer, int]:
    """One GCRA step: the decision, and the ticks ahead of the request."""
    capacity, rc, rms = params
    period = rms * 1000
    tau = capacity * period
    ticks_per_ms = rc * 1000
    deficit = state.deficit(capacity, rc, rms, now_us)
    need = cost * period

    if cost > 0 and deficit + need <= tau:
        after = deficit + need
        state.set_tat(rc, rms, now_us * rc + after)
        return (
            Answer(True, capacity, (tau - after) // period, 0, _ceil_div(after, ticks_per_ms)),
            deficit,
        )
    if state.refill_count == rc and state.refill_ms == rms:
        short = max(deficit + need - tau, 0)
        short_ms, reset_ms = _ceil_div(short, ticks_per_ms), _ceil_div(deficit, ticks_per_ms)
    else:
        # A state kept at another rate keeps draining at it until an admission.
        own = state.own_deficit(now_us)
        own_per_ms = state.refill_count * 1000
        fits = max(capacity - cost, 0) * (state.refill_ms * 1000)
        short_ms = min(_ceil_div(max(own - fits, 0), own_per_ms), MAX_SPAN_MS)
        reset_ms = min(_ceil_div(own, own_per_ms), MAX_SPAN_MS)
    if cost == 0:
        wait = 0
    elif need > tau:
        wait = NEVER
    else:
        wait = short_ms
    remaining = max(tau - deficit, 0) // period
    return Answer(cost == 0, capacity, remaining, wait, reset_ms), deficit


def _gcra_force(
    state: GcraState, params: tuple[int, ...], cost: int, now_us: int
) -> tuple[Answer, int, bool]:
    d, ahead = _gcra(state, params, cost, now_us)
    if d.allowed or cost == 0:
        return d, ahead, d.allowed and cost > 0
    capacity, rc, rms = params
    deficit = state.deficit(capacity, rc, rms, now_us)
    debt_cap = min(capacity * rms * 1000 * 2, MAX_SPAN_MS * rc * 1000)
    after = min(deficit + cost * rms * 1000, debt_cap)
    if after <= deficit:
        return d, ahead, False
    state.set_tat(rc, rms, now_us * rc + after)
    return d, ahead, True


def _gcra_refund(state: GcraState, params: tuple[int, ...], units: int, now_us: int) -> bool:
    capacity, rc, rms = params
    deficit = state.deficit(capacity, rc, rms, now_us)
    if deficit == 0 or units == 0:
        return False
    after = max(deficit - units * rms * 1000, 0)
    state.set_tat(rc, rms, now_us * rc + after)
    return True


class TokenBucket:
    """`(capacity, refill_count, refill_ms)`: GCRA, exact (token_bucket.rs)."""

    @staticmethod
    def idle(params: tuple[int, ...], now_us: int) -> GcraState:
        return GcraState(now_us, 0, params[1], params[2])

    @staticmethod
    def apply(state: GcraState, params: tuple[int, ...], cost: int, now_us: int) -> Answer:
        return _gcra(state, params, cost, now_us)[0]

    @staticmethod
    def force(
        state: GcraState, params: tuple[int, ...], cost: int, now_us: int
    ) -> tuple[Answer, bool]:
        d, _, changed = _gcra_force(state, params, cost, now_us)
        return d, changed

    @staticmethod
    def refund(state: GcraState, params: tuple[int, ...], units: int, now_us: int) -> bool:
        return _gcra_refund(state, params, units, now_us)


def _shaped(d: Answer, ahead: int, params: tuple[int, ...]) -> Answer:
    """An admitted request of the queue learns when its turn comes."""
    if d.allowed:
        return d._replace(wait_ms=_ceil_div(ahead, params[1] * 1000))
    return d


class LeakyBucket:
    """`(capacity, leak_count, leak_ms)`: the GCRA as a shaping queue
    (leaky_bucket.rs)."""

    idle = TokenBucket.idle
    refund = TokenBucket.refund

    @staticmethod
    def apply(state: GcraState, params: tuple[int, ...], cost: int, now_us: int) -> Answer:
        d, ahead = _gcra(state, params, cost, now_us)
        return _shaped(d, ahead, params)

    @staticmethod
    def force(
        state: GcraState, params: tuple[int, ...], cost: int, now_us: int
    ) -> tuple[Answer, bool]:
        d, ahead, changed = _gcra_force(state, params, cost, now_us)
        return _shaped(d, ahead, params), changed


# -- fixed window and quota: a count in a window -----------------------------


class CountState:
    """A count and its window: the last admitted instant (fixed window) or
    the period's end (quota), in microseconds."""

    __slots__ = ("at_us", "count")

    def __init__(self, at_us: int, count: int) -> None:
        self.at_us = at_us
        self.count = count

    def __deepcopy__(self, memo: dict[int, object]) -> CountState:
        return CountState(self.at_us, self.count)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CountState) and (self.at_us, self.count) == (
            other.at_us,
            other.count,
        )

    __hash__ = None  # type: ignore[assignment]


def _window_end_us(window_ms: int, t_us: int) -> int:
    window_us = window_ms * 1000
    return t_us - t_us % window_us + window_us


class _Count:
    """A count in a window or a period (the fixed window, the quota): the
    same rules for both, as in the core. A kind says where the count stands
    (`_current`: the state's mark and count at `now_us`) and where its
    window ends (`_end`)."""

    #: The least wait of a denial, in ms.
    MIN_WAIT_MS = 0

    @staticmethod
    def _current(state: CountState, params: tuple[int, ...], now_us: int) -> tuple[int, int]:
        raise NotImplementedError

    @staticmethod
    def _end(params: tuple[int, ...], mark: int) -> int:
        raise NotImplementedError

    @classmethod
    def apply(cls, state: CountState, params: tuple[int, ...], cost: int, now_us: int) -> Answer:
        """`COST cost`: admitted while it fits, the state then marked; a
        denial waits for the end of the window."""
        limit = params[0]
        mark, count = cls._current(state, params, now_us)
        end_us = cls._end(params, mark)
        to_end_ms = _ceil_div(end_us - min(now_us, end_us), 1000)
        remaining = max(limit - count, 0)
        if 0 < cost <= remaining:
            state.at_us, state.count = mark, count + cost
            return Answer(True, limit, remaining - cost, 0, to_end_ms)
        wait = 0 if cost == 0 else NEVER if cost > limit else max(to_end_ms, cls.MIN_WAIT_MS)
        return Answer(cost == 0, limit, remaining, wait, 0 if count == 0 else to_end_ms)

    @classmethod
    def force(
        cls, state: CountState, params: tuple[int, ...], cost: int, now_us: int
    ) -> tuple[Answer, bool]:
        """`COST n FORCE`: answered as unforced, at most a limit of debt."""
        d = cls.apply(state, params, cost, now_us)
        if d.allowed or cost == 0:
            return d, d.allowed and cost > 0
        mark, count = cls._current(state, params, now_us)
        forced = min(count + cost, 2 * params[0])
        if forced <= count:
            return d, False
        state.at_us, state.count = mark, forced
        return d, True

    @classmethod
    def refund(cls, state: CountState, params: tuple[int, ...], units: int, now_us: int) -> bool:
        """`REFUND units`: up to what the current window holds."""
        _, count = cls._current(state, params, now_us)
        back = min(units, count)
        if back == 0:
            return False
        state.count = count - back
        return True


class FixedWindow(_Count):
    """`(limit, window_ms)`: windows aligned on the epoch (fixed_window.rs);
    the state's `at_us` is the last admitted request's instant."""

    @staticmethod
    def _current(state: CountState, params: tuple[int, ...], now_us: int) -> tuple[int, int]:
        now_eff = max(now_us, state.at_us)
        same = _window_end_us(params[1], state.at_us) == _window_end_us(params[1], now_eff)
        return now_eff, state.count if same else 0

    @staticmethod
    def idle(params: tuple[int, ...], now_us: int) -> CountState:
        return CountState(now_us, 0)

    @staticmethod
    def _end(params: tuple[int, ...], mark: int) -> int:
        return _window_end_us(params[1], mark)


_DAY_US = 86_400_000_000


def _civil_from_days(days: int) -> tuple[int, int, int]:
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (1 if m <= 2 else 0), m, d


def _days_from_civil(y: int, m: int, d: int) -> int:
    y = y - 1 if m <= 2 else y
    era = y // 400
    yoe = y - era * 400
    mp = m - 3 if m > 2 else m + 9
    doy = (153 * mp + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return max(era * 146_097 + doe - 719_468, 0)


def utc_period_end(period: int, now_us: int) -> int:
    """The end (Unix us) of the period (0 DAY, 1 WEEK, 2 MONTH, 3 YEAR) that
    contains `now_us` in UTC, at most `MAX_TIME_US` (quota.rs)."""
    day = now_us // _DAY_US
    if period == 0:
        next_day = day + 1
    elif period == 1:  # 1970-01-01 was a Thursday
        next_day = day + 7 - (day + 3) % 7
    elif period == 2:
        y, m, _ = _civil_from_days(day)
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
        next_day = _days_from_civil(y, m, 1)
    else:
        y, _, _ = _civil_from_days(day)
        next_day = _days_from_civil(y + 1, 1, 1)
    return min(next_day * _DAY_US, MAX_TIME_US)


class Quota(_Count):
    """`(limit, period, end_us)`: a count per calendar period (quota.rs);
    the state's `at_us` is the end of the period it counts in."""

    MIN_WAIT_MS = 1

    @staticmethod
    def _current(state: CountState, params: tuple[int, ...], now_us: int) -> tuple[int, int]:
        if now_us < state.at_us:
            return state.at_us, state.count
        _, period, end_us = params
        end_us = min(end_us, MAX_TIME_US)
        end = end_us if end_us > now_us else utc_period_end(period, now_us)
        return max(end, now_us + 1), 0

    @staticmethod
    def idle(params: tuple[int, ...], now_us: int) -> CountState:
        return CountState(0, 0)

    @staticmethod
    def _end(params: tuple[int, ...], mark: int) -> int:
        return mark


# -- sliding log --------------------------------------------------------------


class LogState:
    """The sliding log: one entry per millisecond that admitted something,
    oldest first, as its millisecond and the running count of units admitted
    through it (`base`: the running count before the oldest)."""

    __slots__ = ("ms", "running", "base")

    def __init__(self) -> None:
        self.ms: list[int] = []
        self.running: list[int] = []
        self.base = 0

    def __deepcopy__(self, memo: dict[int, object]) -> LogState:
        other = LogState()
        other.ms, other.running, other.base = list(self.ms), list(self.running), self.base
        return other

    def __eq__(self, other: object) -> bool:
        """The same entries, each with its units."""
        return isinstance(other, LogState) and self.entries() == other.entries()

    __hash__ = None  # type: ignore[assignment]

    def entries(self) -> list[tuple[int, int]]:
        """`(ms, units)`, oldest first."""
        before = [self.base, *self.running[:-1]]
        return [(ms, r - b) for ms, r, b in zip(self.ms, self.running, before)]

    def held(self) -> int:
        return self.running[-1] - self.base if self.running else 0

    def units_through(self, i: int) -> int:
        return self.running[i] - self.base

    def first_live(self, window_ms: int, now_us: int) -> int:
        """The oldest entry still in the window: `(ms + window_ms) * 1000 > now`."""
        lo, hi = 0, len(self.ms)
        while lo < hi:
            mid = (lo + hi) // 2
            if (self.ms[mid] + window_ms) * 1000 > now_us:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def live_units(self, first: int) -> int:
        return self.held() - (self.units_through(first - 1) if first > 0 else 0)

    def stamp(self, now_us: int) -> int:
        return max(_ceil_div(now_us, 1000), self.ms[-1] if self.ms else 0)

    def expire(self, first: int) -> None:
        if first > 0:
            self.base = self.running[first - 1]
            del self.ms[:first]
            del self.running[:first]

    def push(self, ms: int, cost: int) -> None:
        if self.ms and self.ms[-1] == ms:
            self.running[-1] += cost
        else:
            self.running.append((self.running[-1] if self.running else self.base) + cost)
            self.ms.append(ms)

    def pop_newest(self, units: int) -> None:
        while units > 0 and self.ms:
            below = self.running[-2] if len(self.running) >= 2 else self.base
            in_last = self.running[-1] - below
            back = min(units, in_last)
            units -= back
            if back == in_last:
                self.ms.pop()
                self.running.pop()
            else:
                self.running[-1] -= back


class SlidingLog:
    """`(limit, window_ms)`: the exact sliding log (sliding_log.rs)."""

    @staticmethod
    def _evaluate(
        state: LogState, params: tuple[int, ...], cost: int, now_us: int
    ) -> tuple[Answer, int]:
        limit, window_ms = params
        now_ms_ceil = _ceil_div(now_us, 1000)

        def leaves_after(ms: int) -> int:
            return _ceil_div(max((ms + window_ms) * 1000 - now_us, 0), 1000)

        def reset_after(ms: int) -> int:
            return window_ms if ms == now_ms_ceil else leaves_after(ms)

        first = state.first_live(window_ms, now_us)
        before = state.units_through(first - 1) if first > 0 else 0
        held = state.held() - before
        remaining = max(limit - held, 0)
        if 0 < cost <= remaining:
            return Answer(True, limit, remaining - cost, 0, reset_after(state.stamp(now_us))), first
        reset_ms = reset_after(state.ms[-1]) if state.ms and held > 0 else 0
        if cost == 0:
            wait = 0
        elif cost > limit:
            wait = NEVER
        else:
            excess = held + cost - limit
            lo, hi = first, len(state.ms)
            while lo < hi:
                mid = (lo + hi) // 2
                if state.units_through(mid) - before >= excess:
                    hi = mid
                else:
                    lo = mid + 1
            wait = leaves_after(state.ms[lo])
            reset_ms = max(reset_ms, wait)
        return Answer(cost == 0, limit, remaining, wait, reset_ms), first

    @staticmethod
    def idle(params: tuple[int, ...], now_us: int) -> LogState:
        return LogState()

    @staticmethod
    def apply(state: LogState, params: tuple[int, ...], cost: int, now_us: int) -> Answer:
        d, first = SlidingLog._evaluate(state, params, cost, now_us)
        if d.allowed and cost > 0:
            state.expire(first)
            state.push(state.stamp(now_us), cost)
        return d

    @staticmethod
    def force(
        state: LogState, params: tuple[int, ...], cost: int, now_us: int
    ) -> tuple[Answer, bool]:
        d, first = SlidingLog._evaluate(state, params, cost, now_us)
        if d.allowed or cost == 0:
            changed = d.allowed and cost > 0
            if changed:
                state.expire(first)
                state.push(state.stamp(now_us), cost)
            return d, changed
        held = state.live_units(first)
        cap = min(2 * params[0], MAX_SLIDING_LIMIT)
        take = min(cost, max(cap - held, 0))
        if take == 0:
            return d, False
        state.expire(first)
        state.push(state.stamp(now_us), take)
        return d, True

    @staticmethod
    def refund(state: LogState, params: tuple[int, ...], units: int, now_us: int) -> bool:
        first = state.first_live(params[1], now_us)
        back = min(units, state.live_units(first))
        if back == 0:
            return False
        state.expire(first)
        state.pop_newest(back)
        return True


# -- hash window ----------------------------------------------------------------


class RingState:
    """The hash window's ring of `n` counters (one more than a window's
    buckets), kept sparse: `counts` maps a slot (`bucket % n`) to its
    count, a missing slot holding 0; `newest` is the newest bucket's index
    (Unix ms / bucket_ms) and `total` the units in the ring."""

    __slots__ = ("bucket_ms", "n", "newest", "total", "counts")

    def __init__(self, bucket_ms: int, n: int, newest: int) -> None:
        self.bucket_ms = bucket_ms
        self.n = n
        self.newest = newest
        self.total = 0
        self.counts: dict[int, int] = {}

    def __deepcopy__(self, memo: dict[int, object]) -> RingState:
        other = RingState(self.bucket_ms, self.n, self.newest)
        other.total, other.counts = self.total, dict(self.counts)
        return other

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RingState) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def _key(self) -> tuple[int, int, int, int, dict[int, int]]:
        nonzero = {s: c for s, c in self.counts.items() if c}
        return (self.bucket_ms, self.n, self.newest, self.total, nonzero)

    def get(self, slot: int) -> int:
        return self.counts.get(slot, 0)

    def put(self, slot: int, value: int) -> None:
        if value:
            self.counts[slot] = value
        else:
            self.counts.pop(slot, None)

    def count(self, bucket: int) -> int:
        return self.get(bucket % self.n)

    def held_at(self, current: int) -> int:
        """Units of the buckets still in the window when `current` is the newest."""
        n, newest = self.n, self.newest
        if current >= newest + n:
            return 0
        if not self.counts:
            return 0
        gone = sum(self.count(j) for j in range(newest + 1, current + 1))
        return self.total - gone

    def advance(self, current: int) -> None:
        n, newest = self.n, self.newest
        if current >= newest + n:
            self.counts.clear()
            self.total = 0
        elif self.counts:
            for j in range(newest + 1, current + 1):
                slot = j % n
                self.total -= self.get(slot)
                self.put(slot, 0)
        self.newest = max(newest, current)

    def add(self, slot: int, units: int) -> None:
        self.put(slot, self.get(slot) + units)
        self.total += units


class HashWindow:
    """`(limit, window_ms, bucket_ms)`: the sliding window in buckets
    (hash_window.rs), with its conversion of a ring of other parameters."""

    @staticmethod
    def idle(params: tuple[int, ...], now_us: int) -> RingState:
        _, window_ms, bucket_ms = params
        return RingState(bucket_ms, window_ms // bucket_ms + 1, now_us // 1000 // bucket_ms)

    @staticmethod
    def _same_layout(state: RingState, params: tuple[int, ...]) -> bool:
        _, window_ms, bucket_ms = params
        return state.bucket_ms == bucket_ms and state.n == window_ms // bucket_ms + 1

    @staticmethod
    def _converted(state: RingState, params: tuple[int, ...], now_us: int) -> RingState:
        """The same units in the ring of other parameters: each old bucket's
        units in the new bucket holding its last millisecond, if still live."""
        new = HashWindow.idle(params, now_us)
        bucket_ms = params[2]
        oldest_live = max(new.newest + 1 - new.n, 0)
        for j in range(max(state.newest + 1 - state.n, 0), state.newest + 1):
            units = state.count(j)
            if units == 0:
                continue
            target = ((j + 1) * state.bucket_ms - 1) // bucket_ms
            if target < oldest_live:
                continue
            if target > new.newest:
                new.advance(target)
            new.add(target % new.n, units)
        return new

    @staticmethod
    def _evaluate(
        state: RingState, params: tuple[int, ...], cost: int, now_us: int
    ) -> tuple[Answer, int]:
        limit, _, bucket_ms = params
        n = state.n
        bucket_us = bucket_ms * 1000
        current = max(now_us // bucket_us, state.newest)
        held = state.held_at(current)

        def leaves_after(bucket: int) -> int:
            return _ceil_div(max((bucket + n) * bucket_us - now_us, 0), 1000)

        remaining = max(limit - held, 0)
        if 0 < cost <= remaining:
            return Answer(True, limit, remaining - cost, 0, leaves_after(current)), current
        if cost == 0:
            wait = 0
        elif cost > limit:
            wait = NEVER
        else:
            excess = held + cost - limit
            freed = 0
            bucket = max(current + 1 - n, 0)
            while True:
                if bucket <= state.newest:
                    freed += state.count(bucket)
                if freed >= excess or bucket > state.newest:
                    break
                bucket += 1
            wait = leaves_after(bucket)
        reset_ms = 0 if held == 0 else leaves_after(state.newest)
        return Answer(cost == 0, limit, remaining, wait, reset_ms), current

    @staticmethod
    def _take(state: RingState, current: int, units: int) -> None:
        state.advance(current)
        state.add(current % state.n, units)

    @staticmethod
    def _adopt(state: RingState, converted: RingState) -> None:
        for name in RingState.__slots__:
            setattr(state, name, getattr(converted, name))

    @staticmethod
    def apply(state: RingState, params: tuple[int, ...], cost: int, now_us: int) -> Answer:
        if not HashWindow._same_layout(state, params):
            converted = HashWindow._converted(state, params, now_us)
            d = HashWindow.apply(converted, params, cost, now_us)
            if d.allowed and cost > 0:
                HashWindow._adopt(state, converted)
            return d
        d, current = HashWindow._evaluate(state, params, cost, now_us)
        if d.allowed and cost > 0:
            HashWindow._take(state, current, cost)
        return d

    @staticmethod
    def force(
        state: RingState, params: tuple[int, ...], cost: int, now_us: int
    ) -> tuple[Answer, bool]:
        if not HashWindow._same_layout(state, params):
            converted = HashWindow._converted(state, params, now_us)
            d, changed = HashWindow.force(converted, params, cost, now_us)
            if changed:
                HashWindow._adopt(state, converted)
            return d, changed
        d, current = HashWindow._evaluate(state, params, cost, now_us)
        if cost == 0:
            return d, False
        held = state.held_at(current)
        take = cost if d.allowed else min(cost, max(2 * params[0] - held, 0))
        if take == 0:
            return d, False
        HashWindow._take(state, current, take)
        return d, True

    @staticmethod
    def refund(state: RingState, params: tuple[int, ...], units: int, now_us: int) -> bool:
        if not HashWindow._same_layout(state, params):
            converted = HashWindow._converted(state, params, now_us)
            changed = HashWindow.refund(converted, params, units, now_us)
            if changed:
                HashWindow._adopt(state, converted)
            return changed
        current = max(now_us // (params[2] * 1000), state.newest)
        left = min(units, state.held_at(current))
        if left == 0:
            return False
        state.advance(current)
        n = state.n
        for bucket in range(current, max(current + 1 - n, 0) - 1, -1):
            slot = bucket % n
            back = min(left, state.get(slot))
            state.put(slot, state.get(slot) - back)
            state.total -= back
            left -= back
            if left == 0:
                break
        return True


#: The algorithms by their command word.
BY_WORD: dict[str, Any] = {
    "TOKENBUCKET": TokenBucket,
    "LEAKYBUCKET": LeakyBucket,
    "FIXEDWINDOW": FixedWindow,
    "SLIDING": SlidingLog,
    "HASHWINDOW": HashWindow,
    "QUOTA": Quota,
}
