#!/usr/bin/env python3
"""What metrics and deny events cost a decision: the Python kit's `Limiter`
(sync) and `AsyncLimiter`, decisions per second with both off, and with
both on (a `CollectorRegistry`, and a `DenyEvents` shipping every denial to
a callback, as the flusher does in production), side by side in one run
against one redis-server with the module. Both limiters live side by side
and take turns, block by block (the order swapped each time), so a burst of
load elsewhere on the host weighs on both: printed, each configuration's
decisions per second over all its blocks, their ratio, and the median of
the blocks' ratios.

Two workloads per limiter:
- `admitted`: every decision a round trip to Redis (a limit no one reaches):
  what the histogram of round trips and the counters add to one;
- `denied`: every decision answered by the deny cache (no round trip, the
  kit's cheapest path), each a deny event: the worst case for the ratio.

    RL_MODULE=/abs/libredis_ratelimit.so python3 clients/python/bench/metrics.py

Knobs: BENCH_METRICS_DECISIONS (per round of `admitted`, 3000; `denied`
runs ten times as many), BENCH_METRICS_ROUNDS (5); a round is 10 blocks of
each configuration. About half a minute.
A benchmark reports; it exits 0 (non-zero only when it cannot run).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "clients/python/src"))

import redis  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from redis_ratelimit_client import (  # noqa: E402
    AsyncLimiter,
    DenyEvent,
    DenyEvents,
    FixedWindow,
    Limiter,
    Rule,
)

MODULE = os.environ.get("RL_MODULE", str(ROOT / "target/release/libredis_ratelimit.so"))
DECISIONS = int(os.environ.get("BENCH_METRICS_DECISIONS", "3000"))
ROUNDS = int(os.environ.get("BENCH_METRICS_ROUNDS", "5"))
BLOCKS = 10
#: Admitted: a limit no round reaches; denied: 1, then the deny cache.
BIG, WINDOW_MS = 1 << 40, 3_600_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int) -> None:
    for _ in range(500):
        try:
            with socket.create_connection(("127.0.0.1", port), 0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"nothing listens on {port}")


def observed(on: bool) -> tuple[dict[str, Any], DenyEvents | None]:
    """The limiter's keywords with metrics and deny events on, or none."""
    if not on:
        return {}, None
    shipped: list[int] = []

    def sink(batch: list[DenyEvent]) -> None:
        shipped.append(len(batch))

    events = DenyEvents(sink)
    return {"metrics": CollectorRegistry(), "deny_events": events}, events


def rules(workload: str, tag: str) -> list[Rule]:
    limit = BIG if workload == "admitted" else 1
    return [Rule(FixedWindow(limit, WINDOW_MS), "bench", key_prefix=f"bench:{tag}:")]


def block(workload: str) -> int:
    """Decisions per block: a block of each configuration in turn."""
    return max(1, (DECISIONS if workload == "admitted" else DECISIONS * 10) // BLOCKS)


def report(name: str, workload: str, took: dict[bool, list[float]], n: int) -> None:
    """Decisions per second of all blocks, and the median of the blocks'
    ratios (the one robust to a burst of load elsewhere)."""
    rate = {on: n * len(t) / sum(t) for on, t in took.items()}
    ratios = sorted(off / on for off, on in zip(took[False], took[True]))
    median = ratios[len(ratios) // 2]
    print(
        f"| {name} | {workload} | {rate[False]:,.0f} | {rate[True]:,.0f} "
        f"| {rate[True] / rate[False]:.2f}x | {median:.2f}x |"
    )


def sync_compare(port: int, workload: str) -> None:
    n = block(workload)
    lims, shippers = {}, []
    for on in (False, True):
        kw, events = observed(on)
        lims[on] = Limiter(
            redis.Redis(port=port, socket_timeout=1), rules(workload, f"s{int(on)}"), **kw
        )
        lims[on].check("u")  # start-up, and for `denied` the one admission
        lims[on].check("u")
        if events is not None:
            shippers.append(events)
    took: dict[bool, list[float]] = {False: [], True: []}
    for i in range(ROUNDS * BLOCKS):
        for on in (False, True) if i % 2 == 0 else (True, False):
            lim = lims[on]
            t = time.perf_counter()
            for _ in range(n):
                lim.check("u")
            took[on].append(time.perf_counter() - t)
    for events in shippers:
        events.close()
    report("Limiter", workload, took, n)


def async_compare(port: int, workload: str) -> None:
    n = block(workload)

    async def run() -> dict[bool, list[float]]:
        lims, shippers, clients = {}, [], []
        for on in (False, True):
            kw, events = observed(on)
            client = aioredis.Redis(port=port)
            clients.append(client)
            lims[on] = AsyncLimiter(client, rules(workload, f"a{int(on)}"), connections=1, **kw)
            await lims[on].check("u")
            await lims[on].check("u")
            if events is not None:
                shippers.append(events)
        took: dict[bool, list[float]] = {False: [], True: []}
        for i in range(ROUNDS * BLOCKS):
            for on in (False, True) if i % 2 == 0 else (True, False):
                lim = lims[on]
                t = time.perf_counter()
                for _ in range(n):
                    await lim.check("u")
                took[on].append(time.perf_counter() - t)
        for c in clients:
            await c.aclose()
        for events in shippers:
            events.close()
        return took

    report("AsyncLimiter", workload, asyncio.run(run()), n)


def main() -> None:
    if not os.path.exists(MODULE):
        raise SystemExit(f"RL_MODULE {MODULE} does not exist: build the module first")
    port = free_port()
    work = tempfile.mkdtemp(prefix="rl-bench-metrics-")
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", work,
         "--save", "", "--appendonly", "no", "--loadmodule", MODULE],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_port(port)
        print(
            f"Python kit: metrics + deny events, on vs off: {ROUNDS} rounds of {BLOCKS} blocks "
            f"of {block('admitted')} admitted or {block('denied')} denied decisions, off and on "
            f"in turn (one key each; cores: {os.cpu_count()})"
        )
        print(
            "| limiter | decisions | off (decisions/s) | on (decisions/s) | on / off "
            "| median of the blocks' on / off |"
        )
        print("|---|---|---|---|---|---|")
        for wl in ("admitted", "denied"):
            sync_compare(port, wl)
            async_compare(port, wl)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
