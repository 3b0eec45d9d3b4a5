#!/usr/bin/env python3
"""The protection loop's costs, measured with the Python kit's `Protection`
against a real redis-server with the module on a free loopback port.

1. What the loop costs the server, whatever the request rate. Two
   instances (two `Protection`s, each with its own connection, at the
   contract's defaults: a report and a stage poll every second) watch one
   adaptive policy. Each records outcomes at BENCH_LOOP_LOW requests a
   second, then at BENCH_LOOP_HIGH, for BENCH_LOOP_SECONDS each. The server's
   `INFO commandstats` counts the `RL.OUTCOME` and `RL.POLICY STATS` calls:
   printed as server calls per second per instance at each rate (the loop's
   promise: about 2 per policy per master, at any rate), with what
   `record()` costs the request's thread (ns per call, in process).
2. How long every instance takes to see a new scale. The policy has
   `ADAPT ERRORS 5 WINDOW BENCH_LOOP_WINDOW_MS MINCALLS 50`; both instances
   send 10% errors from a window's start. The window's end is when the
   server can decide; the scale changes at the first report after it, and
   each instance sees it at its next poll. Printed per instance and round:
   the time from the window's end until the instance reads scale 80, in
   windows and in ms (the bound: one report interval plus one poll
   interval).

    RL_MODULE=/abs/libredis_ratelimit.so python3 bench/protection.py

Knobs: BENCH_LOOP_LOW (100), BENCH_LOOP_HIGH (20000), BENCH_LOOP_SECONDS
(4), BENCH_LOOP_WINDOW_MS (2000), BENCH_LOOP_ROUNDS (3). About a minute. A
benchmark reports; it exits 0 (non-zero only when it cannot run).
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "clients/python/src"))

from redis_ratelimit_client import Protection  # noqa: E402

MODULE = os.environ.get("RL_MODULE", str(ROOT / "target/release/libredis_ratelimit.so"))
LOW = int(os.environ.get("BENCH_LOOP_LOW", "100"))
HIGH = int(os.environ.get("BENCH_LOOP_HIGH", "20000"))
SECONDS = float(os.environ.get("BENCH_LOOP_SECONDS", "4"))
WINDOW_MS = int(os.environ.get("BENCH_LOOP_WINDOW_MS", "2000"))
ROUNDS = int(os.environ.get("BENCH_LOOP_ROUNDS", "3"))
POLICY = "bench-loop"


def log(msg: str) -> None:
    print(f"protection: {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(work: str) -> tuple[subprocess.Popen[bytes], int]:
    for _attempt in range(5):
        port = free_port()
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", work, "--loadmodule", MODULE],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        r = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                r.ping()
                return proc, port
            except redis.ConnectionError:
                time.sleep(0.05)
        proc.kill()
        proc.wait()
    raise SystemExit("protection: redis-server did not start")


def loop_calls(r: redis.Redis) -> int:
    """RL.OUTCOME and RL.POLICY STATS calls the server has taken."""
    stats = r.info("commandstats")
    total = 0
    for name, fields in stats.items():
        if name.lower() in ("cmdstat_rl.outcome", "cmdstat_rl.policy|stats"):
            total += int(fields["calls"])
    return total


def drive(instances: list[Protection], rate: int, seconds: float, every: int) -> float:
    """Each instance records `rate` outcomes a second for `seconds` (one in
    `every` an error; 0: none), from a thread of its own; returns the mean
    ns a record() took."""
    spent: list[float] = []

    def run(p: Protection) -> None:
        n = 0
        cost = 0.0
        start = time.monotonic()
        while True:
            now = time.monotonic()
            if now - start >= seconds:
                break
            due = int((now - start) * rate)
            while n < due:
                n += 1
                t = time.perf_counter_ns()
                p.record(POLICY, every > 0 and n % every == 0)
                cost += time.perf_counter_ns() - t
            time.sleep(0.001)
        spent.append(cost / max(n, 1))

    threads = [threading.Thread(target=run, args=(p,)) for p in instances]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statistics.mean(spent)


def main() -> int:
    if not Path(MODULE).is_file():
        raise SystemExit(f"protection: no module at {MODULE}")
    work = tempfile.mkdtemp(prefix="rl-bench-loop-")
    proc, port = start_server(work)
    admin = redis.Redis(port=port)
    try:
        print("\n== the protection loop (bench/protection.py) ==")
        print(f"redis-server {admin.info('server')['redis_version']}, two instances (Python kit Protection, defaults: report 1 s, poll 1 s)")
        admin.execute_command(
            "RL.POLICY", "SET", POLICY, "TOKENBUCKET", "100000", "100000", "1000",
            "ADAPT", "ERRORS", "5", "WINDOW", str(WINDOW_MS), "MINCALLS", "50", "STAGES", "30", "50",
        )

        # 1. server calls per second per instance, at two rates.
        print(f"\n{'requests/s per instance':>24} {'server calls/s per instance':>28}")
        for rate in (LOW, HIGH):
            instances = [Protection(redis.Redis(port=port), [POLICY]).start() for _ in range(2)]
            try:
                time.sleep(0.2)
                before = loop_calls(admin)
                t0 = time.monotonic()
                drive(instances, rate, SECONDS, 0)
                calls = loop_calls(admin) - before
                elapsed = time.monotonic() - t0
            finally:
                for p in instances:
                    p.close()
            print(f"{rate:>24} {calls / elapsed / len(instances):>28.2f}")
        # What a request's thread pays: record() in a tight loop, one thread.
        p = Protection(redis.Redis(port=port), [POLICY])
        n = 200_000
        t = time.perf_counter_ns()
        for i in range(n):
            p.record(POLICY, i % 10 == 0)
        print(f"record() on the request's thread: {(time.perf_counter_ns() - t) / n:.0f} ns a call (in memory; no I/O)")

        # 2. convergence to a new scale.
        print(f"\nconvergence to scale 80 after a window with 10% errors (WINDOW {WINDOW_MS} ms):")
        print(f"{'round':>6} {'instance':>9} {'ms after the window end':>24} {'windows':>8}")
        every_ms: list[float] = []
        for rnd in range(1, ROUNDS + 1):
            # A plain SET resets the scale to 100; then the loop again.
            admin.execute_command("RL.POLICY", "SET", POLICY, "TOKENBUCKET", "100000", "100000", "1000")
            admin.execute_command(
                "RL.POLICY", "SET", POLICY, "TOKENBUCKET", "100000", "100000", "1000",
                "ADAPT", "ERRORS", "5", "WINDOW", str(WINDOW_MS), "MINCALLS", "50",
            )
            instances = [Protection(redis.Redis(port=port), [POLICY]).start() for _ in range(2)]
            try:
                # Start at a window's start, so the whole window carries errors.
                now_ms = time.time() * 1000
                time.sleep((WINDOW_MS - now_ms % WINDOW_MS) / 1000)
                window_end = (time.time() * 1000 // WINDOW_MS + 1) * WINDOW_MS
                seen: dict[int, float] = {}
                stop = threading.Event()

                def watch(i: int, p: Protection) -> None:
                    while not stop.is_set():
                        if p.scale(POLICY) < 100 and i not in seen:
                            seen[i] = time.time() * 1000
                            return
                        time.sleep(0.005)

                watchers = [threading.Thread(target=watch, args=(i, p)) for i, p in enumerate(instances)]
                for w in watchers:
                    w.start()
                deadline = window_end + 4 * WINDOW_MS + 3000
                while len(seen) < len(instances) and time.time() * 1000 < deadline:
                    drive(instances, 500, 0.2, 10)
                stop.set()
                for w in watchers:
                    w.join()
            finally:
                for p in instances:
                    p.close()
            scale = admin.execute_command("RL.POLICY", "STATS", POLICY)[1]
            for i in range(len(instances)):
                if i in seen:
                    ms = seen[i] - window_end
                    every_ms.append(ms)
                    print(f"{rnd:>6} {i + 1:>9} {ms:>24.0f} {ms / WINDOW_MS:>8.2f}")
                else:
                    print(f"{rnd:>6} {i + 1:>9} {'not seen':>24} {'-':>8}  (server scale {scale})")
        if every_ms:
            print(f"median {statistics.median(every_ms):.0f} ms = {statistics.median(every_ms) / WINDOW_MS:.2f} windows,"
                  f" max {max(every_ms):.0f} ms = {max(every_ms) / WINDOW_MS:.2f} windows"
                  " (bound: report interval + poll interval = 2000 ms)")
    finally:
        proc.kill()
        proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
