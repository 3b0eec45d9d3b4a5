"""Synthetic series of a roll-out, as the kits and the exporter would serve
them, written as OpenMetrics for `promtool tsdb create-blocks-from`.

Three hours of one application (job "api", two instances) using three
policies on two Redis nodes (job "redis", one exporter), scraped every
15 seconds:

- checkout runs in SHADOW and would deny 2.2% of its calls (the misfire
  alert); at 0:40 its limit is raised (0.3%), and from 1:00 it is enforced
  in gray stages (ROLLOUT 10, 30, 50, then 100 at 2:05);
- orders has ADAPT and STAGES: errors from 1:40 lower its scale to 80 and its
  denials put it at stage 1 until 1:52; meanwhile Redis slows down (the
  limiter's p99 passes 10 ms from 1:35 to 1:45) and instance api-2 opens its
  breaker and uses its fallback for three minutes;
- search gets a stricter limit at 2:20 that denies 82% of its calls (P0);
  the kill switch (MODE OFF) at 2:30 ends it;
- node 10.0.0.2 misses a scrape window at 2:00, and the deny-event sink is
  down from 2:23 to 2:27 (events dropped, flushes failed).

Deterministic: the same start time gives the same file.
"""

import math
import random

STEP_S = 15
# What an operator did, (minute, note): the dashboard's annotations.
EVENTS = [
    (0, "checkout: SHADOW"),
    (40, "limit raised"),
    (60, "ROLLOUT 10"),
    (85, "30"),
    (105, "50"),
    (125, "100"),
    (140, "search: stricter limit"),
    (150, "search: MODE OFF"),
]
MINUTES = 180
INSTANCES = ["api-1:8080", "api-2:8080"]
NODES = ["10.0.0.1:6379", "10.0.0.2:6379"]
BUCKETS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0]


def _between(t, a, b):
    return a <= t < b


def rollout(t):
    """checkout's enforced share (0 while in SHADOW)."""
    for start, p in ((125, 1.0), (105, 0.5), (85, 0.3), (60, 0.1)):
        if t >= start:
            return p
    return 0.0


def plan(t):
    """Per rule at minute t: (requests per second, would-deny ratio, enforced
    share, level split of admitted decisions)."""
    wave = 1 + 0.25 * math.sin(2 * math.pi * t / 90)
    checkout_deny = 0.022 if t < 40 else 0.003
    # MODE OFF from 2:30: nothing is evaluated, nothing denied or shadow-denied.
    search_deny = 0.82 if _between(t, 140, 150) else (0.0 if t >= 150 else 0.01)
    orders_deny = 0.36 if _between(t, 100, 112) else (0.12 if _between(t, 112, 120) else 0.02)
    return {
        "checkout": (200 * wave, checkout_deny, rollout(t)),
        "search": (400 * wave, search_deny, 1.0),
        "orders": (100 * wave, orders_deny, 1.0),
    }


def scale_of_orders(t):
    if _between(t, 104, 118):
        return 80
    if _between(t, 118, 128):
        return 80 + 5 * int((t - 118) / 2.5 + 1)
    return 100


def stage_of_orders(t):
    return 1 if _between(t, 102, 112) else 0


def latency(t):
    """(median, sigma) of the round trips' log-normal distribution."""
    if _between(t, 95, 105):
        return 0.004, 0.57
    return 0.0008, 0.57


def _cdf(x, median, sigma):
    return 0.5 * (1 + math.erf(math.log(x / median) / (sigma * math.sqrt(2))))


class Series:
    def __init__(self):
        self.families = {}  # family name -> {labels tuple: [(ts, value)]}
        self.counters = {}

    def gauge(self, name, labels, ts, value):
        key = tuple(sorted(labels.items()))
        self.families.setdefault(name, {}).setdefault(key, []).append((ts, value))

    def add(self, name, labels, ts, increment):
        key = (name, tuple(sorted(labels.items())))
        self.counters[key] = self.counters.get(key, 0.0) + increment
        self.gauge(name, labels, ts, self.counters[key])

    def openmetrics(self):
        out = []
        for name, series in self.families.items():
            for key, samples in series.items():
                labels = ",".join(f'{k}="{v}"' for k, v in key)
                for ts, value in samples:
                    out.append(f"{name}{{{labels}}} {value:.3f} {ts:.3f}\n")
        out.append("# EOF\n")
        return "".join(out)


def generate(start_s):
    rng = random.Random(26)
    s = Series()
    fingerprints = {"checkout": "c0a1", "search": "5e01", "orders": "0d01"}
    log_length = {n: 40 for n in NODES}
    steps = MINUTES * 60 // STEP_S
    for i in range(steps + 1):
        ts = start_s + i * STEP_S
        t = i * STEP_S / 60
        server = {}  # policy -> [calls, admitted, denied, shadow_denied]
        events = {}  # instance -> enforced denials in this step
        for rule, (rps, deny, enforced) in plan(t).items():
            for inst in INSTANCES:
                job = {"job": "api", "instance": inst}
                n = rps / 2 * STEP_S * (1 + rng.uniform(-0.05, 0.05))
                fallback = inst == "api-2:8080" and _between(t, 100, 103)
                would = n * deny
                enforced_denials = would * enforced
                shadow = would - enforced_denials
                admitted = n - enforced_denials
                if fallback:
                    s.add(
                        "ratelimit_decisions_total",
                        {**job, "rule": rule, "level": "fallback", "outcome": "admitted"},
                        ts,
                        n,
                    )
                    for lvl, out in (
                        ("redis", "admitted"),
                        ("redis", "denied"),
                        ("deny_cache", "denied"),
                        ("redis", "shadow_denied"),
                    ):
                        s.add("ratelimit_decisions_total", {**job, "rule": rule, "level": lvl, "outcome": out}, ts, 0)
                    continue
                s.add(
                    "ratelimit_decisions_total",
                    {**job, "rule": rule, "level": "fallback", "outcome": "admitted"},
                    ts,
                    0,
                )
                local = 0.3 if rule == "search" else 0.0
                s.add(
                    "ratelimit_decisions_total",
                    {**job, "rule": rule, "level": "redis", "outcome": "admitted"},
                    ts,
                    admitted * (1 - local),
                )
                if local:
                    s.add(
                        "ratelimit_decisions_total",
                        {**job, "rule": rule, "level": "local", "outcome": "admitted"},
                        ts,
                        admitted * local,
                    )
                s.add(
                    "ratelimit_decisions_total",
                    {**job, "rule": rule, "level": "redis", "outcome": "denied"},
                    ts,
                    enforced_denials * 0.6,
                )
                s.add(
                    "ratelimit_decisions_total",
                    {**job, "rule": rule, "level": "deny_cache", "outcome": "denied"},
                    ts,
                    enforced_denials * 0.4,
                )
                s.add(
                    "ratelimit_decisions_total",
                    {**job, "rule": rule, "level": "redis", "outcome": "shadow_denied"},
                    ts,
                    shadow,
                )
                calls = admitted * (1 - local) + enforced_denials * 0.6 + shadow
                agg = server.setdefault(rule, [0.0, 0.0, 0.0, 0.0])
                agg[0] += calls
                agg[1] += admitted * (1 - local)
                agg[2] += enforced_denials * 0.6 + shadow
                agg[3] += shadow
                remaining = 0.02 if deny > 0.5 else max(0.0, 0.55 + 0.3 * math.sin(t / 7 + len(rule)) - deny)
                s.gauge("ratelimit_remaining_ratio", {**job, "rule": rule}, ts, round(remaining, 3))
                events[inst] = events.get(inst, 0.0) + enforced_denials
        # Deny events: the enforced denials, shipped unless the sink is down.
        sink_down = _between(t, 143, 147)
        for inst in INSTANCES:
            job = {"job": "api", "instance": inst}
            n = events.get(inst, 0.0)
            s.add("ratelimit_deny_events_shipped_total", job, ts, 0 if sink_down else n)
            s.add("ratelimit_deny_events_dropped_total", job, ts, n if sink_down else 0)
            s.add("ratelimit_deny_events_sink_errors_total", job, ts, STEP_S / 5 if sink_down else 0)
        for inst in INSTANCES:
            job = {"job": "api", "instance": inst}
            s.gauge("ratelimit_scale", {**job, "rule": "orders"}, ts, scale_of_orders(t))
            s.gauge("ratelimit_stage", {**job, "rule": "orders"}, ts, stage_of_orders(t))
            s.gauge(
                "ratelimit_breaker_open",
                {**job, "breaker": "redis"},
                ts,
                1 if inst == "api-2:8080" and _between(t, 100, 103) else 0,
            )
            # Round trips: every redis-level decision of the instance.
            trips = sum(rps / 2 * STEP_S for rps, _, _ in plan(t).values()) * 0.8
            if inst == "api-2:8080" and _between(t, 100, 103):
                trips = 0
            median, sigma = latency(t)
            for le in BUCKETS:
                s.add("ratelimit_redis_seconds_bucket", {**job, "le": str(le)}, ts, trips * _cdf(le, median, sigma))
            s.add("ratelimit_redis_seconds_bucket", {**job, "le": "+Inf"}, ts, trips)
            s.add("ratelimit_redis_seconds_count", job, ts, trips)
            s.add("ratelimit_redis_seconds_sum", job, ts, trips * median * math.exp(sigma * sigma / 2))
        # The exporter: the server's counters, half on each node.
        if t >= 40:
            fingerprints["checkout"] = "c0a2"
        for start, fp in ((60, "c0b1"), (85, "c0b3"), (105, "c0b5"), (125, "c0c0")):
            if t >= start:
                fingerprints["checkout"] = fp
        fingerprints["search"] = "5e03" if t >= 150 else ("5e02" if t >= 140 else "5e01")
        for k, node in enumerate(NODES):
            ex = {"job": "redis", "instance": "exporter:9122", "node": node}
            down = node == NODES[1] and _between(t, 120, 122)
            s.gauge("redis_ratelimit_up", ex, ts, 0 if down else 1)
            if down:
                continue
            s.gauge("redis_ratelimit_policies", ex, ts, 3)
            for policy, (calls, admitted, denied, shadow) in server.items():
                pl = {**ex, "policy": policy}
                s.add("redis_ratelimit_policy_calls_total", pl, ts, calls / 2)
                s.add("redis_ratelimit_policy_admitted_total", pl, ts, admitted / 2)
                s.add("redis_ratelimit_policy_denied_total", pl, ts, denied / 2)
                s.add("redis_ratelimit_policy_shadow_denied_total", pl, ts, shadow / 2)
                s.gauge("redis_ratelimit_policy_scale", pl, ts, scale_of_orders(t) if policy == "orders" else 100)
                s.gauge("redis_ratelimit_policy_stage", pl, ts, stage_of_orders(t) if policy == "orders" else 0)
                fp = fingerprints[policy]
                # The second node gets each SET a minute later.
                if k == 1 and policy == "checkout" and any(_between(t, a, a + 1) for a in (40, 60, 85, 105, 125)):
                    fp = "old"
                s.gauge("redis_ratelimit_policy_info", {**pl, "fingerprint": fp}, ts, 1)
            for alg, policies in (("tokenbucket", ("checkout", "orders")), ("sliding", ("search",))):
                calls = sum(server[p][0] for p in policies) / 2
                denied = sum(server[p][2] - server[p][3] for p in policies) / 2
                s.add("redis_ratelimit_algorithm_calls_total", {**ex, "algorithm": alg}, ts, calls)
                s.add("redis_ratelimit_algorithm_denied_total", {**ex, "algorithm": alg}, ts, denied)
            s.gauge(
                "redis_ratelimit_blocked", ex, ts, round(1 + math.sin(t / 5 + k)) + (6 if _between(t, 95, 105) else 0)
            )
            log_length[node] = min(128, log_length[node] + rng.choice([0, 1]))
            s.gauge("redis_ratelimit_deny_log_length", ex, ts, log_length[node])
            s.gauge("redis_ratelimit_deny_log_max_length", ex, ts, 128)
    return s.openmetrics()
