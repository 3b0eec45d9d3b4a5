#!/usr/bin/env python3
"""Waiting in the server (BLOCK) against polling from the client, and the
memory a blocked client holds, on redis-server and (where
scripts/valkey-path.sh finds one) valkey-server, each its own server with the
module on a free loopback port.

1. Server CPU per admission. One token bucket (BENCH_BLOCK_CAPACITY units,
   refilling BENCH_BLOCK_RATE units a second) shared by BENCH_BLOCK_CLIENTS
   threads, one connection each, that all want units all the time:
   - BLOCK: each loops `RL.TOKENBUCKET k cap rate 1000 BLOCK 5000`;
   - polling: each loops the same call without BLOCK and, denied, sleeps the
     reply's wait_ms before it retries (what clients do without BLOCK).
   The two modes run BENCH_BLOCK_SECONDS each, interleaved in rounds (the one
   that goes first alternates), on one server; around each run the script
   reads the server's `used_cpu_user + used_cpu_sys` (INFO cpu). Printed per
   mode: admissions/s, calls sent per admission, server CPU µs per admission
   (medians over rounds), polling/BLOCK as the median of the per-round ratios,
   the server's event-loop cycles per admission where INFO stats has
   `eventloop_cycles` (Valkey), and this Python process's own CPU per
   admission. A denial in BLOCK mode (a timeout) is logged with its reply.
2. Memory per blocked client. BENCH_BLOCK_MEM_CLIENTS raw connections are
   opened and answer PING (idle clients), then each sends a call that blocks
   for hours on one drained key (refill 1 per hour, a timeout longer than the
   whole queue) or `BLPOP` on one empty list, Redis's own blocking command,
   as the baseline. `used_memory` (INFO memory) is read with no client, with
   the idle clients and with them blocked, each after the server's
   clientsCron has had time to trim idle buffers (BENCH_BLOCK_SETTLE
   seconds), so "bytes per blocked client" is what blocking adds beyond a
   connection. The script checks that INFO shows every client blocked
   (`ratelimit_blocked_now` for the module), closes the sockets, waits
   until nothing is blocked any more and reads used_memory once more (what
   is left per client once all are gone). This part runs first, on a server
   that no blocked call has used yet.

    RL_MODULE=/abs/libredis_ratelimit.so python3 bench/blocking.py

Knobs: BENCH_BLOCK_ROUNDS (3), BENCH_BLOCK_SECONDS (4 per mode and round),
BENCH_BLOCK_CLIENTS (50), BENCH_BLOCK_RATE (2000 units/s),
BENCH_BLOCK_CAPACITY (10), BENCH_BLOCK_MEM_CLIENTS (1000; the script raises
its open-file limit and the server's maxclients to fit), BENCH_BLOCK_SETTLE
(4 s), BENCH_BLOCK_VALKEY (1; 0 skips Valkey). About 2 minutes with the
defaults, half of it on each server. A benchmark reports; it exits 0
(non-zero only when it cannot run).
"""

from __future__ import annotations

import datetime
import math
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
MODULE = os.environ.get("RL_MODULE", str(ROOT / "target/release/libredis_ratelimit.so"))
ROUNDS = int(os.environ.get("BENCH_BLOCK_ROUNDS", "3"))
SECONDS = float(os.environ.get("BENCH_BLOCK_SECONDS", "4"))
CLIENTS = int(os.environ.get("BENCH_BLOCK_CLIENTS", "50"))
RATE = int(os.environ.get("BENCH_BLOCK_RATE", "2000"))
CAPACITY = int(os.environ.get("BENCH_BLOCK_CAPACITY", "10"))
MEM_CLIENTS = int(os.environ.get("BENCH_BLOCK_MEM_CLIENTS", "1000"))
SETTLE = float(os.environ.get("BENCH_BLOCK_SETTLE", "4"))
VALKEY = os.environ.get("BENCH_BLOCK_VALKEY", "1") != "0"

BLOCK_TIMEOUT_MS = 5000
HOUR_MS = 3_600_000


def log(msg: str) -> None:
    print(f"blocking: {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def raise_nofile(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < need:
        log(f"open-file limit {target} (hard) is below the {need} needed;"
            " fewer blocked clients may fit")


class Server:
    """A server with the module on a free loopback port, stopped by stop()."""

    def __init__(self, binary: str, work: str, maxclients: int) -> None:
        self.binary = binary
        for _attempt in range(5):
            self.port = free_port()
            logfile = os.path.join(work, f"server-{self.port}.log")
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", work,
                 "--save", "", "--appendonly", "no", "--maxclients", str(maxclients),
                 "--logfile", logfile, "--loadmodule", MODULE],
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            self.r = redis.Redis(port=self.port, decode_responses=True)
            for _ in range(200):
                if self.proc.poll() is not None:
                    break
                try:
                    if int(self.r.info("server")["process_id"]) == self.proc.pid:
                        return
                    break  # another server answers on that port
                except redis.ConnectionError:
                    time.sleep(0.05)
            self.stop()
            try:
                tail = Path(logfile).read_text().splitlines()[-5:]
            except OSError:
                tail = []
            if not any("Address already in use" in line for line in tail):
                sys.exit(f"blocking: {binary} did not start: " + " / ".join(tail))
        sys.exit(f"blocking: {binary} did not start (ports taken)")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def cpu(self) -> float:
        info = self.r.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def cycles(self) -> int | None:
        """Event-loop iterations so far, where INFO stats has them (Valkey)."""
        value = self.r.info("stats").get("eventloop_cycles")
        return None if value is None else int(value)

    def ratelimit(self) -> dict[str, Any]:
        return self.r.info("ratelimit")

    def version(self) -> str:
        info = self.r.info("server")
        name = "valkey" if "valkey_version" in info else "redis"
        ver = info.get("valkey_version") or info.get("redis_version")
        malloc = self.r.info("memory").get("mem_allocator", "?")
        return f"{name}-server {ver} (malloc {malloc})"


# --- 1. server CPU per admission -----------------------------------------------

def run_mode(srv: Server, mode: str, key: str, seconds: float = SECONDS) -> dict[str, float]:
    conns = [redis.Redis(port=srv.port) for _ in range(CLIENTS)]
    for c in conns:
        c.ping()
    admitted = [0] * CLIENTS
    calls = [0] * CLIENTS
    timed_out = [0] * CLIENTS
    denials: list[tuple[float, Any]] = []
    stop = threading.Event()
    start = threading.Barrier(CLIENTS + 1)
    base = ["RL.TOKENBUCKET", key, CAPACITY, RATE, 1000]
    cmd = base + ["BLOCK", BLOCK_TIMEOUT_MS] if mode == "BLOCK" else base

    def worker(i: int) -> None:
        c = conns[i]
        start.wait()
        n_adm = n_calls = n_to = 0
        while not stop.is_set():
            sent = time.perf_counter()
            reply = c.execute_command(*cmd)
            n_calls += 1
            if reply[0] == 1:
                n_adm += 1
            elif mode == "BLOCK":
                n_to += 1
                if len(denials) < 5:
                    denials.append((round(time.perf_counter() - sent, 3), reply))
            elif reply[3] > 0:
                time.sleep(reply[3] / 1000)
        admitted[i], calls[i], timed_out[i] = n_adm, n_calls, n_to

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    info = srv.ratelimit()
    blocked_before = int(info["ratelimit_blocked_total"])
    timed_out_before = int(info["ratelimit_blocked_timed_out"])
    cycles_before = srv.cycles()
    cpu_before = srv.cpu()
    self_before = time.process_time()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    self_cpu = time.process_time() - self_before
    cpu = srv.cpu() - cpu_before
    cycles_after = srv.cycles()
    info = srv.ratelimit()
    blocked = int(info["ratelimit_blocked_total"]) - blocked_before
    server_timed_out = int(info["ratelimit_blocked_timed_out"]) - timed_out_before
    if denials:
        log(f"{mode}: {sum(timed_out)} denials ({server_timed_out} timed out in the server),"
            f" the first after (s, reply): {denials}")
    for c in conns:
        c.close()
    adm = sum(admitted)
    return {
        "rate": adm / elapsed,
        "calls": sum(calls) / max(adm, 1),
        "cpu_us": cpu * 1e6 / max(adm, 1),
        "self_us": self_cpu * 1e6 / max(adm, 1),
        "waited": blocked / max(sum(calls), 1),
        "timed_out": float(sum(timed_out)),
        "cycles": (float("nan") if cycles_before is None or cycles_after is None
                   else (cycles_after - cycles_before) / max(adm, 1)),
    }


def cpu_section(srv: Server, label: str) -> None:
    modes = ["BLOCK", "polling"]
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    log(f"{label}: 1 s of warm-up, then {ROUNDS} rounds of {SECONDS:g} s per mode")
    for m in modes:
        run_mode(srv, m, f"warm:{m}", 1.0)
    load_start = os.getloadavg()[0]
    for rnd in range(ROUNDS):
        order = modes if rnd % 2 == 0 else modes[::-1]
        for m in order:
            res = run_mode(srv, m, f"cpu:{rnd}:{m}")
            results[m].append(res)
            log(f"{label} round {rnd + 1} {m}: {res['rate']:,.0f} admissions/s,"
                f" {res['calls']:.2f} calls and {res['cpu_us']:.1f} server us per admission")
    load_end = os.getloadavg()[0]
    left = int(srv.ratelimit()["ratelimit_blocked_now"])
    ratios = [p["cpu_us"] / b["cpu_us"] for p, b in zip(results["polling"], results["BLOCK"])]
    call_ratios = [p["calls"] / b["calls"] for p, b in zip(results["polling"], results["BLOCK"])]

    def med(m: str, field: str) -> float:
        return statistics.median(r[field] for r in results[m])

    print()
    print(f"{label}: RL.TOKENBUCKET capacity {CAPACITY}, {RATE:,} units/s, shared by {CLIENTS}"
          f" clients (one connection each) that all want units; {ROUNDS} interleaved rounds"
          f" of {SECONDS:g} s per mode; load average {load_start:.2f} at start,"
          f" {load_end:.2f} at end")
    def cycles(m: str) -> str:
        value = med(m, "cycles")
        return "-" if math.isnan(value) else f"{value:.2f}"  # NaN: no eventloop_cycles

    print("| mode | admissions/s | calls per admission | server CPU µs per admission"
          " | vs BLOCK | server event-loop cycles per admission | client CPU µs per admission |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(f"| BLOCK {BLOCK_TIMEOUT_MS} | {med('BLOCK', 'rate'):,.0f} | {med('BLOCK', 'calls'):.2f}"
          f" | {med('BLOCK', 'cpu_us'):.1f} | 1.00x | {cycles('BLOCK')}"
          f" | {med('BLOCK', 'self_us'):.0f} |")
    print(f"| polling (sleep wait_ms) | {med('polling', 'rate'):,.0f}"
          f" | {med('polling', 'calls'):.2f} | {med('polling', 'cpu_us'):.1f}"
          f" | {statistics.median(ratios):.2f}x | {cycles('polling')}"
          f" | {med('polling', 'self_us'):.0f} |")
    waited = statistics.median(r["waited"] for r in results["BLOCK"])
    timed_out = sum(r["timed_out"] for r in results["BLOCK"])
    print(f"BLOCK: {waited:.0%} of calls waited in the server (ratelimit_blocked_total),"
          f" {timed_out:.0f} timed out, {left} still blocked after the runs;"
          f" polling sends {statistics.median(call_ratios):.1f}x the calls")


# --- 2. memory per blocked client ----------------------------------------------

def resp(*args: object) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def used_memory(srv: Server) -> int:
    return int(srv.r.info("memory")["used_memory"])


def settled_memory(srv: Server, n: int, wait: float = SETTLE) -> int:
    """used_memory once the server's cron has trimmed the clients' buffers:
    a query buffer is trimmed when its client has been idle for more than 2 s
    (whole seconds), and the cron visits every client about once a second;
    then until two readings 0.5 s apart agree within 8 bytes per client."""
    time.sleep(wait)
    prev = used_memory(srv)
    for _ in range(20):
        time.sleep(0.5)
        cur = used_memory(srv)
        if abs(cur - prev) <= 8 * n:
            return cur
        prev = cur
    log(f"used_memory still moving ({prev:,} then {cur:,})")
    return cur


def wait_for(pred: Any, what: str, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    log(f"timed out waiting for {what}")
    return False


def memory_one(srv: Server, name: str, command: bytes, key: str, blocked_now: Any,
               first: bool) -> dict[str, float]:
    n = MEM_CLIENTS
    srv.r.delete(key)
    if name.startswith("RL"):
        # Drain the bucket: the next unit is an hour away, the n-th n hours.
        srv.r.execute_command("RL.TOKENBUCKET", key, 1, 1, HOUR_MS)
    base_clients = int(srv.r.info("clients")["connected_clients"])
    # Before the first command, no client is connected yet: nothing to trim.
    # Before the second, the first's last reading has just settled.
    m0 = settled_memory(srv, n, 0.5) if first else used_memory(srv)
    socks = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(resp("PING"))
            socks.append(s)
        for s in socks:
            if s.recv(64) != b"+PONG\r\n":
                raise RuntimeError("no PONG")
        m1 = settled_memory(srv, n)
        for s in socks:
            s.sendall(command)
        ok = wait_for(lambda: blocked_now() == n, f"{n} clients blocked on {name}")
        now = blocked_now()
        m2 = settled_memory(srv, n)
        still = blocked_now()
    finally:
        for s in socks:
            s.close()
    released = wait_for(lambda: blocked_now() == 0
                        and int(srv.r.info("clients")["connected_clients"]) == base_clients,
                        f"{name} waiters to go")
    m3 = settled_memory(srv, n)
    if not ok or still != n:
        log(f"{name}: {now} then {still} blocked of {n}")
    return {
        "conn": (m1 - m0) / n,
        "blocked": (m2 - m1) / n,
        "left": (m3 - m0) / n,
        "n": float(now),
        "released": float(released),
    }


def memory_section(srv: Server, label: str) -> None:
    n = MEM_CLIENTS
    timeout = (n + 2) * HOUR_MS
    log(f"{label}: memory of {n} idle, then blocked clients (about {7 * (SETTLE + 0.5):.0f} s)")

    def rl_now() -> int:
        return int(srv.ratelimit()["ratelimit_blocked_now"])

    def redis_now() -> int:
        return int(srv.r.info("clients")["blocked_clients"])

    rows = [
        (f"RL.TOKENBUCKET k 1 1 {HOUR_MS} BLOCK {timeout}",
         memory_one(srv, "RL.TOKENBUCKET", resp("RL.TOKENBUCKET", "mem:rl", 1, 1, HOUR_MS,
                                               "BLOCK", timeout), "mem:rl", rl_now, True)),
        ("BLPOP list 0 (empty list)",
         memory_one(srv, "BLPOP", resp("BLPOP", "mem:list", 0), "mem:list", redis_now, False)),
    ]
    base = rows[1][1]["blocked"]
    print()
    print(f"{label}: {n} connections blocked on one key; used_memory (INFO memory)"
          f" read {SETTLE:g} s or more into each state, once it holds still")
    print("| blocked on | clients blocked | bytes per idle connection"
          " | bytes per blocked client, beyond its connection | vs BLPOP"
          " | bytes per client left after all closed |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, row in rows:
        ratio = f"{row['blocked'] / base:.2f}x" if base > 0 else "-"
        print(f"| `{name}` | {row['n']:.0f} | {row['conn']:,.0f} | {row['blocked']:,.0f}"
              f" | {ratio} | {row['left']:,.0f} |")
    gone = all(row["released"] for _, row in rows)
    state = "nothing blocked, every client gone" if gone else "NOT all released"
    print(f"after closing the sockets: {state}"
          f" (ratelimit_blocked_now {srv.ratelimit()['ratelimit_blocked_now']})")


# --- main ------------------------------------------------------------------------

def servers() -> list[tuple[str, str]]:
    found = [("redis-server", shutil.which("redis-server") or "")]
    if VALKEY:
        try:
            out = subprocess.run([str(ROOT / "scripts/valkey-path.sh")], capture_output=True,
                                 text=True, check=False)
            if out.returncode == 0 and out.stdout.strip():
                found.append(("valkey-server", out.stdout.strip()))
            else:
                log("no valkey-server (scripts/valkey-path.sh): Redis only")
        except OSError:
            log("scripts/valkey-path.sh did not run: Redis only")
    return [(n, b) for n, b in found if b]


def main() -> None:
    if not os.path.isfile(MODULE):
        sys.exit(f"blocking: module {MODULE} not found; run 'make build' or set RL_MODULE")
    raise_nofile(MEM_CLIENTS + CLIENTS + 200)
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    maxclients = min(MEM_CLIENTS + CLIENTS + 100, soft - 64)
    work = tempfile.mkdtemp(prefix="rl-bench-block-")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    built = datetime.datetime.fromtimestamp(os.path.getmtime(MODULE), datetime.timezone.utc)
    print(f"BLOCK vs polling, {now}; module {MODULE} built {built:%Y-%m-%d %H:%M UTC};"
          f" nproc {os.cpu_count()}")
    try:
        for _name, binary in servers():
            srv = Server(binary, work, maxclients)
            try:
                label = srv.version()
                # Memory first, on a server no blocked call has used yet.
                memory_section(srv, label)
                cpu_section(srv, label)
            finally:
                srv.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
