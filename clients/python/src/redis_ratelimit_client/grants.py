"""Batched and striped global rules (issue 27): the pure logic both limiters share.

A rule may be `batched`: the limiter takes units from Redis with `UPTO b`
and spends them in process, so every unit it admits was taken from the
server first (never over the limit, whatever the number of instances).
Units held longer than `hold_ms` go back with `REFUND`, and all of them at
close. `b` follows the instance's own rate: about `hold_ms` worth of it,
at most `max_share_pct` % of the limit, so an idle instance holds nothing.

A rule may be `striped` over N keys: stripe i keeps `limit / N` (the
remainder to the first ones) of every size and rate parameter, under the
key `{tag_i}key`, the tags picked from the cluster's slot map so that the
stripes fall on different masters. An instance uses its own stripe and, on
a denial, the next one.

This module is the part without I/O: the batch size and the rate it
follows, the state of one (rule, key)'s grant, the stripes' shares and
tags. `limiter.py` drives it for `Limiter` (threads) and `AsyncLimiter`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from .decision import Decision
from .errors import InvalidArgument
from .spec import (
    Algorithm,
    FixedWindow,
    HashWindow,
    Quota,
    Sliding,
    TokenBucket,
    _check_int,
    _limit_of,
)

#: `hold_ms`'s default, and its bounds.
HOLD_MS = 50
MAX_HOLD_MS = 60_000
#: `max_share_pct`'s default.
MAX_SHARE_PCT = 10
#: The most stripes of a rule.
MAX_STRIPES = 64
#: The algorithms a rule may batch or stripe (those that take `UPTO`).
GRANTABLE = (TokenBucket, FixedWindow, Sliding, HashWindow, Quota)
#: A tag's prefix: stripe tags are "rl0", "rl1", ...
TAG_PREFIX = "rl"
SLOTS = REDIS_CLUSTER_HASH_SLOTS


def check_options(
    name: str,
    spec: object,
    global_: bool,
    batched: object,
    hold_ms: object,
    max_share_pct: object,
    striped: object,
) -> None:
    """A rule's grant options, each checked with an error naming it."""
    if not isinstance(batched, bool):
        raise InvalidArgument(
            f"batched must be True or False, not {type(batched).__name__}", param="batched"
        )
    _check_int("hold_ms", hold_ms, 1, MAX_HOLD_MS)
    _check_int("max_share_pct", max_share_pct, 1, 100)
    n = _check_int("striped", striped, 1, MAX_STRIPES)
    for option, on in (("batched", batched), ("striped", n > 1)):
        if not on:
            continue
        if not global_:
            raise InvalidArgument(
                f"rule {name!r}: {option} is an option of a global rule (global_=True)",
                param=option,
            )
        if not isinstance(spec, GRANTABLE):
            what = type(spec).__name__
            raise InvalidArgument(
                f"rule {name!r}: {option} needs an inline TokenBucket, FixedWindow, Sliding, "
                f"HashWindow or Quota, not {what}",
                param=option,
            )
    if n > 1:
        stripe_specs(spec, n)  # type: ignore[arg-type]


def batch_size(rate_per_s: int, hold_ms: int, limit: int, max_share_pct: int) -> int:
    """`b = clamp(ceil(rate_per_s * hold_ms / 1000), 1, max(1, limit *
    max_share_pct / 100))`, in integers."""
    want = -(-rate_per_s * hold_ms // 1000)
    cap = max(1, limit * max_share_pct // 100)
    return min(max(want, 1), cap)


class RateCounter:
    """Decisions per second of the instance's monotonic clock: `rate` is the
    larger of the previous whole second's count and the current one's."""

    __slots__ = ("second", "current", "previous")

    def __init__(self) -> None:
        self.second = -2
        self.current = 0
        self.previous = 0

    def note(self, now_ms: float) -> None:
        s = int(now_ms // 1000)
        if s != self.second:
            self.previous = self.current if s == self.second + 1 else 0
            self.current = 0
            self.second = s
        self.current += 1

    def rate(self, now_ms: float) -> int:
        s = int(now_ms // 1000)
        if s == self.second:
            return max(self.previous, self.current)
        return self.current if s == self.second + 1 else 0


def _share(value: int, i: int, n: int) -> int:
    return value // n + (1 if i < value % n else 0)


def stripe_specs(spec: Algorithm, n: int) -> list[Algorithm]:
    """Stripe i's spec of `n`: every size and rate parameter split (`value //
    n`, plus 1 for i < `value % n`); refill_ms, window_ms, bucket_ms and the
    period unchanged. Every share must be at least 1: `InvalidArgument`
    naming `striped` otherwise."""
    n = _check_int("striped", n, 1, MAX_STRIPES)
    if isinstance(spec, TokenBucket):
        split = {"capacity": spec.capacity, "refill_count": spec.refill_count}
    elif isinstance(spec, GRANTABLE):
        split = {"limit": spec.limit}
    else:
        raise InvalidArgument(f"striped: {type(spec).__name__} cannot be striped", param="striped")
    for field, value in split.items():
        if value < n:
            raise InvalidArgument(
                f"striped: {n} stripes of a {field} of {value} would leave a stripe without "
                f"units: striped must be at most {value}",
                param="striped",
            )
    try:
        return [
            dataclasses.replace(spec, **{f: _share(v, i, n) for f, v in split.items()})  # type: ignore[arg-type]
            for i in range(n)
        ]
    except InvalidArgument as e:
        raise InvalidArgument(f"striped: a stripe's share is refused: {e}", param="striped") from e


def stripe_key(tag: str, key: str) -> str:
    """Stripe key: `{tag}` + the rule's key."""
    return "{" + tag + "}" + key


def slot_of(tag: str) -> int:
    """The cluster's hash slot of a tag: CRC16-XMODEM mod 16384 (redis-py's)."""
    return int(key_slot(tag.encode()))


#: The slot map as the tags need it: each master's slot ranges (inclusive).
Owners = Sequence[Sequence[tuple[int, int]]]
#: Standalone or Sentinel: one master owning every slot.
ONE_MASTER: Owners = (((0, SLOTS - 1),),)


def ordered(owners: Owners) -> list[list[tuple[int, int]]]:
    """The masters ordered by the lowest slot each owns (those owning none dropped)."""
    masters = [sorted(r) for r in owners if r]
    return sorted(masters, key=lambda ranges: ranges[0][0])


def _owns(ranges: Sequence[tuple[int, int]], slot: int) -> bool:
    return any(lo <= slot <= hi for lo, hi in ranges)


def _owner(masters: Sequence[Sequence[tuple[int, int]]], slot: int) -> int | None:
    for m, ranges in enumerate(masters):
        if _owns(ranges, slot):
            return m
    return None


def _first_tag(ranges: Sequence[tuple[int, int]], used: set[str]) -> str:
    c = 0
    while True:
        tag = f"{TAG_PREFIX}{c}"
        if tag not in used and _owns(ranges, slot_of(tag)):
            return tag
        c += 1


def stripe_tags(owners: Owners, n: int) -> list[str]:
    """The tags of `n` stripes: stripe i on master `i mod M` (masters ordered
    by their lowest slot), its tag the first "rl0", "rl1", ... whose slot
    that master owns and that no earlier stripe took."""
    return repick_tags(owners, [None] * n)


def repick_tags(owners: Owners, old: Sequence[str | None]) -> list[str]:
    """The tags after the slot map changed: a stripe keeps its tag while the
    master now owning it holds no more stripes than the placement `i mod M`
    gives it; the others (and None) move, in order, each to its placement's
    master or the next one short of stripes (its first free tag). Units
    consumed under a moved stripe's old key are not seen by its new one."""
    masters = ordered(owners)
    if not masters:
        raise InvalidArgument("the slot map has no master", param="striped")
    m_count, n = len(masters), len(old)
    room = [len(range(m, n, m_count)) for m in range(m_count)]
    tags: list[str | None] = [None] * n
    for i, tag in enumerate(old):
        if tag is None:
            continue
        m = _owner(masters, slot_of(tag))
        if m is not None and room[m] > 0:
            room[m] -= 1
            tags[i] = tag
    used = {t for t in tags if t is not None}
    for i in range(n):
        if tags[i] is not None:
            continue
        # The placement's own master when it has room, else the next with room.
        m = next((i + j) % m_count for j in range(m_count) if room[(i + j) % m_count])
        room[m] -= 1
        tags[i] = tag = _first_tag(masters[m], used)
        used.add(tag)
    return [t for t in tags if t is not None]


def slot_owners(cluster: Any) -> tuple[object, Owners]:
    """The slot map of a redis-py cluster client (sync or asyncio): its
    `nodes_manager.slots_cache` (a new object after every refresh, which is
    what `seen` compares) and each primary's slot ranges."""
    cache: Mapping[int, Sequence[Any]] = cluster.nodes_manager.slots_cache
    by_node: dict[str, list[tuple[int, int]]] = {}
    run_node: str | None = None
    run_start = 0
    for slot in range(SLOTS + 1):
        nodes = cache.get(slot) if slot < SLOTS else None
        node = nodes[0].name if nodes else None
        if node != run_node:
            if run_node is not None:
                by_node.setdefault(run_node, []).append((run_start, slot - 1))
            run_node, run_start = node, slot
    return cache, list(by_node.values())


# -- one (rule, key)'s grant ----------------------------------------------------


class Flight:
    """The one `UPTO` call in flight for a batch: deciders that find it wait
    for its answer (`signal`: the limiter's event or future) and share it."""

    __slots__ = ("signal", "failed")

    def __init__(self, signal: Any) -> None:
        self.signal = signal
        self.failed = False


@dataclasses.dataclass
class Batch:
    """What an instance holds of one (rule, key): `held` units granted at
    `granted_at`, the rate it decides at, `next_ask_at` (the instant before
    which it denies without asking), the call in flight and the last reply.
    Times are monotonic milliseconds."""

    spec: Algorithm
    hold_ms: int
    max_share_pct: int
    held: int = 0
    granted_at: float = 0.0
    next_ask_at: float = 0.0
    used_at: float = 0.0
    rate: RateCounter = dataclasses.field(default_factory=RateCounter)
    flight: Flight | None = None
    last: Decision | None = None

    @property
    def limit(self) -> int:
        return _limit_of(self.spec)

    def from_held(self, units: int) -> Decision | None:
        """`units` taken from what is held (None when not enough): limit the
        rule's, remaining what is left held (a lower bound of the server's),
        no wait, reset_ms of the last reply."""
        if self.held < units:
            return None
        self.held -= units
        reset = self.last.reset_ms if self.last is not None else 0
        return Decision(True, self.limit, self.held, 0, reset)

    def denied_here(self, now: float) -> Decision | None:
        """A denial without asking while `now < next_ask_at` (None after it):
        its wait is what is left to `next_ask_at` (-1 for never)."""
        if now >= self.next_ask_at:
            return None
        reset = self.last.reset_ms if self.last is not None else 0
        if self.next_ask_at == float("inf"):
            return Decision(False, self.limit, 0, -1, reset)
        return Decision(False, self.limit, 0, max(1, -int(-(self.next_ask_at - now) // 1)), reset)

    def size(self, now: float, units: int) -> int:
        """The batch to ask for: `batch_size` at the current rate, at least `units`."""
        b = batch_size(self.rate.rate(now), self.hold_ms, self.limit, self.max_share_pct)
        return max(b, units)

    def granted(self, d: Decision, ask_at: float, b: int, units: int) -> Decision:
        """The `UPTO b` reply `d` of a call sent at `ask_at`: this request
        takes `units` of it and the rest is held; a denial (or too few for
        `units`) sets `next_ask_at`."""
        self.last = d
        g = d.granted or 0
        if g >= 1:
            self.held += g
            self.granted_at = ask_at
            if g < b:  # the limiter is drained while the instance is busy
                self.next_ask_at = ask_at + self.hold_ms
            taken = self.from_held(units)
            if taken is not None:
                return dataclasses.replace(taken, remaining=d.remaining, reset_ms=d.reset_ms)
            return Decision(False, d.limit, 0, max(d.wait_ms, 1), d.reset_ms)
        if d.wait_ms < 0:
            self.next_ask_at = float("inf")
        else:
            self.next_ask_at = ask_at + max(d.wait_ms, self.hold_ms if b > 1 else 0)
        return dataclasses.replace(d, allowed=False)

    def after_wait(self, now: float, units: int) -> Decision | None:
        """A decider that waited for another's call: units from what it
        brought, else denied with the reply's fields; None when the call
        failed (the fallback decides)."""
        taken = self.from_held(units)
        if taken is not None:
            return taken
        d = self.last
        if d is None:
            return None
        if not d.allowed:
            return d
        wait = max(int(self.next_ask_at - now), 0)
        return Decision(False, d.limit, 0, wait, d.reset_ms)

    def stale(self, now: float) -> int:
        """The units held longer than `hold_ms`, taken out (to refund)."""
        if self.held > 0 and self.flight is None and now - self.granted_at >= self.hold_ms:
            units, self.held = self.held, 0
            return units
        return 0

    def drain(self) -> int:
        units, self.held = self.held, 0
        return units


def shorter_wait(a: int, b: int) -> int:
    """The shorter of two waits, -1 (never) being the longest."""
    if a < 0:
        return b
    if b < 0:
        return a
    return min(a, b)


def stripe_denial(own: Decision, other: Decision) -> Decision:
    """Both stripes denied: the own stripe's fields with the shorter wait."""
    return dataclasses.replace(own, wait_ms=shorter_wait(own.wait_ms, other.wait_ms))


__all__ = [
    "Batch",
    "Flight",
    "GRANTABLE",
    "HOLD_MS",
    "MAX_HOLD_MS",
    "MAX_SHARE_PCT",
    "MAX_STRIPES",
    "RateCounter",
    "batch_size",
    "check_options",
    "repick_tags",
    "slot_of",
    "slot_owners",
    "stripe_denial",
    "stripe_key",
    "stripe_specs",
    "stripe_tags",
]
