#!/usr/bin/env python3
"""What metrics and deny events cost a decision: the Python kit's `Limiter`
(sync) and `AsyncLimiter`, decisions per second with both off, and with
both on (a `CollectorRegistry`, and a `DenyEvents` shipping every denial to
a callback, as the flusher does in production), side by side in one run
against one redis-server with the module: rounds alternate off and on, so
a noisy host weighs on both; each configuration's best round is printed,
and on / off as a ratio.

Two workloads per limiter:
- `admitted`: every decision a round trip to Redis (a limit no one reaches):
  what the histogram of round trips and the counters add to one;
- `denied`: every decision answered by the deny cache (no round trip, the
  kit's cheapest path), each a deny event: the worst case for the ratio.

    RL_MODULE=/abs/libredis_ratelimit.so python3 clients/python/bench/metrics.py

Knobs: BENCH_METRICS_DECISIONS (per round of `admitted`, 3000; `denied`
runs ten times as many), BENCH_METRICS_ROUNDS (5). About half a minute.
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
from typing import Any, Callable

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


def decisions(workload: str) -> int:
    return DECISIONS if workload == "admitted" else DECISIONS * 10


def sync_round(port: int, workload: str, on: bool, tag: str) -> float:
    n = decisions(workload)
    kw, events = observed(on)
    lim = Limiter(redis.Redis(port=port, socket_timeout=1), rules(workload, tag), **kw)
    lim.check("u")  # start-up, and for `denied` the one admission
    lim.check("u")
    t = time.perf_counter()
    for _ in range(n):
        lim.check("u")
    took = time.perf_counter() - t
    if events is not None:
        events.close()
    return n / took


def async_round(port: int, workload: str, on: bool, tag: str) -> float:
    n = decisions(workload)

    async def run() -> float:
        kw, events = observed(on)
        client = aioredis.Redis(port=port)
        lim = AsyncLimiter(client, rules(workload, tag), connections=1, **kw)
        await lim.check("u")
        await lim.check("u")
        t = time.perf_counter()
        for _ in range(n):
            await lim.check("u")
        took = time.perf_counter() - t
        await client.aclose()
        if events is not None:
            events.close()
        return n / took

    return asyncio.run(run())


def compare(name: str, one: Callable[[int, str, bool, str], float], port: int, wl: str) -> None:
    best = {False: 0.0, True: 0.0}
    for i in range(ROUNDS):
        for on in (False, True) if i % 2 == 0 else (True, False):
            tag = f"{name}-{wl}-{i}-{int(on)}"
            best[on] = max(best[on], one(port, wl, on, tag))
    print(
        f"| {name} | {wl} | {best[False]:,.0f} | {best[True]:,.0f} "
        f"| {best[True] / best[False]:.2f}x |"
    )


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
            f"Python kit: metrics + deny events, on vs off ({DECISIONS} admitted or "
            f"{decisions('denied')} denied decisions per round, best of {ROUNDS} rounds each, "
            f"one key; cores: {os.cpu_count()})"
        )
        print("| limiter | decisions | off (decisions/s) | on (decisions/s) | on / off |")
        print("|---|---|---|---|---|")
        for wl in ("admitted", "denied"):
            compare("Limiter", sync_round, port, wl)
            compare("AsyncLimiter", async_round, port, wl)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
