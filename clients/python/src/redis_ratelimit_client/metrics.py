"""The kit's Prometheus metrics (the contract's `observability.metrics`), in
`prometheus_client`, an optional dependency: `pip install
'redis-ratelimit-client[metrics]'`. Without it the kit works as before;
asking for metrics then raises `MetricsMissing`, which names the extra.

The series, as a scrape shows them:

- `ratelimit_decisions_total{rule, level, outcome}`: every decision of a
  `Limiter` / `AsyncLimiter` (so of the ASGI middleware), by the rule it is
  about (a policy rule: the policy's name), the level that took it (`local`,
  `redis`, `deny_cache`, `grant`, `fallback`) and its outcome (`admitted`,
  `denied`, `shadow_denied`);
- `ratelimit_redis_seconds`: a histogram of the limiter's round trips to
  Redis, the contract's buckets;
- `ratelimit_remaining_ratio{rule}`: remaining / limit of the rule's last
  decision taken by Redis or the local level;
- `ratelimit_breaker_open{breaker}`: 1 while a breaker is open (a limiter's
  own, `redis`, which skips Redis; a `CircuitBreaker` a protection loop
  watches, by its name);
- `ratelimit_scale{rule}`, `ratelimit_stage{rule}`: a protection loop's
  scale and stage of each policy it watches;
- `ratelimit_deny_events_dropped_total`, `..._shipped_total`,
  `..._sink_errors_total`: the deny events' shipper (`events.py`).

One `Metrics` per registry (`Metrics.of(registry)`; default
prometheus_client's `REGISTRY`): it is one collector there, which every
limiter, loop and shipper given that registry feeds. It counts in memory
without a lock on the request's path (a decision's counter is an
`itertools.count`, whose `next` the GIL makes atomic; a ratio a dict's
item) and builds the families when the registry is scraped, so a scrape
shows exactly the contract's series (no `_created` samples). After
`os.fork()` a child's `Metrics` has fresh locks (its parent's threads may
have held them).
"""

from __future__ import annotations

import bisect
import itertools
import os
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable, Union

from .errors import InvalidArgument

if TYPE_CHECKING:  # pragma: no cover - typing only
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

#: The levels a decision is taken at (the contract's `observability.levels`).
LEVELS = ("local", "redis", "deny_cache", "grant", "fallback")
#: A decision's outcomes (the contract's `observability.outcomes`).
OUTCOMES = ("admitted", "denied", "shadow_denied")
#: `ratelimit_redis_seconds`'s upper bounds, in seconds (then `+Inf`).
REDIS_SECONDS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)

#: (name as scraped, type, help, labels): the contract's `observability.metrics`.
METRICS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "ratelimit_decisions_total",
        "counter",
        "Decisions taken, by rule, by the level that took them and by outcome",
        ("rule", "level", "outcome"),
    ),
    (
        "ratelimit_redis_seconds",
        "histogram",
        "Round trips of limiter commands to Redis, in seconds",
        (),
    ),
    (
        "ratelimit_remaining_ratio",
        "gauge",
        "remaining / limit of the rule's last decision taken by Redis or the local level "
        "(0: at the limit)",
        ("rule",),
    ),
    (
        "ratelimit_breaker_open",
        "gauge",
        "1 while the breaker is open (Redis skipped, or a protected stage broken), else 0",
        ("breaker",),
    ),
    (
        "ratelimit_scale",
        "gauge",
        "The protection loop's scale of the rule's policy, in percent",
        ("rule",),
    ),
    (
        "ratelimit_stage",
        "gauge",
        "The protection loop's stage of the rule's policy: 0 normal, 1 degrade, 2 break",
        ("rule",),
    ),
    (
        "ratelimit_deny_events_dropped_total",
        "counter",
        "Deny events lost: the oldest dropped from a full buffer, and every event of a batch "
        "its sink refused",
        (),
    ),
    (
        "ratelimit_deny_events_shipped_total",
        "counter",
        "Deny events a sink accepted",
        (),
    ),
    (
        "ratelimit_deny_events_sink_errors_total",
        "counter",
        "Flushes a sink refused or failed (an error, a timeout, an HTTP status other than 2xx, "
        "a _bulk reply with errors)",
        (),
    ),
)

EXTRA = "metrics"
INSTALL = "pip install 'redis-ratelimit-client[metrics]'"


class MetricsMissing(ImportError):
    """Metrics were asked for, and `prometheus_client` is not installed."""

    def __init__(self) -> None:
        super().__init__(
            "metrics need prometheus_client, which is not installed: "
            f"{INSTALL} (the kit's '{EXTRA}' extra)"
        )


def _prometheus() -> Any:
    """prometheus_client, imported when metrics are first asked for."""
    try:
        import prometheus_client
    except ImportError as e:
        raise MetricsMissing() from e
    return prometheus_client


#: A gauge's source: (the object it reads, weakly held; how it reads it).
_Source = tuple["weakref.ref[Any]", Callable[[Any], float]]

_ALL: weakref.WeakSet[Metrics] = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child: a lock its parent's threads held stays held."""
    Metrics._made = threading.Lock()
    for m in list(_ALL):
        m._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _value(counter: itertools.count[int]) -> int:
    """How many times `next` was called on a count started at 0 (its
    repr is `count(n)`; no other way to read one without a `next`)."""
    return int(repr(counter)[6:-1])


class Metrics:
    """The kit's metrics in one `prometheus_client.CollectorRegistry`: get it
    with `Metrics.of(registry)` (one per registry; default prometheus_client's
    `REGISTRY`), or pass `metrics=registry` (or `True`) to a `Limiter`,
    `AsyncLimiter`, `RateLimitMiddleware`, `Protection`, `AsyncProtection` or
    `DenyEvents`."""

    _by_registry: weakref.WeakKeyDictionary[Any, Metrics] = weakref.WeakKeyDictionary()
    _made = threading.Lock()

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        prometheus = _prometheus()
        self.registry = prometheus.REGISTRY if registry is None else registry
        self._lock = threading.Lock()
        self._decisions: dict[tuple[str, str, str], itertools.count[int]] = {}
        self._buckets = [0] * (len(REDIS_SECONDS_BUCKETS) + 1)
        self._redis_sum = 0.0
        self._ratios: dict[str, float] = {}
        self._breakers: dict[str, list[_Source]] = {}
        self._scales: dict[str, list[_Source]] = {}
        self._stages: dict[str, list[_Source]] = {}
        self._events = [0, 0, 0]  # dropped, shipped, sink errors
        self.registry.register(self)
        _ALL.add(self)
        # Made directly: the registry's one all the same (a second one
        # there would be refused as duplicated series).
        self._by_registry.setdefault(self.registry, self)

    @classmethod
    def of(cls, registry: CollectorRegistry | None = None) -> Metrics:
        """The registry's `Metrics`, made and registered the first time."""
        prometheus = _prometheus()
        reg = prometheus.REGISTRY if registry is None else registry
        with cls._made:
            m = cls._by_registry.get(reg)
            if m is None:
                m = cls._by_registry[reg] = cls(reg)
            return m

    # -- what the kit records ---------------------------------------------------

    def decision(self, rule: str, level: str, outcome: str) -> None:
        """One decision of `rule` at `level` with `outcome`."""
        c = self._decisions.get((rule, level, outcome))
        if c is None:
            c = self._counter(rule, level, outcome)
        next(c)

    def counter(self, rule: str, level: str, outcome: str) -> Callable[[], int]:
        """A function that counts one decision of `rule` at `level` with
        `outcome` each call (a limiter keeps it: no lookup per decision)."""
        return self._counter(rule, level, outcome).__next__

    def _counter(self, rule: str, level: str, outcome: str) -> itertools.count[int]:
        if level not in LEVELS:
            raise InvalidArgument(f"level must be one of {', '.join(LEVELS)}", param="level")
        if outcome not in OUTCOMES:
            raise InvalidArgument(f"outcome must be one of {', '.join(OUTCOMES)}", param="outcome")
        if not isinstance(rule, str):
            raise InvalidArgument("rule must be a str", param="rule")
        with self._lock:
            return self._decisions.setdefault((rule, level, outcome), itertools.count())

    def redis_seconds(self, seconds: float) -> None:
        """One round trip of a limiter command."""
        i = bisect.bisect_left(REDIS_SECONDS_BUCKETS, seconds)
        with self._lock:
            self._buckets[i] += 1
            self._redis_sum += seconds

    def remaining(self, rule: str, remaining: int, limit: int) -> None:
        """The rule's last decision taken by Redis or the local level."""
        # One item set: atomic under the GIL, no lock.
        self._ratios[rule] = min(max(remaining, 0) / limit, 1.0) if limit > 0 else 0.0

    def events(self, dropped: int = 0, shipped: int = 0, sink_errors: int = 0) -> None:
        """The deny events' shipper's counts."""
        with self._lock:
            self._events[0] += dropped
            self._events[1] += shipped
            self._events[2] += sink_errors

    def _add(self, into: dict[str, list[_Source]], name: str, owner: Any, read: Any) -> None:
        with self._lock:
            sources = into.setdefault(name, [])
            sources[:] = [(o, f) for o, f in sources if o() is not None and o() is not owner]
            sources.append((weakref.ref(owner), read))

    def watch_breaker(self, name: str, owner: Any, is_open: Callable[[Any], bool]) -> None:
        """`ratelimit_breaker_open{breaker=name}` reads `is_open(owner)` at
        each scrape (1 if any owner of that name is open); `owner` is held
        weakly."""
        self._add(self._breakers, name, owner, lambda o: 1.0 if is_open(o) else 0.0)

    def watch_scale(self, rule: str, owner: Any, scale: Callable[[Any], float]) -> None:
        """`ratelimit_scale{rule}` reads `scale(owner)` at each scrape (the
        lowest of the owners of that rule)."""
        self._add(self._scales, rule, owner, scale)

    def watch_stage(self, rule: str, owner: Any, stage: Callable[[Any], float]) -> None:
        """`ratelimit_stage{rule}` reads `stage(owner)` at each scrape (the
        highest of the owners of that rule)."""
        self._add(self._stages, rule, owner, stage)

    # -- what a scrape reads --------------------------------------------------------

    def decisions(self) -> dict[tuple[str, str, str], int]:
        """The decisions counted so far, by (rule, level, outcome)."""
        with self._lock:
            counts = list(self._decisions.items())
        return {k: _value(c) for k, c in counts}

    def describe(self) -> list[Metric]:
        """The families, without samples (the registry's check of names)."""
        return list(self._families(empty=True))

    def collect(self) -> Iterator[Metric]:
        yield from self._families(empty=False)

    def _read(self, into: dict[str, list[_Source]], pick: Callable[..., float]) -> list[Any]:
        with self._lock:
            items = {n: list(s) for n, s in into.items()}
        out: list[tuple[str, float]] = []
        for name, sources in items.items():
            values = []
            for ref, read in sources:
                owner = ref()
                if owner is not None:
                    try:
                        values.append(float(read(owner)))
                    except Exception:  # pragma: no cover - a scrape must not fail
                        continue
            if values:
                out.append((name, pick(values)))
        return out

    def _families(self, empty: bool) -> Iterator[Metric]:
        from prometheus_client import metrics_core as core

        helps = {name: (kind, text, labels) for name, kind, text, labels in METRICS}

        def family(name: str) -> Any:
            kind, text, labels = helps[name]
            if kind == "counter":
                return core.CounterMetricFamily(name, text, labels=list(labels) or None)
            if kind == "histogram":
                return core.HistogramMetricFamily(name, text, labels=list(labels) or None)
            return core.GaugeMetricFamily(name, text, labels=list(labels) or None)

        decisions = family("ratelimit_decisions_total")
        redis_s = family("ratelimit_redis_seconds")
        ratio = family("ratelimit_remaining_ratio")
        breaker = family("ratelimit_breaker_open")
        scale = family("ratelimit_scale")
        stage = family("ratelimit_stage")
        dropped = family("ratelimit_deny_events_dropped_total")
        shipped = family("ratelimit_deny_events_shipped_total")
        errors = family("ratelimit_deny_events_sink_errors_total")
        if not empty:
            with self._lock:
                buckets = list(self._buckets)
                total_s = self._redis_sum
                events = list(self._events)
            for (rule, level, outcome), n in sorted(self.decisions().items()):
                decisions.add_metric([rule, level, outcome], n)
            ratios = sorted(self._ratios.copy().items())
            cumulative, acc = [], 0
            for bound, n in zip([*map(_bound, REDIS_SECONDS_BUCKETS), "+Inf"], buckets):
                acc += n
                cumulative.append((bound, acc))
            redis_s.add_metric([], cumulative, total_s)
            for rule, value in ratios:
                ratio.add_metric([rule], value)
            for name, value in sorted(self._read(self._breakers, max)):
                breaker.add_metric([name], value)
            for rule, value in sorted(self._read(self._scales, min)):
                scale.add_metric([rule], value)
            for rule, value in sorted(self._read(self._stages, max)):
                stage.add_metric([rule], value)
            dropped.add_metric([], events[0])
            shipped.add_metric([], events[1])
            errors.add_metric([], events[2])
        yield from (decisions, redis_s, ratio, breaker, scale, stage, dropped, shipped, errors)


def _bound(b: float) -> str:
    """A bucket's `le`, as prometheus_client's own histograms write it."""
    from prometheus_client.utils import floatToGoString

    return str(floatToGoString(b))


#: What a `metrics=` argument may be: off (None, False), the default
#: registry (True), a registry, or a `Metrics`.
MetricsArg = Union[None, bool, "CollectorRegistry", Metrics]


def metrics_of(value: object) -> Metrics | None:
    """A `metrics=` argument's `Metrics`, or None for off."""
    if value is None or value is False:
        return None
    if isinstance(value, Metrics):
        return value
    if value is True:
        return Metrics.of(None)
    prometheus = _prometheus()
    if isinstance(value, prometheus.CollectorRegistry):
        return Metrics.of(value)
    raise InvalidArgument(
        "metrics must be None, True, a prometheus_client CollectorRegistry or a Metrics, "
        f"not {type(value).__name__}",
        param="metrics",
    )


__all__ = [
    "LEVELS",
    "METRICS",
    "OUTCOMES",
    "REDIS_SECONDS_BUCKETS",
    "Metrics",
    "MetricsArg",
    "MetricsMissing",
    "metrics_of",
]
