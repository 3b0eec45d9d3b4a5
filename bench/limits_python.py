#!/usr/bin/env python3
"""`limits`' moving window on redis:// (its Lua over a list) and on redis+rl://
(RL.SLIDING), side by side in one run against one redis-server with the module.

Prints hits per second through `limits`' own MovingWindowRateLimiter (one
Python process, one connection: what an app's request sees, client included),
interleaved in rounds so that a noisy machine cancels out, and the bytes per
key held (`MEMORY USAGE`) with the window full, its hits at least 2 ms apart.

    RL_MODULE=/abs/libredis_ratelimit.so python3 bench/limits_python.py

Knobs: BENCH_PY_ROUNDS (3), BENCH_PY_HITS (hits per round and storage, 10000),
BENCH_PY_KEYS (keys for memory, 500). A benchmark reports; it exits 0.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "clients/python/src"))

import redis  # noqa: E402
from limits import parse, strategies  # noqa: E402
from limits.storage import storage_from_string  # noqa: E402

import redis_ratelimit_client  # noqa: E402,F401

MODULE = os.environ.get("RL_MODULE", str(ROOT / "target/release/libredis_ratelimit.so"))
ROUNDS = int(os.environ.get("BENCH_PY_ROUNDS", "3"))
HITS = int(os.environ.get("BENCH_PY_HITS", "10000"))
KEYS = int(os.environ.get("BENCH_PY_KEYS", "500"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    port = free_port()
    work = tempfile.mkdtemp(prefix="rl-bench-py-")
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", work,
         "--save", "", "--appendonly", "no", "--loadmodule", MODULE],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port)
        for _ in range(200):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        run(r, port)
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def run(r: redis.Redis, port: int) -> None:
    storages = {
        "redis:// (limits' Lua, list)": storage_from_string(f"redis://127.0.0.1:{port}"),
        "redis+rl:// (RL.SLIDING)": storage_from_string(f"redis+rl://127.0.0.1:{port}"),
    }
    item = parse("100/minute")
    rates: dict[str, list[float]] = {name: [] for name in storages}
    server_us: dict[str, list[float]] = {name: [] for name in storages}
    for rnd in range(ROUNDS):
        for name, storage in storages.items():
            limiter = strategies.MovingWindowRateLimiter(storage)
            keys = [f"k{rnd}:{i}" for i in range(1000)]
            rng = random.Random(rnd)
            r.config_resetstat()
            start = time.perf_counter()
            for _ in range(HITS):
                limiter.hit(item, rng.choice(keys))
            rates[name].append(HITS / (time.perf_counter() - start))
            # The server's own time per hit: the top-level commands the hits
            # sent (a script's inner calls are inside its own usec).
            stats = r.info("commandstats")
            usec = sum(v["usec"] for k, v in stats.items()
                       if k.lower() in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_rl.sliding"))
            server_us[name].append(usec / HITS)
            r.flushall()

    # Memory: every key's window full (100 hits of 100/minute), paced: the
    # keys take turns, and a turn lasts at least 2 ms, so a key's hits are at
    # least 2 ms apart and none shares a millisecond (the native log
    # coalesces the hits of one millisecond into one entry, which real
    # traffic spread over a minute seldom does).
    memory: dict[str, float] = {}
    for name, storage in storages.items():
        limiter = strategies.MovingWindowRateLimiter(storage)
        for _ in range(item.amount):
            turn = time.monotonic()
            for i in range(KEYS):
                limiter.hit(item, f"m:{i}")
            while time.monotonic() < turn + 0.002:
                pass
        keys = list(r.scan_iter(match="LIMITS*", count=1000))
        sample = keys[:: max(1, len(keys) // 500)]
        memory[name] = statistics.mean(int(r.memory_usage(k, samples=0)) for k in sample)
        r.flushall()

    base = statistics.median(rates[next(iter(storages))])
    print(f"limits moving window, 100/minute over 1,000 keys, {HITS} hits x {ROUNDS} rounds,"
          " one Python process:")
    print("| storage | hits/s (median) | ratio | server us per hit | bytes per full key"
          " (100 entries, 2 ms apart or more) |")
    print("|---|---:|---:|---:|---:|")
    for name in storages:
        med = statistics.median(rates[name])
        us = statistics.median(server_us[name])
        print(f"| {name} | {med:,.0f} | {med / base:.2f}x | {us:.2f} | {memory[name]:,.0f} |")


if __name__ == "__main__":
    main()
