#!/usr/bin/env python3
"""One global limit on a 3-master cluster, offered twice the limit: what
batched and striped rules admit per second, and what they cost in Redis
calls (issue 27).

    RL_MODULE=/abs/libredis_ratelimit.so python3 clients/python/bench/grants.py
    LIMIT=2000 INSTANCES=4 SECONDS=5 HOLD_MS=50 ...

INSTANCES `AsyncLimiter`s (one process, one event loop: each its own
connections and grants, as separate instances would be) share one token
bucket of LIMIT per second (capacity LIMIT) and offer 2 x LIMIT per second
in ticks of 10 ms, for SECONDS seconds, in three modes: a plain global rule
(one call per decision), `batched=True`, and `batched=True, striped=3`.
For each: admitted per second (each whole second of the run, against the
bound `capacity + refill x elapsed` read from the server clock), the
share of the limit admitted, Redis calls per 1,000 decisions (INFO
commandstats on every master) and each master's share of the calls.

A benchmark reports; it exits 0.
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

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "clients/python/src"))

import redis  # noqa: E402
from redis.asyncio.cluster import RedisCluster  # noqa: E402

from redis_ratelimit_client import Rule, TokenBucket  # noqa: E402
from redis_ratelimit_client.limiter import AsyncLimiter  # noqa: E402

MODULE = os.environ.get("RL_MODULE", str(ROOT / "target/release/libredis_ratelimit.so"))
REDIS_SERVER = os.environ.get("REDIS_SERVER", shutil.which("redis-server") or "redis-server")
LIMIT = int(os.environ.get("LIMIT", "2000"))
INSTANCES = int(os.environ.get("INSTANCES", "4"))
SECONDS = int(os.environ.get("SECONDS", "5"))
HOLD_MS = int(os.environ.get("HOLD_MS", "50"))
TICK_S = 0.01


def free_port() -> int:
    while True:
        with socket.socket() as s, socket.socket() as bus:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            if port >= 55536:
                continue
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port


def start_cluster() -> tuple[list[subprocess.Popen[bytes]], list[int], str]:
    d = tempfile.mkdtemp(prefix="rl-bench-")
    ports = [free_port() for _ in range(3)]
    procs = []
    for p in ports:
        wd = os.path.join(d, str(p))
        os.makedirs(wd)
        procs.append(
            subprocess.Popen(
                [
                    REDIS_SERVER,
                    "--port",
                    str(p),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    wd,
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--cluster-enabled",
                    "yes",
                    "--loadmodule",
                    MODULE,
                ],  # fmt: skip
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    for p in ports:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=p).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    subprocess.run(
        ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports], "--cluster-yes"],
        check=True,
        capture_output=True,
    )
    deadline = time.monotonic() + 30
    while not all(redis.Redis(port=p).cluster("info")["cluster_state"] == "ok" for p in ports):
        if time.monotonic() > deadline:
            raise TimeoutError("cluster_state:ok")
        time.sleep(0.05)
    return procs, ports, d


def calls_of(ports: list[int]) -> list[int]:
    out = []
    for p in ports:
        stats = redis.Redis(port=p).info("commandstats")
        out.append(int(stats.get("cmdstat_RL.TOKENBUCKET", {}).get("calls", 0)))
    return out


def server_ms(port: int) -> int:
    s, us = redis.Redis(port=port).time()
    return int(s) * 1000 + int(us) // 1000


async def run_mode(ports: list[int], name: str, rule: Rule) -> dict[str, object]:
    for p in ports:
        redis.Redis(port=p).config_resetstat()
    clients = [RedisCluster(host="127.0.0.1", port=ports[0]) for _ in range(INSTANCES)]
    lims = [AsyncLimiter(c, [rule], deadline=0.5) for c in clients]
    for lim in lims:
        await lim.startup()
    per_tick = max(1, round(2 * LIMIT * TICK_S / INSTANCES))
    admitted_at: list[float] = []
    decided = 0
    start_ms = server_ms(ports[0])
    t0 = time.monotonic()

    async def instance(lim: AsyncLimiter) -> None:
        nonlocal decided
        tick = 0
        while time.monotonic() - t0 < SECONDS:
            out = await asyncio.gather(*(lim.check("any") for _ in range(per_tick)))
            now = time.monotonic() - t0
            decided += len(out)
            admitted_at.extend(now for a in out if a.allowed)
            tick += 1
            await asyncio.sleep(max(0.0, t0 + tick * TICK_S - time.monotonic()))

    await asyncio.gather(*(instance(lim) for lim in lims))
    elapsed_ms = server_ms(ports[0]) - start_ms
    for lim in lims:
        await lim.aclose()
    for c in clients:
        await c.aclose()
    per_master = calls_of(ports)
    total_calls = sum(per_master)
    per_second = [sum(1 for t in admitted_at if s <= t < s + 1) for s in range(SECONDS)]
    bound = LIMIT + LIMIT * elapsed_ms // 1000
    steady = per_second[1:] or per_second
    return {
        "mode": name,
        "decisions": decided,
        "admitted": len(admitted_at),
        "bound": bound,
        "admitted_per_s": per_second,
        "min_share_of_limit_pct": round(100 * min(steady) / LIMIT, 1),
        "calls_per_1000": round(1000 * total_calls / max(decided, 1), 1),
        "master_share_pct": [round(100 * c / max(total_calls, 1), 1) for c in per_master],
    }


async def main() -> None:
    procs, ports, d = start_cluster()
    try:
        spec = TokenBucket(LIMIT, LIMIT, 1000)
        modes = [
            ("plain global", Rule(spec, "plain", fixed_key="b:plain", global_=True)),
            (
                "batched",
                Rule(spec, "b", fixed_key="b:b", global_=True, batched=True, hold_ms=HOLD_MS),
            ),
            (
                "batched+striped 3",
                Rule(
                    spec,
                    "bs",
                    fixed_key="b:bs",
                    global_=True,
                    batched=True,
                    hold_ms=HOLD_MS,
                    striped=3,
                ),
            ),
        ]
        print(
            f"limit {LIMIT}/s, {INSTANCES} instances offering {2 * LIMIT}/s for {SECONDS} s, "
            f"hold_ms {HOLD_MS}"
        )
        for name, rule in modes:
            r = await run_mode(ports, name, rule)
            print(r)
            assert int(r["admitted"]) <= int(r["bound"]), "over the limit"  # type: ignore[call-overload]
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
