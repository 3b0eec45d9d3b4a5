"""The two-level limiter, usable without any web framework (as the Rust kit's
`limiter.rs` and the Java kit's `Limiter`): a deny cache, then the local
level of the global rules, then one round trip to Redis within a deadline,
and behind it a fallback (fail open, fail closed, or local only) with a
circuit breaker when Redis errors, misses the deadline or the breaker is
open.

`Limiter` runs on the sync `Client`, `AsyncLimiter` on `AsyncClient` (the
ASGI middleware's). Both share everything but the sending: the decision's
steps are one text (`_Limiting`), and the calls a decision sends are one
generator (`_calls`) that each drives its own way. So a Flask or a worker
process has the same limiter as a Starlette app.

The units the local-only fallback admitted while no call reached Redis
(the breaker open, an error reply) are owed to Redis: they are sent as
`COST n FORCE` before the key's next call once Redis answers, so Redis
counts them and one instance stays within its share plus the limit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any, Union

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from .aio import AsyncClient
from .client import Client, connect_once
from .decision import Decision
from .deny_cache import DenyCache
from .errors import (
    InvalidArgument,
    ModuleMissing,
    ServerError,
    WrongType,
    answer_lost,
)
from .events import DenyEvents, check_http, cut_header
from .grants import (
    HOLD_MS,
    ONE_MASTER,
    Batch,
    Flight,
    repick_tags,
    slot_owners,
    stripe_denial,
    stripe_key,
    stripe_specs,
)
from .local import LocalLimiter, Micros, share_of
from .metrics import Metrics, metrics_of
from .protocol import Key, _takes_command_name, spec_from_policy
from .request import ONE, Request, RequestKind
from .spec import Algorithm, Concurrency, Policy, Quota, Rule, Spec, _limit_of, scaled_algorithm

log = logging.getLogger("redis_ratelimit_client")


class FallbackMode(str, enum.Enum):
    """What decides while Redis is away."""

    FAIL_OPEN = "fail_open"
    FAIL_CLOSED = "fail_closed"
    LOCAL_ONLY = "local_only"


#: What an admitted request holds until its work is done, as (key, rule
#: name, lease id): a lease in Redis, or with None a unit of the local fallback.
Held = tuple[str, str, Union[int, None]]

#: The errors of a call that the fallback answers: Redis away or late, or an
#: error reply that applied nothing (READONLY after a failover, LOADING, the
#: module gone, WRONGTYPE).
REDIS_FAILURES = (RedisError, OSError, ServerError, ModuleMissing, WrongType)


def check_zones(rules: Sequence[Rule], algos: Sequence[Algorithm]) -> None:
    """Several rate rules go in one `RL.ALL`, whose inline specs count quotas
    in UTC: an inline zoned quota must then be the only one (beside
    concurrency caps). A zoned quota policy counts in its zone anywhere."""
    rated = [r.spec for r, a in zip(rules, algos) if not isinstance(a, Concurrency)]
    if len(rated) > 1:
        for a in rated:
            if isinstance(a, Quota) and a.zone is not None:
                raise InvalidArgument(
                    f"zone: a quota in {a.zone!r} beside other rules would go in one RL.ALL, "
                    "which counts quotas in UTC only: give it a limiter of its own",
                    param="zone",
                )


@dataclasses.dataclass
class Stats:
    """The counters of every path a decision took."""

    redis_calls: int = 0
    redis_admitted: int = 0
    redis_denied: int = 0
    redis_errors: int = 0
    redis_timeouts: int = 0
    deny_cache_hits: int = 0
    local_denied: int = 0
    fallback_admitted: int = 0
    fallback_denied: int = 0
    breaker_skipped: int = 0
    breaker_opened: int = 0
    probes: int = 0
    probes_ok: int = 0
    key_missing: int = 0
    leases_released: int = 0
    release_errors: int = 0
    #: `COST n FORCE` calls sent for units the fallback admitted without Redis.
    owed_sent: int = 0
    #: Batched and striped rules: the calls they sent (`UPTO b`, a stripe's
    #: `COST n`, owed units), the decisions taken from held units, the
    #: denials without a call (before `next_ask_at`, or a waiter that found
    #: nothing left), and the `REFUND`s of held units sent.
    grant_calls: int = 0
    grant_held: int = 0
    grant_denied: int = 0
    grant_refunds: int = 0


@dataclasses.dataclass(frozen=True)
class Admission:
    """A limiter's answer: the decision, the rule it is about (an index in
    the rules), the path that decided (`redis`, `local`, `deny_cache` or
    `fallback`), and what an admission holds until its work is done (give
    it to `release`)."""

    decision: Decision
    index: int
    path: str
    held: list[Held] = dataclasses.field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return self.decision.allowed


#: One call a decision sends: `(key, spec, request)`, or for several rate
#: rules at once (`RL.ALL`) `(None, [(key, spec), ...], request)`.
Call = tuple[Union[Key, None], Any, Request]


@dataclasses.dataclass
class _Plan:
    """One decision on its way: its keys and request, the units the local
    level took, the rules of the call on its way (a lost answer may have
    been counted there), and the leases taken."""

    keys: list[str]
    request: Request
    taken: dict[int, Decision] = dataclasses.field(default_factory=dict)
    sent: list[int] = dataclasses.field(default_factory=list)
    held: list[Held] = dataclasses.field(default_factory=list)
    # The rate rules of an RL.ALL that denied: its denial is cached for
    # them together (see `_Limiting._set_key`).
    denied_set: list[int] = dataclasses.field(default_factory=list)


class _GrantRule:
    """A batched or striped rule: its stripes' specs (one, unstriped), the
    instance's own stripe (chosen at random once), the stripes' tags (read
    from the slot map when first needed, re-picked when it changes) and
    the batches of its keys."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        n = rule.striped
        spec: Algorithm = rule.spec  # type: ignore[assignment]  # inline: Rule checked it
        self.specs = stripe_specs(spec, n) if n > 1 else [spec]
        self.own = random.randrange(n)
        self.tags: list[str] | None = None
        #: The slot map the tags were picked from.
        self.seen: object = None
        self.batches: dict[str, Batch] = {}

    def targets(self, key: str) -> list[tuple[str, Algorithm]]:
        """The keys a decision tries, with their specs: the rule's key, or
        the own stripe's and then the next one's."""
        if self.tags is None:
            return [(key, self.specs[0])]
        n = len(self.specs)
        return [
            (stripe_key(self.tags[i], key), self.specs[i]) for i in (self.own, (self.own + 1) % n)
        ]


@dataclasses.dataclass
class _Granted:
    """A grant rule's answer: the decision, its path, and how to give its
    units back if another rule denies: ("held", batch, units) back to
    what is held, ("refund", key, spec, units) with a REFUND, ("local",
    rule index, identity key, key called, units) to the fallback's account."""

    decision: Decision
    path: str
    back: tuple[Any, ...] | None = None


@dataclasses.dataclass(frozen=True)
class _Failure:
    """A call of a grant rule that failed (`error`; None: the deadline)."""

    error: BaseException | None


#: What a grant rule's steps ask of their driver: a call to send, or the
#: flight of another decider to wait for.
GrantStep = Union["Call", Flight]
#: A REFUND to send: (key, spec, units).
Refund = tuple[str, Algorithm, int]


def _ms() -> float:
    return time.monotonic() * 1000.0


class _Limiting:
    """Everything of a limiter but its sending: the rules, the deny cache,
    the accounts (`local.py`), the breaker, the fallback and the stats."""

    def __init__(
        self,
        *,
        rules: Sequence[Rule],
        fallback: FallbackMode = FallbackMode.LOCAL_ONLY,
        deadline: float = 0.1,
        deny_cache_max: float = 1.0,
        instances: int = 1,
        breaker_failures: int = 5,
        breaker_open_for: float = 1.0,
        metrics: object = None,
        deny_events: DenyEvents | None = None,
    ) -> None:
        if not rules:
            raise InvalidArgument("at least one rule", param="rules")
        if len({r.name for r in rules}) != len(rules):
            raise InvalidArgument("rule names must differ", param="rules")
        if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
            raise InvalidArgument("instances must be an integer of at least 1", param="instances")
        if not deadline > 0:
            raise InvalidArgument("deadline must be more than 0 s", param="deadline")
        if isinstance(breaker_failures, bool) or not isinstance(breaker_failures, int):
            raise InvalidArgument("breaker_failures must be an integer", param="breaker_failures")
        if breaker_failures < 1:
            raise InvalidArgument("breaker_failures must be at least 1", param="breaker_failures")
        if not breaker_open_for >= 0:
            raise InvalidArgument("breaker_open_for must be 0 s or more", param="breaker_open_for")
        self.rules = list(rules)
        self.fallback = FallbackMode(fallback)
        self.deadline = deadline
        self.deny_cache = DenyCache(deny_cache_max)
        self.instances = instances
        self.local = LocalLimiter(instances=instances)
        self.breaker_failures = breaker_failures
        self.breaker_open_for = breaker_open_for
        self.stats = Stats()
        #: Units the local-only fallback admitted without Redis, per
        #: (rule index, key): sent as `COST n FORCE` once Redis answers.
        self.owed: dict[tuple[int, str], int] = {}
        self.max_owed = 100_000
        self._algorithms: list[Algorithm] | None = None
        #: The policies' algorithms as read, before a protection loop's scale.
        self._read_algorithms: list[Algorithm] | None = None
        #: Each policy's scale in percent, as a protection loop last read it.
        self._scales: dict[str, int] = {}
        #: The protection loops told of the policy denials answered here.
        self._watchers: list[Any] = []
        if not any(isinstance(r.spec, Policy) for r in self.rules):
            self._algorithms = [r.spec for r in self.rules]  # type: ignore[misc]
            check_zones(self.rules, self._algorithms)
        self._ready = False
        self._failures = 0
        self._open = False
        self._open_until = 0.0
        if deny_events is not None and not isinstance(deny_events, DenyEvents):
            raise InvalidArgument(
                f"deny_events must be a DenyEvents, not {type(deny_events).__name__}",
                param="deny_events",
            )
        #: The metrics this limiter feeds (`metrics.py`), None when off.
        self.metrics: Metrics | None = metrics_of(metrics)
        #: The shipper of this limiter's denials (`events.py`), None when off.
        self.deny_events = deny_events
        if deny_events is not None and deny_events.metrics is None:
            deny_events.metrics = self.metrics
        self._observing = self.metrics is not None or deny_events is not None
        #: Each (rule index, level, allowed)'s counter in `metrics`.
        self._counts: dict[tuple[int, str, bool], Callable[[], int]] = {}
        #: Each rule's `rule` label: a policy rule's policy name, else its name.
        self.labels = [r.spec.name if isinstance(r.spec, Policy) else r.name for r in self.rules]
        if self.metrics is not None:
            self.metrics.watch_breaker("redis", self, _breaker_open)
        #: The batched and striped rules (by index), decided by grants apart
        #: from the other rules' call (`_skip`: their indexes; `_plain`: the others).
        self._grants = {i: _GrantRule(r) for i, r in enumerate(self.rules) if r.granted}
        self._skip = frozenset(self._grants)
        self._plain = [i for i in range(len(self.rules)) if i not in self._skip]
        #: Units the fallback admitted for a grant rule, per (rule index,
        #: key called): sent as `COST n FORCE` before that key's next call.
        self._grant_owed: dict[tuple[int, str], int] = {}
        ticks = [r.hold_ms for r in self.rules if r.batched]
        #: The refund timer's period: half the shortest `hold_ms`.
        self._tick_s = max(min(ticks, default=HOLD_MS) / 2000.0, 0.005)

    @property
    def ready(self) -> bool:
        """Whether the rules are known (their policies read) and Redis answered."""
        return self._ready

    @property
    def breaker_open(self) -> bool:
        """Whether the breaker is open: the fallback decides without a call."""
        return self._open

    def share(self, algo: Algorithm) -> int:
        """This instance's share: `ceil(limit / instances * 1.1)`, at least 1
        and at most the limit (in integers: a float's 10 * 1.1 is
        11.000000000000002)."""
        return share_of(_limit_of(algo), self.instances)

    def _resolved(self, policies: dict[int, dict[str, object] | None]) -> None:
        """The rules' algorithms, given the policies read for the rules that
        name one."""
        algos: list[Algorithm] = []
        for i, r in enumerate(self.rules):
            if isinstance(r.spec, Policy):
                p = policies.get(i)
                if p is None:
                    raise InvalidArgument(
                        f"policy {r.spec.name!r} is not set on the server", param="policy"
                    )
                algos.append(spec_from_policy(p))
            else:
                algos.append(r.spec)
        check_zones(self.rules, algos)
        for r, a in zip(self.rules, algos):
            if r.global_ and isinstance(a, Concurrency):
                raise InvalidArgument(
                    f"rule {r.name!r}: a CONCURRENCY policy holds leases; it has no local level",
                    param="global_",
                )
        self._read_algorithms = list(algos)
        self._algorithms = self._at_scale(algos)

    def rescale(self, policy: str, scale: int) -> None:
        """Runs the rules that name `policy` at `scale` percent (their size
        and rate parameters, as the server does): a protection loop's
        `attach` calls it with the scale it read, so the local level of a
        global policy rule and the fallback shrink with the server's."""
        self._scales[policy] = scale
        if self._read_algorithms is not None:
            self._algorithms = self._at_scale(self._read_algorithms)

    def watch(self, protection: Any) -> None:
        """Tells `protection` (a protection loop's `attach` calls it) of
        every call of a policy rule this limiter denies without asking the
        server, from its deny cache or the local level of a global rule:
        it reports them as `DENIED n`, so the server's stages count them."""
        if protection not in self._watchers:
            self._watchers.append(protection)

    def _denied_here(self, index: int) -> None:
        """Rule `index` denied a call without the server: a policy rule's
        denial is counted by the loops watching its policy."""
        spec = self.rules[index].spec
        if isinstance(spec, Policy):
            for p in self._watchers:
                if spec.name in p.policies:
                    p.record_denied(spec.name)

    def _observed(
        self, a: Admission, identity: str, client_ip: str | None, user_agent: str | None
    ) -> Admission:
        """The metrics and deny event of a decision taken (when either is on)."""
        d, index, path = a.decision, a.index, a.path
        m = self.metrics
        if m is not None:
            # The counter of (rule, level, outcome), kept: one call counts.
            k = (index, path, d.allowed)
            count = self._counts.get(k)
            if count is None:
                outcome = "admitted" if d.allowed else "denied"
                count = self._counts[k] = m.counter(self.labels[index], path, outcome)
            count()
            if path == "redis" or path == "local":
                m.remaining(self.labels[index], d.remaining, d.limit)
        events = self.deny_events
        if events is not None and not d.allowed:
            # A plain tuple of what the decision gave: its timestamp and
            # JSON are made on the flusher.
            events._push(
                (
                    time.time(),
                    self.rules[index].key_for(identity),
                    self.labels[index],
                    path,
                    "denied",
                    d.limit,
                    d.remaining,
                    d.wait_ms,
                    cut_header(client_ip),
                    cut_header(user_agent),
                )
            )
        return a

    def _at_scale(self, algos: list[Algorithm]) -> list[Algorithm]:
        out = list(algos)
        for i, r in enumerate(self.rules):
            if isinstance(r.spec, Policy) and r.spec.name in self._scales:
                out[i] = scaled_algorithm(algos[i], self._scales[r.spec.name])
        return out

    def _policies(self) -> list[tuple[int, str]]:
        """The rules that name a policy, to read before the first decision."""
        if self._algorithms is not None:
            return []
        return [(i, r.spec.name) for i, r in enumerate(self.rules) if isinstance(r.spec, Policy)]

    def _leases(self, held: list[Held]) -> list[tuple[str, int]]:
        """Gives back the local units of `held`; the leases left to release."""
        for key, rule, _ in held:
            self.local.unhold(rule, key)
        return [(key, lease) for key, _, lease in held if lease is not None]

    def _released(self, key: str, lease: int, error: BaseException | None) -> None:
        if error is None:
            self.stats.leases_released += 1
            return
        self.stats.release_errors += 1
        log.warning("redis-ratelimit: releasing lease %d of %r failed (%s)", lease, key, error)

    def _algorithm(self, index: int) -> Algorithm | None:
        algos = self._algorithms or []
        return algos[index] if index < len(algos) else None

    @staticmethod
    def _checked(request: Request | None) -> Request:
        if request is None:
            return ONE
        if not isinstance(request, Request):
            raise InvalidArgument(
                f"request must be a Request, not {type(request).__name__}", param="request"
            )
        if request.kind is not RequestKind.COST:
            raise InvalidArgument(
                "a limiter decides Request.cost(n): a forced cost or a refund goes to the "
                "client's typed calls",
                param=request.option,
            )
        return request

    # -- the steps before the call ----------------------------------------

    def _begin(self, identity: str, request: Request | None) -> Admission | _Plan:
        """The deny cache, then the local level: an answer without a round
        trip, or the plan of the call."""
        req = self._checked(request)
        keys = self._keys(identity)
        cached = self._cached(keys)
        if cached is not None:
            return cached
        plan = _Plan(keys, req)
        if not self._ready:  # Redis away before its first answer: the fallback
            return self._decided_locally(plan, lost=False)
        # The local level of the global rules: taken before the call, from
        # this instance's share; all or nothing.
        at = Micros.now()
        for i, (r, a) in enumerate(zip(self.rules, self._algorithms or [])):
            if not r.global_ or isinstance(a, Concurrency) or i in self._skip:
                continue
            d = self.local.run(r.name, keys[i], a, self.share(a), req.core(), at)
            if not d.allowed:
                self._give_back(plan, at)
                self.stats.local_denied += 1
                self._denied_here(i)
                return Admission(dataclasses.replace(d, remaining=0), i, "local")
            plan.taken[i] = d
        if self._open:
            self.stats.breaker_skipped += 1
            due = time.monotonic() >= self._open_until
            if not (due and self._due_probe()):
                return self._decided_locally(plan, lost=False)
        self.stats.redis_calls += 1
        return plan

    def _keys(self, identity: str) -> list[str]:
        if not isinstance(identity, str):
            raise InvalidArgument(f"identity must be a str, not {identity!r}", param="identity")
        return [r.key_for(identity) for r in self.rules]

    def _cached(self, keys: list[str]) -> Admission | None:
        """A denial of the deny cache for these keys, if any."""
        now = time.monotonic()
        for i, (r, k) in enumerate(zip(self.rules, keys)):
            cached = self.deny_cache.get(r.name, k, now)
            if cached is not None:
                self.stats.deny_cache_hits += 1
                self._denied_here(i)
                return Admission(cached, i, "deny_cache")
        rated = self._rated()
        if len(rated) > 1:
            cached = self.deny_cache.get(*self._set_key(rated, keys), now)
            if cached is not None:
                self.stats.deny_cache_hits += 1
                index = rated[cached.denied_by or 0]
                self._denied_here(index)
                return Admission(cached, index, "deny_cache")
        return None

    def _due_probe(self) -> bool:
        """The breaker's time is up: probe Redis; whether this decision may call it."""
        raise NotImplementedError

    def _outcome(
        self, plan: _Plan, outcome: tuple[Decision, int] | BaseException | None
    ) -> tuple[Admission, list[Held]]:
        """The answer of a call (`(decision, rule index)`, its error, or None
        when the deadline passed), and the leases to give back (those of a
        denial or a failure)."""
        back, plan.held = plan.held, []
        if isinstance(outcome, tuple):
            d, index = outcome
            if d.allowed:
                plan.held, back = back, []
            return self._answered(plan, d, index), back
        return self._failed(plan, outcome), back

    def _give_back(self, plan: _Plan, at: Micros) -> None:
        """Refunds what the local level took for a request that was denied."""
        for i in plan.taken:
            a = self._algorithm(i)
            assert a is not None and not isinstance(a, Concurrency)
            r = self.rules[i]
            self.local.refund(r.name, plan.keys[i], a, self.share(a), at, plan.request.units)
        plan.taken.clear()

    def _abandoned(self, plan: _Plan) -> list[Held]:
        """A decision cut short (a cancellation, an interrupt): the call on
        its way (`plan.sent`) may have been counted, so it is charged as a
        lost one (a lease held until its expiry); the local level's units
        of the rules no call took to Redis are given back. The leases
        taken, to give back."""
        algos = self._algorithms or []
        now, mono = Micros.now(), time.monotonic()
        for i in plan.sent:
            if i not in plan.taken and i < len(algos):
                a = algos[i]
                self._charge_lost(i, plan.keys[i], a, self.share(a), plan.request.units, now, mono)
        for i in [i for i in plan.taken if i not in plan.sent]:
            a = algos[i]
            r = self.rules[i]
            self.local.refund(r.name, plan.keys[i], a, self.share(a), now, plan.request.units)
            del plan.taken[i]
        back, plan.held = plan.held, []
        return back

    # -- the calls ------------------------------------------------------------

    def _calls(self, plan: _Plan) -> Generator[Call, Decision, tuple[Decision, int]]:
        """The calls of one decision, each answered with its decision: first
        the units owed to these keys (`COST n FORCE`, their answers
        ignored), then the leases (each its own call: RL.ALL refuses
        CONCURRENCY), then the rate rules in one call; a denial gives the
        leases back. `plan.sent`: the rules of the call on its way. Every
        unit Redis admits is charged to this instance's accounts."""
        keys, req = plan.keys, plan.request
        for i, r in enumerate(self.rules):
            units = self.owed.pop((i, keys[i]), 0)
            if units:
                self.stats.owed_sent += 1
                yield keys[i], r.spec, Request.force(units)
        algos = self._algorithms or [r.spec for r in self.rules]  # type: ignore[misc]
        leased = [i for i, a in enumerate(algos) if isinstance(a, Concurrency)]
        rated = [i for i in range(len(self.rules)) if i not in leased and i not in self._skip]
        decisions: list[tuple[Decision, int]] = []
        for i in leased:
            plan.sent[:] = [i]
            d = yield keys[i], self.rules[i].spec, ONE
            plan.sent.clear()
            if d.lease is not None:
                # Held in the account too until its release: the fallback
                # counts it among this instance's requests in flight.
                self.local.hold(self.rules[i].name, keys[i], self.share(algos[i]), force=True)
                plan.held.append((keys[i], self.rules[i].name, d.lease))
            if not d.allowed:
                return d, i
            decisions.append((d, i))
        if rated:
            plan.sent[:] = rated
            if len(rated) == 1:
                index = rated[0]
                d = yield keys[index], self.rules[index].spec, req
            else:
                d = yield None, [(keys[i], self.rules[i].spec) for i in rated], req
                index = rated[d.denied_by or 0] if not d.allowed else self._rated_rule_of(d, rated)
                if not d.allowed:
                    plan.denied_set[:] = rated
            plan.sent.clear()
            if not d.allowed:
                return d, index
            now = Micros.now()
            for i in rated:
                if i not in plan.taken:
                    a = algos[i]
                    self.local.charge(self.rules[i].name, keys[i], a, self.share(a), now, req.units)
            decisions.append((d, index))
        return min(decisions, key=lambda di: di[0].remaining)

    def _rated(self) -> list[int]:
        """The rate rules (not concurrency), which go to Redis in one call."""
        algos = self._algorithms or [r.spec for r in self.rules]  # type: ignore[misc]
        return [
            i for i, a in enumerate(algos) if not isinstance(a, Concurrency) and i not in self._skip
        ]

    def _set_key(self, rated: list[int], keys: list[str]) -> tuple[str, str]:
        """The deny cache's entry for an RL.ALL denial: its rules and keys
        together. Its wait is the slowest denier's, which need not be the
        rule it names: cached under that rule alone, another set with it
        would be denied past the rule's own wait."""
        return (
            "\x01".join(self.rules[i].name for i in rated),
            "\x01".join(keys[i] for i in rated),
        )

    def _rated_rule_of(self, d: Decision, rated: list[int]) -> int:
        """The rule an admitted RL.ALL reported (the most restrictive one)."""
        algos = self._algorithms or []
        for i in rated:
            if i < len(algos) and _limit_of(algos[i]) == d.limit:
                return i
        return rated[0]

    # -- the steps after the call ----------------------------------------------

    def _answered(self, plan: _Plan, d: Decision, index: int) -> Admission:
        """Redis answered: the breaker closes; a denial is cached (not a
        concurrency one, which may end at the next release), gives back
        the local level's units and the leases."""
        self._failures = 0
        if d.allowed:
            self.stats.redis_admitted += 1
            return Admission(d, index, "redis", plan.held)
        self.stats.redis_denied += 1
        if len(plan.denied_set) > 1:
            self.deny_cache.put(*self._set_key(plan.denied_set, plan.keys), d, time.monotonic())
        elif not isinstance(self._algorithm(index), Concurrency):
            self.deny_cache.put(self.rules[index].name, plan.keys[index], d, time.monotonic())
        self._give_back(plan, Micros.now())
        return Admission(d, index, "redis")

    def _failed(self, plan: _Plan, e: BaseException | None) -> Admission:
        """Redis failed (`e`; None: the deadline passed): the breaker counts
        it and the fallback decides. A lost answer is charged; an error
        reply charges nothing: Redis applied nothing."""
        return self._decided_locally(plan, self._count_failure(e))

    def _count_failure(self, e: BaseException | None) -> bool:
        """A failed call (`e`; None: the deadline passed) counts towards the
        breaker; whether its answer may have been lost (Redis counted it)."""
        if e is None:
            self.stats.redis_timeouts += 1
            lost = True
        else:
            self.stats.redis_errors += 1
            log.warning("redis-ratelimit: Redis failed (%s); the fallback decides", e)
            lost = answer_lost(e)
        # A key of another type is about that key, not Redis away: it does
        # not count towards the breaker (one identity would open it for all).
        if not isinstance(e, WrongType):
            self._failures += 1
        if self._failures >= self.breaker_failures and not self._open:
            self._open = True
            self.stats.breaker_opened += 1
            log.warning("redis-ratelimit: breaker open for %.1f s", self.breaker_open_for)
            self._open_until = time.monotonic() + self.breaker_open_for
        return lost

    def _probed(self, ok: bool) -> None:
        if not ok:
            self._open_until = time.monotonic() + self.breaker_open_for
            return
        self.stats.probes_ok += 1
        self._failures = 0
        self._open = False
        log.info("redis-ratelimit: Redis answers again; breaker closed")

    # -- batched and striped rules (grants.py) --------------------------------------

    def _new_signal(self) -> Any:
        """What deciders waiting for a flight wait on (an event, a future)."""
        raise NotImplementedError

    def _signal(self, flight: Flight) -> None:
        raise NotImplementedError

    def _hold_started(self) -> None:
        """Units are held: the refund timer must run."""
        raise NotImplementedError

    def _may_call(self) -> bool:
        """Whether a grant rule may call Redis now (else the fallback decides)."""
        if not self._ready:
            return False
        if self._open:
            self.stats.breaker_skipped += 1
            return time.monotonic() >= self._open_until and self._due_probe()
        return True

    def _tags_known(self, g: _GrantRule) -> bool:
        """A striped rule's tags, picked (again when the slot map changed);
        False while no slot map is known (the fallback decides)."""
        n = g.rule.striped
        if n == 1:
            return True
        client: Any = getattr(self, "client", None)
        if not getattr(client, "is_cluster", False):
            if g.tags is None:
                g.tags = repick_tags(ONE_MASTER, [None] * n)
            return True
        rc = client.redis
        cache = rc.nodes_manager.slots_cache
        if cache is not g.seen:
            _, owners = slot_owners(rc)
            if not owners:
                return g.tags is not None
            g.tags = repick_tags(owners, g.tags or [None] * n)
            g.seen = cache
        return True

    def _grant_steps(self, index: int, key: str, units: int) -> Generator[GrantStep, Any, _Granted]:
        """One grant rule's decision: its own stripe (or its key), then on a
        denial the next stripe; a failure goes to the fallback."""
        g = self._grants[index]
        if not self._tags_known(g):
            return self._grant_fallback(index, key, key, units)
        denials: list[_Granted] = []
        for called, spec in g.targets(key):
            if g.rule.batched:
                out = yield from self._batched_steps(index, g, called, spec, units)
            else:
                out = yield from self._stripe_steps(index, called, spec, units)
            if out is None:
                return self._grant_fallback(index, key, called, units)
            if out.decision.allowed:
                return out
            denials.append(out)
        if len(denials) == 2:
            own, other = denials
            # Level grant only when neither stripe asked Redis (as the Node kit).
            path = "grant" if own.path == other.path == "grant" else "redis"
            return _Granted(stripe_denial(own.decision, other.decision), path)
        return denials[0]

    def _owed_steps(
        self, index: int, called: str, spec: Algorithm
    ) -> Generator[GrantStep, Any, bool]:
        """Sends the units the fallback admitted for this key (`COST n
        FORCE`); whether it reached Redis."""
        owed = self._grant_owed.pop((index, called), 0)
        if not owed:
            return True
        self.stats.owed_sent += 1
        self.stats.grant_calls += 1
        answer = yield called, spec, Request.force(owed)
        if isinstance(answer, _Failure):
            self._grant_owed[(index, called)] = owed
            self._count_failure(answer.error)
            return False
        return True

    def _stripe_steps(
        self, index: int, called: str, spec: Algorithm, units: int
    ) -> Generator[GrantStep, Any, _Granted | None]:
        """An unbatched stripe: `COST units` on its key (None: failed)."""
        if not self._may_call():
            return None
        if not (yield from self._owed_steps(index, called, spec)):
            return None
        self.stats.grant_calls += 1
        d = yield called, spec, Request.cost(units)
        if isinstance(d, _Failure):
            self._count_failure(d.error)
            return None
        self._failures = 0
        return _Granted(d, "redis", ("refund", called, spec, units) if d.allowed else None)

    def _batched_steps(
        self, index: int, g: _GrantRule, called: str, spec: Algorithm, units: int
    ) -> Generator[GrantStep, Any, _Granted | None]:
        """A batched key: held units, else a denial before `next_ask_at`,
        else the `UPTO b` call in flight (waited for), else one of its own
        (None: failed, the fallback decides)."""
        now = _ms()
        b = g.batches.get(called)
        if b is None:
            b = g.batches[called] = Batch(spec, g.rule.hold_ms, g.rule.max_share_pct)
        b.used_at = now
        b.rate.note(now)
        d = b.from_held(units)
        if d is not None:
            self.stats.grant_held += 1
            return _Granted(d, "grant", ("held", b, units))
        flight = b.flight
        if flight is not None:
            ok = yield flight
            d = b.from_held(units)
            if d is None and (flight.failed or not ok):
                return None
            d = d or b.after_wait(_ms(), units)
            if d is None:
                return None
            if d.allowed:
                self.stats.grant_held += 1
                return _Granted(d, "grant", ("held", b, units))
            self.stats.grant_denied += 1
            return _Granted(d, "grant")
        d = b.denied_here(now)
        if d is not None:
            self.stats.grant_denied += 1
            return _Granted(d, "grant")
        if not self._may_call():
            return None
        size = b.size(now, units)
        flight = b.flight = Flight(self._new_signal())
        # Until the answer comes, the flight counts as failed: a caller
        # cancelled meanwhile sends its waiters to the fallback, not to an
        # older reply's fields.
        flight.failed = True
        try:
            if not (yield from self._owed_steps(index, called, spec)):
                return None
            self.stats.grant_calls += 1
            answer = yield called, spec, Request.upto(size)
            if isinstance(answer, _Failure):
                self._count_failure(answer.error)
                return None
            self._failures = 0
            d = b.granted(answer, now, size, units)
            flight.failed = False
            if not d.allowed and b.held:
                # A grant too small for the cost: back at once.
                self.stats.grant_refunds += 1
                yield called, spec, Request.refund(b.drain())
        finally:
            b.flight = None
            self._signal(flight)
        if b.held:
            self._hold_started()
        return _Granted(d, "redis", ("held", b, units) if d.allowed else None)

    def _grant_fallback(self, index: int, key: str, called: str, units: int) -> _Granted:
        """A grant rule while Redis is away, as the fallback decides any
        rule: the local-only account of the whole rule (what it admits is
        owed to `called`, sent as `COST n FORCE` before its next call),
        fail open or fail closed."""
        r = self.rules[index]
        algo: Algorithm = r.spec  # type: ignore[assignment]
        share = self.share(algo)
        now = Micros.now()
        if self.fallback is FallbackMode.FAIL_CLOSED:
            self.stats.fallback_denied += 1
            wait = math.ceil(self.breaker_open_for * 1000)
            return _Granted(Decision(False, _limit_of(algo), 0, wait, wait), "fallback")
        if self.fallback is FallbackMode.FAIL_OPEN:
            self.stats.fallback_admitted += 1
            d = self.local.charge(r.name, key, algo, share, now, units)
            return _Granted(dataclasses.replace(d, allowed=True, wait_ms=0), "fallback")
        peek = self.local.peek(r.name, key, algo, share, Request.cost(units).core(), now)
        if not peek.allowed:
            self.stats.fallback_denied += 1
            return _Granted(dataclasses.replace(peek, allowed=False), "fallback")
        self.stats.fallback_admitted += 1
        d = self.local.charge(r.name, key, algo, share, now, units)
        if len(self._grant_owed) >= self.max_owed:
            self._grant_owed.clear()
        self._grant_owed[(index, called)] = self._grant_owed.get((index, called), 0) + units
        back = ("local", index, key, called, units)
        return _Granted(dataclasses.replace(d, allowed=True, wait_ms=0), "fallback", back)

    def _grants_back(self, granted: list[_Granted]) -> list[Refund]:
        """Another rule denied: the grant rules' units go back (to what is
        held, to the fallback's account); the REFUNDs to send."""
        refunds: list[Refund] = []
        for out in granted:
            back = out.back
            if back is None:
                continue
            if back[0] == "held":
                back[1].held += back[2]
                # Held again: they go back after hold_ms as any held unit,
                # even when nothing else was held (no refund timer running).
                self._hold_started()
            elif back[0] == "refund":
                refunds.append((back[1], back[2], back[3]))
            else:
                _, index, key, called, units = back
                r = self.rules[index]
                algo: Algorithm = r.spec
                self.local.refund(r.name, key, algo, self.share(algo), Micros.now(), units)
                left = self._grant_owed.get((index, called), 0) - units
                if left > 0:
                    self._grant_owed[(index, called)] = left
                else:
                    self._grant_owed.pop((index, called), None)
        return refunds

    def _flights(self) -> list[Flight]:
        """The `UPTO` calls in flight (close waits for their units)."""
        return [b.flight for g in self._grants.values() for b in g.batches.values() if b.flight]

    def _stale_grants(self, drain: bool = False) -> tuple[list[Refund], bool]:
        """The units held longer than `hold_ms` (every unit held, `drain`),
        taken out to refund, and whether any are still held. Batches idle
        for a while are dropped."""
        now = _ms()
        refunds: list[Refund] = []
        still = False
        for g in self._grants.values():
            idle_ms = 10 * g.rule.hold_ms + 1000
            for called, b in list(g.batches.items()):
                units = b.drain() if drain else b.stale(now)
                if units:
                    refunds.append((called, b.spec, units))
                if b.held:
                    still = True
                elif b.flight is None and now - b.used_at > idle_ms and now >= b.next_ask_at:
                    del g.batches[called]
        self.stats.grant_refunds += len(refunds)
        return refunds, still

    def _combined(self, granted: list[tuple[int, _Granted]], plain: Admission | None) -> Admission:
        """An admission of every rule: the fields of the one with the least left."""
        options = [(out.decision, i, out.path) for i, out in granted]
        if plain is not None:
            options.append((plain.decision, plain.index, plain.path))
        d, index, path = min(options, key=lambda o: o[0].remaining)
        return Admission(d, index, path, plain.held if plain is not None else [])

    # -- the fallback ------------------------------------------------------------

    def _decided_locally(self, plan: _Plan, lost: bool) -> Admission:
        """The fallback's answer. `lost`: the answer of the call on its way
        (`plan.sent`) was lost; Redis may have counted the request there."""
        lost_rules = list(plan.sent) if lost else []
        d, index, held = self._fallback(plan, lost_rules)
        if d.allowed:
            self.stats.fallback_admitted += 1
            if self.fallback is FallbackMode.LOCAL_ONLY:
                self._owe(plan, lost_rules)
        else:
            self.stats.fallback_denied += 1
            if not lost:
                self._give_back(plan, Micros.now())
        return Admission(d, index, "fallback", [*plan.held, *held])

    def _owe(self, plan: _Plan, lost: list[int]) -> None:
        """The rate units the fallback admitted that no call brought to
        Redis: owed to it."""
        if len(self.owed) >= self.max_owed:
            self.owed.clear()
        for i, a in enumerate(self._algorithms or []):
            if i not in lost and not isinstance(a, Concurrency) and i not in self._skip:
                k = (i, plan.keys[i])
                self.owed[k] = self.owed.get(k, 0) + plan.request.units

    def _fallback(self, plan: _Plan, lost: list[int]) -> tuple[Decision, int, list[Held]]:
        """(decision, rule index, the local units an admission holds).

        `lost`: the rules whose call's answer was lost (a timeout, a
        connection dropped after sending): Redis may have counted the request
        there, so it is charged to their accounts whatever is decided. The
        local level's units (`plan.taken`) are charged already."""
        algos = self._algorithms or []
        keys, units = plan.keys, plan.request.units
        if not algos:
            return Decision(True, 0, 0, 0, 0), 0, []
        now, mono = Micros.now(), time.monotonic()
        shares = [self.share(a) for a in algos]
        if self.fallback is not FallbackMode.LOCAL_ONLY:
            for i in lost:
                if i not in plan.taken:
                    self._charge_lost(i, keys[i], algos[i], shares[i], units, now, mono)
            if self.fallback is FallbackMode.FAIL_CLOSED:
                wait = math.ceil(self.breaker_open_for * 1000)
                first = self._plain[0]
                return Decision(False, _limit_of(algos[first]), 0, wait, wait), first, []
            # Fail open: charged too (forced), so the fields count down.
            for i, (a, r, k) in enumerate(zip(algos, self.rules, keys)):
                if i in self._skip:
                    continue
                if i not in lost and i not in plan.taken and not isinstance(a, Concurrency):
                    self.local.charge(r.name, k, a, shares[i], now, units)
            d, index = self._account_fields(keys, algos, shares, now)
            return d, index, []
        # Local only: admitted if every account has the units, all or nothing.
        denied: tuple[Decision, int] | None = None
        for i, (a, r, k) in enumerate(zip(algos, self.rules, keys)):
            if i in self._skip:
                continue
            if i in plan.taken:
                continue
            if isinstance(a, Concurrency):
                room = self.local._held(r.name, k, mono) < shares[i]
            else:
                room = self.local.peek(r.name, k, a, shares[i], plan.request.core(), now).allowed
            if not room and denied is None:
                if isinstance(a, Concurrency):
                    denied = Decision(False, _limit_of(a), 0, 1000, 1000), i
                else:
                    d = self.local.peek(r.name, k, a, shares[i], plan.request.core(), now)
                    denied = dataclasses.replace(d, allowed=False), i
        held: list[Held] = []
        best: tuple[Decision, int] | None = None
        for i, (a, r, k) in enumerate(zip(algos, self.rules, keys)):
            if i in self._skip:
                continue
            if i in plan.taken:
                d = plan.taken[i]
            elif i in lost:
                d = self._charge_lost(i, k, a, shares[i], units, now, mono)
            elif denied is not None:
                continue
            elif isinstance(a, Concurrency):
                d = self.local.hold(r.name, k, shares[i], now=mono)
                d = dataclasses.replace(d, limit=_limit_of(a))
                held.append((k, r.name, None))
            else:
                d = self.local.charge(r.name, k, a, shares[i], now, units)
            if best is None or d.remaining < best[0].remaining:
                best = d, i
        if denied is not None:
            return denied[0], denied[1], []
        assert best is not None
        return dataclasses.replace(best[0], allowed=True, wait_ms=0), best[1], held

    def _charge_lost(
        self, i: int, key: str, algo: Algorithm, share: int, units: int, now: Micros, mono: float
    ) -> Decision:
        """Charges a lost call's units to rule `i`'s account: rate units, or
        a lease held until it would have expired."""
        name = self.rules[i].name
        if isinstance(algo, Concurrency):
            d = self.local.hold_lost(name, key, share, algo.lease_ms, mono)
            return dataclasses.replace(d, limit=algo.limit)
        return self.local.charge(name, key, algo, share, now, units)

    def _account_fields(
        self, keys: list[str], algos: list[Algorithm], shares: list[int], now: Micros
    ) -> tuple[Decision, int]:
        """A fail-open admission: the fields of the rate account with the
        least left (never a full quota)."""
        best: tuple[Decision, int] | None = None
        mono = time.monotonic()
        for i, (a, r, k) in enumerate(zip(algos, self.rules, keys)):
            if i in self._skip:
                continue
            if isinstance(a, Concurrency):
                held = self.local._held(r.name, k, mono)
                d = Decision(True, _limit_of(a), max(shares[i] - held, 0), 0, 0)
            else:
                d = self.local.fields(r.name, k, a, shares[i], now)
            if best is None or d.remaining < best[0].remaining:
                best = d, i
        assert best is not None
        return best


class AsyncLimiter(_Limiting):
    """The limiter on `redis.asyncio` (`AsyncClient`): `await check(identity)`.

    `rules`: the rules every request is checked against (a `Rule` with
    `global_=True` gets a local level). `deadline`: the seconds a decision
    waits for Redis before the fallback decides. `instances`: the instances
    sharing each limit (the share of each is `ceil(limit / instances *
    1.1)`). `connections`: the pool's connections opened at start-up. The
    breaker opens after `breaker_failures` failures in a row; after
    `breaker_open_for` seconds one `PING` in the background probes, and its
    answer closes it. Until Redis first answered, a check awaits the
    start-up at most `max(deadline * 10, 1 s)`, and after a failure tries
    it again at most once per `breaker_open_for`.

    `metrics`: a prometheus_client `CollectorRegistry` (or `True`: its
    default `REGISTRY`, or a `Metrics`) the decisions are counted in
    (`metrics.py`; needs the `metrics` extra); `deny_events`: a
    `DenyEvents` every denial is recorded to (`events.py`).

    A rule with `batched=True` or `striped=N` (`Rule`, `grants.py`) is
    decided first, by its own calls (`UPTO b` for a batched one, the own
    stripe then the next for a striped one), and the other rules after it;
    a denial of theirs gives its units back. `await aclose()` (or `async
    with`) gives back every unit the batched rules hold.
    """

    def __init__(
        self,
        client: AsyncClient | Any,
        rules: Sequence[Rule],
        *,
        fallback: FallbackMode = FallbackMode.LOCAL_ONLY,
        deadline: float = 0.1,
        deny_cache_max: float = 1.0,
        instances: int = 1,
        breaker_failures: int = 5,
        breaker_open_for: float = 1.0,
        connections: int = 16,
        metrics: object = None,
        deny_events: DenyEvents | None = None,
    ) -> None:
        super().__init__(
            rules=rules,
            fallback=fallback,
            deadline=deadline,
            deny_cache_max=deny_cache_max,
            instances=instances,
            breaker_failures=breaker_failures,
            breaker_open_for=breaker_open_for,
            metrics=metrics,
            deny_events=deny_events,
        )
        self.client = client if isinstance(client, AsyncClient) else AsyncClient(client)
        self.connections = connections
        self._resolving: asyncio.Lock | None = None
        #: The start-up `check` runs, and the monotonic time before which it
        #: does not try it again after a failure.
        self._starting: asyncio.Future[None] | None = None
        self._startup_after = 0.0
        self._probe: asyncio.Task[None] | None = None
        self._releasing: set[asyncio.Future[None]] = set()
        #: The refund timer of the batched rules, while units are held.
        self._timer: asyncio.Future[None] | None = None

    async def startup(self) -> None:
        """Checks the server (`PING`, `MODULE LIST`) and reads the rules'
        policies, once: raises `ModuleMissing`, `InvalidArgument` for a
        missing policy, and Redis's error when it is away (until it
        answers, `check` lets the fallback decide)."""
        if self._ready:
            return
        if self._resolving is None:
            self._resolving = asyncio.Lock()
        async with self._resolving:  # one check for a burst of first requests
            if not self._ready:
                await self._check_and_read()

    async def _check_and_read(self) -> None:
        await self.client.redis.ping()
        await self.client.check_module()
        await self._connected()
        if self._algorithms is None:
            self._resolved({i: await self.client.policy_get(n) for i, n in self._policies()})
        self._ready = True

    async def _connected(self) -> None:
        """Opens `connections` connections of a standalone client's pool at
        once (a connection costs a connect and redis-py's handshake, several
        round trips: a cold burst that opened one per request missed its
        deadline on a loaded host)."""
        pool = getattr(self.client.redis, "connection_pool", None)
        if pool is None or self.connections <= 1:
            return
        wanted = min(self.connections, getattr(pool, "max_connections", self.connections))
        name = ("PING",) if _takes_command_name(pool) else ()
        opened = await asyncio.gather(*(pool.get_connection(*name) for _ in range(wanted)))
        for conn in opened:
            await pool.release(conn)

    async def check(
        self,
        identity: str,
        request: Request | None = None,
        *,
        client_ip: str | None = None,
        user_agent: str | None = None,
    ) -> Admission:
        """Decides one request (`Request.cost(n)`, default one unit) of
        `identity` under every rule. Never fails for Redis: where it cannot
        answer, the fallback decides, and `Admission.path` says which path
        did. Give `Admission.held` to `release` when the work is done.
        `client_ip` and `user_agent`: the HTTP request's, for a deny event."""
        if client_ip is not None or user_agent is not None:
            check_http(client_ip, user_agent)
        if not self._ready and time.monotonic() >= self._startup_after:
            await self._started()
        if self._grants:
            admission = await self._decide_granted(identity, request)
        else:
            admission = await self._decide(identity, request)
        if self._observing:
            self._observed(admission, identity, client_ip, user_agent)
        return admission

    async def _decide(self, identity: str, request: Request | None) -> Admission:
        """The rules but the grant rules: the deny cache, the local level,
        one call, the fallback."""
        plan = self._begin(identity, request)
        if isinstance(plan, Admission):
            return plan
        outcome: tuple[Decision, int] | BaseException | None
        try:
            outcome = await asyncio.wait_for(self._drive(plan), self.deadline)
        except asyncio.TimeoutError:
            outcome = None
        except REDIS_FAILURES as e:
            outcome = e
        except BaseException:
            self._release_later(self._abandoned(plan))
            raise
        admission, back = self._outcome(plan, outcome)
        self._release_later(back)
        return admission

    async def _decide_granted(self, identity: str, request: Request | None) -> Admission:
        """As `Limiter._decide_granted`."""
        req = self._checked(request)
        keys = self._keys(identity)
        cached = self._cached(keys) if self._plain else None
        if cached is not None:
            return cached
        granted: list[tuple[int, _Granted]] = []
        try:
            for i in self._grants:
                out = await self._drive_grant(i, keys[i], req.units)
                if not out.decision.allowed:
                    self._give_grants_back(granted)
                    return Admission(out.decision, i, out.path)
                granted.append((i, out))
            plain = await self._decide(identity, req) if self._plain else None
        except BaseException:
            self._give_grants_back(granted)
            raise
        if plain is not None and not plain.allowed:
            self._give_grants_back(granted)
            return plain
        return self._combined(granted, plain)

    def _give_grants_back(self, granted: list[tuple[int, _Granted]]) -> None:
        refunds = self._grants_back([out for _, out in granted])
        if refunds:
            self._background(self._send_refunds(refunds))

    def _background(self, coro: Any) -> None:
        """Runs `coro` in a task a cancellation of the caller cannot stop."""
        task = asyncio.ensure_future(coro)
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _drive_grant(self, index: int, key: str, units: int) -> _Granted:
        """A grant rule's steps: each call within the deadline, a wait for
        another decider's call within ten."""
        steps = self._grant_steps(index, key, units)
        try:
            step = next(steps)
            while True:
                if isinstance(step, Flight):
                    try:
                        wait = max(self.deadline * 10, 1.0)
                        await asyncio.wait_for(asyncio.shield(step.signal), wait)
                        ok = True
                    except asyncio.TimeoutError:
                        ok = False
                    step = steps.send(ok)
                    continue
                answer: Decision | _Failure
                try:
                    answer = await asyncio.wait_for(self._send(step), self.deadline)
                except asyncio.TimeoutError:
                    answer = _Failure(None)
                except REDIS_FAILURES as e:
                    answer = _Failure(e)
                step = steps.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            steps.close()

    def _new_signal(self) -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()

    def _signal(self, flight: Flight) -> None:
        if not flight.signal.done():
            flight.signal.set_result(None)

    def _hold_started(self) -> None:
        if self._timer is None or self._timer.done():
            self._timer = asyncio.ensure_future(self._refunding())

    async def _refunding(self) -> None:
        """As `Limiter._refunding`, a task."""
        while True:
            await asyncio.sleep(self._tick_s)
            refunds, still = self._stale_grants()
            if refunds:
                self._background(self._send_refunds(refunds))
            if not still:
                self._timer = None
                return

    async def _send_refunds(self, refunds: list[Refund]) -> None:
        """As `Limiter._send_refunds`."""
        for key, spec, units in refunds:
            try:
                await asyncio.wait_for(
                    self.client.limit(key, spec, Request.refund(units)),
                    max(self.deadline * 10, 0.1),
                )
            except (RedisError, OSError, asyncio.TimeoutError, *REDIS_FAILURES) as e:
                log.warning("redis-ratelimit: refunding %d units of %r failed (%s)", units, key, e)

    async def aclose(self) -> None:
        """As `Limiter.close`: every held unit back, the refund timer stopped;
        awaits the refunds and releases still on their way."""
        flights = [f.signal for f in self._flights()]
        if flights:
            # The units of an ask in flight go back too: wait for its answer.
            await asyncio.wait(flights, timeout=max(self.deadline * 10, 1.0))
        timer, self._timer = self._timer, None
        if timer is not None and not timer.done():
            timer.cancel()
        refunds, _ = self._stale_grants(drain=True)
        await self._send_refunds(refunds)
        if self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)

    async def __aenter__(self) -> AsyncLimiter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _started(self) -> None:
        """The start-up, awaited at most `max(deadline * 10, 1 s)` (it goes
        on in the background); after a failure it is tried again at most
        once per `breaker_open_for`, and meanwhile the fallback decides."""
        if self._starting is None or self._starting.done():
            self._starting = asyncio.ensure_future(self.startup())
            self._starting.add_done_callback(_retrieved)
        try:
            await asyncio.wait_for(asyncio.shield(self._starting), max(self.deadline * 10, 1.0))
        except (RedisError, OSError, asyncio.TimeoutError) as e:
            self._startup_after = time.monotonic() + self.breaker_open_for
            log.warning("redis-ratelimit: cannot read the rules yet (%s)", str(e) or "no answer")

    async def _drive(self, plan: _Plan) -> tuple[Decision, int]:
        calls = self._calls(plan)
        try:
            call = next(calls)
            while True:
                call = calls.send(await self._send(call))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _send(self, call: Call) -> Decision:
        key, spec, req = call
        if self.metrics is None:
            if key is None:
                return await self.client.all(spec, req)
            return await self.client.limit(key, spec, req)
        # Every round trip: its answer, its error, or its deadline.
        t = time.perf_counter()
        try:
            if key is None:
                return await self.client.all(spec, req)
            return await self.client.limit(key, spec, req)
        finally:
            self.metrics.redis_seconds(time.perf_counter() - t)

    async def release(self, held: list[Held]) -> None:
        """Gives back what an admission held; a failure is logged (the lease
        then ends at its expiry)."""
        for key, lease in self._leases(held):
            try:
                await asyncio.wait_for(
                    self.client.release(key, lease), max(self.deadline * 10, 0.1)
                )
                self._released(key, lease, None)
            except (RedisError, OSError, asyncio.TimeoutError) as e:
                self._released(key, lease, e)

    def _release_later(self, held: list[Held]) -> asyncio.Task[None] | None:
        """Releases in a task of its own, which a cancellation cannot stop."""
        if not held:
            return None
        task = asyncio.ensure_future(self.release(list(held)))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)
        return task

    def _due_probe(self) -> bool:
        """After `breaker_open_for`, one PING in the background; its answer
        closes the breaker. Meanwhile the fallback decides."""
        if self._probe is not None and not self._probe.done():
            return False

        async def probe() -> None:
            self.stats.probes += 1
            try:
                await asyncio.wait_for(self.client.redis.ping(), max(self.deadline * 10, 0.1))
            except Exception:
                self._probed(False)
                return
            self._probed(True)

        self._probe = asyncio.ensure_future(probe())
        return False


class Limiter(_Limiting):
    """The limiter on the sync `Client` (Flask, Django, workers, scripts):
    `check(identity)`, as `AsyncLimiter`.

    A sync call cannot be cut short: the deadline is the redis-py client's
    `socket_timeout` (build it with one, say `redis.Redis(...,
    socket_timeout=0.1)`). redis-py reconnects under the client's `retry`
    (since redis-py 6, 10 more attempts with backoff by default), beyond
    that deadline: given a `redis.Redis` on a plain pool with such a retry,
    the limiter opens a pool of its own to the same server that connects
    once. When the breaker's `breaker_open_for` has passed, the next
    decision probes with one `PING` before it calls.

    Threads may share one: its state changes under a lock, which no call to
    Redis holds (but the start-up and the breaker's one probe, each one
    attempt without redis-py's retries). While Redis has not answered yet,
    the start-up is tried again at most once per `breaker_open_for`.

    Batched and striped rules as `AsyncLimiter`'s; the refund timer is a
    daemon thread while units are held; `close()` (or `with`) gives every
    held unit back.
    """

    def __init__(
        self,
        client: Client | Any,
        rules: Sequence[Rule],
        *,
        fallback: FallbackMode = FallbackMode.LOCAL_ONLY,
        deny_cache_max: float = 1.0,
        instances: int = 1,
        breaker_failures: int = 5,
        breaker_open_for: float = 1.0,
        metrics: object = None,
        deny_events: DenyEvents | None = None,
    ) -> None:
        super().__init__(
            rules=rules,
            fallback=fallback,
            deny_cache_max=deny_cache_max,
            instances=instances,
            breaker_failures=breaker_failures,
            breaker_open_for=breaker_open_for,
            metrics=metrics,
            deny_events=deny_events,
        )
        if isinstance(client, redis.Redis):
            client = _connecting_once(client)
        self.client = client if isinstance(client, Client) else Client(client, check_module=False)
        self._lock = threading.RLock()
        #: The monotonic time before which `check` does not try the start-up again.
        self._startup_after = 0.0
        #: The refund timer of the batched rules (thread, stop), while units are held.
        self._timer: tuple[threading.Thread, threading.Event] | None = None

    def rescale(self, policy: str, scale: int) -> None:
        """As `_Limiting.rescale`, under the lock (a protection thread calls it)."""
        with self._lock:
            super().rescale(policy, scale)

    def _ping(self) -> None:
        """One PING, one attempt, on a connection of its own (the lock is
        held): a pool's connection is connected under the client's `retry`,
        by default 10 more attempts with backoff since redis-py 6, which
        stalled every thread for seconds. A cluster client PINGs as it does."""
        rc = self.client.redis
        pool = getattr(rc, "connection_pool", None)
        if not isinstance(rc, redis.Redis) or pool is None:
            rc.ping()
            return
        conn = pool.connection_class(**pool.connection_kwargs)
        try:
            connect_once(conn)
            conn.send_command("PING")
            conn.read_response()
        finally:
            conn.disconnect()

    def startup(self) -> None:
        """As `AsyncLimiter.startup`."""
        with self._lock:  # one check for a burst of first requests
            if self._ready:
                return
            self._ping()
            self.client.check_module()
            if self._algorithms is None:
                self._resolved({i: self.client.policy_get(n) for i, n in self._policies()})
            self._ready = True

    def check(
        self,
        identity: str,
        request: Request | None = None,
        *,
        client_ip: str | None = None,
        user_agent: str | None = None,
    ) -> Admission:
        """As `AsyncLimiter.check`."""
        if client_ip is not None or user_agent is not None:
            check_http(client_ip, user_agent)
        if not self._ready and time.monotonic() >= self._startup_after:
            with self._lock:
                try:
                    if time.monotonic() >= self._startup_after:
                        self.startup()
                except (RedisError, OSError) as e:
                    self._startup_after = time.monotonic() + self.breaker_open_for
                    log.warning("redis-ratelimit: cannot read the rules yet (%s)", e)
        if self._grants:
            admission = self._decide_granted(identity, request)
        else:
            admission = self._decide(identity, request)
        if self._observing:
            self._observed(admission, identity, client_ip, user_agent)
        return admission

    def _decide_granted(self, identity: str, request: Request | None) -> Admission:
        """The grant rules first (each its own calls), then the others' call;
        a denial of the others gives the grant rules' units back."""
        req = self._checked(request)
        with self._lock:
            keys = self._keys(identity)
            cached = self._cached(keys) if self._plain else None
        if cached is not None:
            return cached
        granted: list[tuple[int, _Granted]] = []
        for i in self._grants:
            out = self._drive_grant(i, keys[i], req.units)
            if not out.decision.allowed:
                self._give_grants_back(granted)
                return Admission(out.decision, i, out.path)
            granted.append((i, out))
        plain = self._decide(identity, req) if self._plain else None
        if plain is not None and not plain.allowed:
            self._give_grants_back(granted)
            return plain
        return self._combined(granted, plain)

    def _give_grants_back(self, granted: list[tuple[int, _Granted]]) -> None:
        with self._lock:
            refunds = self._grants_back([out for _, out in granted])
        self._send_refunds(refunds)

    def _drive_grant(self, index: int, key: str, units: int) -> _Granted:
        """A grant rule's steps: each under the lock, the calls and the
        waits for another decider's call without it."""
        steps = self._grant_steps(index, key, units)
        try:
            with self._lock:
                step = next(steps)
            while True:
                if isinstance(step, Flight):
                    ok = step.signal.wait(max(self.deadline * 10, 1.0))
                    with self._lock:
                        step = steps.send(ok)
                    continue
                answer: Decision | _Failure
                try:
                    answer = self._send(step)
                except RedisTimeoutError:
                    answer = _Failure(None)
                except REDIS_FAILURES as e:
                    answer = _Failure(e)
                with self._lock:
                    step = steps.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            with self._lock:
                steps.close()

    def _new_signal(self) -> threading.Event:
        return threading.Event()

    def _signal(self, flight: Flight) -> None:
        flight.signal.set()

    def _hold_started(self) -> None:
        """Starts the refund timer (under the lock) unless it runs."""
        if self._timer is None:
            stop = threading.Event()
            thread = threading.Thread(target=self._refunding, args=(stop,), daemon=True)
            self._timer = (thread, stop)
            thread.start()

    def _refunding(self, stop: threading.Event) -> None:
        """The refund timer: every half `hold_ms`, the units held longer
        than `hold_ms` go back; it ends when nothing is held."""
        while not stop.wait(self._tick_s):
            with self._lock:
                refunds, still = self._stale_grants()
                if not still and self._timer is not None and self._timer[1] is stop:
                    self._timer = None
            self._send_refunds(refunds)
            if not still:
                return

    def _send_refunds(self, refunds: list[Refund]) -> None:
        """`REFUND units` on each key, once, never retried: a failure is logged."""
        for key, spec, units in refunds:
            try:
                self.client.limit(key, spec, Request.refund(units))
            except (RedisError, OSError, ServerError, ModuleMissing, WrongType) as e:
                log.warning("redis-ratelimit: refunding %d units of %r failed (%s)", units, key, e)

    def close(self) -> None:
        """Gives back every unit the batched rules hold (`REFUND`, once) and
        stops the refund timer. The limiter may still decide afterwards (it
        then holds units again: close it again when done)."""
        with self._lock:
            flights = self._flights()
        # The units of an ask in flight go back too: wait for its answer.
        for f in flights:
            f.signal.wait(max(self.deadline * 10, 1.0))
        with self._lock:
            timer, self._timer = self._timer, None
            refunds, _ = self._stale_grants(drain=True)
        if timer is not None:
            timer[1].set()
            if timer[0] is not threading.current_thread():
                timer[0].join(10)
        self._send_refunds(refunds)

    def __enter__(self) -> Limiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _decide(self, identity: str, request: Request | None) -> Admission:
        """The rules but the grant rules: the deny cache, the local level,
        one call, the fallback."""
        with self._lock:
            plan = self._begin(identity, request)
        if isinstance(plan, Admission):
            return plan
        outcome: tuple[Decision, int] | BaseException | None
        try:
            outcome = self._drive(plan)
        except RedisTimeoutError:
            outcome = None
        except REDIS_FAILURES as e:
            outcome = e
        except BaseException:
            with self._lock:
                back = self._abandoned(plan)
            self.release(back)
            raise
        with self._lock:
            admission, back = self._outcome(plan, outcome)
        self.release(back)
        return admission

    def _drive(self, plan: _Plan) -> tuple[Decision, int]:
        """The calls, sent without the lock; each step between them under it."""
        calls = self._calls(plan)
        try:
            with self._lock:
                call = next(calls)
            while True:
                answer = self._send(call)
                with self._lock:
                    call = calls.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _send(self, call: Call) -> Decision:
        key, spec, req = call
        if self.metrics is None:
            if key is None:
                return self.client.all(spec, req)
            return self.client.limit(key, spec, req)
        t = time.perf_counter()
        try:
            if key is None:
                return self.client.all(spec, req)
            return self.client.limit(key, spec, req)
        finally:
            self.metrics.redis_seconds(time.perf_counter() - t)

    def _due_probe(self) -> bool:
        """After `breaker_open_for`, this decision probes with one PING;
        its answer closes the breaker and lets it call."""
        self.stats.probes += 1
        try:
            self._ping()
        except Exception:
            self._probed(False)
            return False
        self._probed(True)
        return True

    def release(self, held: list[Held]) -> None:
        """As `AsyncLimiter.release`."""
        with self._lock:
            leases = self._leases(held)
        for key, lease in leases:
            error: BaseException | None = None
            try:
                self.client.release(key, lease)
            except (RedisError, OSError) as e:
                error = e
            with self._lock:
                self._released(key, lease, error)


def _breaker_open(limiter: _Limiting) -> bool:
    return limiter.breaker_open


def _retrieved(task: asyncio.Future[None]) -> None:
    """A start-up nobody awaits any more: its error is logged by `check`."""
    if not task.cancelled():
        task.exception()


def _connecting_once(client: redis.Redis) -> redis.Redis:
    """`client`, or when its pool connects under a `retry` that tries again
    (redis-py 6 and later: 10 more attempts with backoff by default) the
    same server on a pool of the limiter's own that connects once: a call
    that had to reconnect to a stopped server took some 11 socket timeouts
    and seconds of backoff, not the one timeout that is the deadline."""
    pool = client.connection_pool
    retry = pool.connection_kwargs.get("retry")
    retries = getattr(retry, "get_retries", lambda: getattr(retry, "_retries", 0))()
    if type(pool) is not redis.ConnectionPool or not retries:
        return client
    kwargs = {**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0)}
    own = redis.ConnectionPool(
        connection_class=pool.connection_class, max_connections=pool.max_connections, **kwargs
    )
    return redis.Redis(connection_pool=own)


__all__ = [
    "Admission",
    "AsyncLimiter",
    "FallbackMode",
    "Held",
    "Limiter",
    "Spec",
    "Stats",
    "check_zones",
]
