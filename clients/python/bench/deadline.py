#!/usr/bin/env python3
"""What deadline a healthy Redis meets on a loaded host, and what the ASGI
middleware admits with it: the figures behind the default `deadline` (100 ms).

    RL_MODULE=/abs/libredis_ratelimit.so python3 clients/python/bench/deadline.py
    BURN=2 ...            # two CPU burners (`yes > /dev/null`) for the run
    KIT_SRC=/abs/src ...  # the kit to measure (default: this tree's)

1. A cold process (a fresh interpreter, a new connection) makes CALLS limiter
   calls (`RL.SLIDING` through `AsyncClient.limit`, as the middleware does),
   one at a time: p50, p99, p99.9, max, and the fraction above 5, 10 and 100 ms.
2. The issue's repro against a fresh uvicorn process (cold), one user: a burst
   of 40 at once against 5 per minute, and 200 requests (20 at a time)
   against 100 per minute: how many were admitted, and by which path.

A benchmark reports; it exits 0.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MODULE = os.environ.get("RL_MODULE", str(ROOT / "target/release/libredis_ratelimit.so"))
KIT_SRC = os.environ.get("KIT_SRC", str(ROOT / "clients/python/src"))
CALLS = int(os.environ.get("CALLS", "20000"))
BURN = int(os.environ.get("BURN", "0"))
DEADLINE = os.environ.get("DEADLINE")  # seconds; default: the middleware's own
WARM = os.environ.get("WARM")  # connections opened at start-up; default: the middleware's

LATENCY = r"""
import asyncio, json, sys, time
import redis.asyncio as aioredis
from redis_ratelimit_client import AsyncClient, Sliding

async def main(port, calls):
    client = AsyncClient(aioredis.Redis(port=port))
    spec = Sliding(100, 60_000)
    took = []
    for i in range(calls):
        t = time.perf_counter()
        await client.limit(f"lat:{i % 1000}", spec)
        took.append((time.perf_counter() - t) * 1000)
    print(json.dumps(took))

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"""

APP = r"""
import os
import redis.asyncio as aioredis
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from redis_ratelimit_client import Sliding
from redis_ratelimit_client.asgi import RateLimitMiddleware, Rule, header

async def hello(request):
    return PlainTextResponse("hello")

async def stats(request):
    return PlainTextResponse(repr(app.stats))

options = {}
if os.environ.get("WARM"):
    options["connections"] = int(os.environ["WARM"])
if os.environ.get("DEADLINE"):
    options["deadline"] = float(os.environ["DEADLINE"])
app = RateLimitMiddleware(
    Starlette(routes=[Route("/", hello), Route("/stats", stats)]),
    client=aioredis.Redis(port=int(os.environ["RL_PORT"])),
    rules=[Rule(Sliding(int(os.environ["RL_LIMIT"]), 60_000), "per-user")],
    key=header("x-user"),
    **options,
)
"""


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


def pct(xs: list[float], p: float) -> float:
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def latency(port: int, env: dict[str, str]) -> None:
    out = subprocess.run(
        [sys.executable, "-c", LATENCY, str(port), str(CALLS)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    took = sorted(json.loads(out.stdout))
    above = {ms: sum(t > ms for t in took) / len(took) for ms in (5, 10, 100)}
    print(
        f"| {len(took)} calls | p50 {pct(took, 0.5):.2f} ms | p99 {pct(took, 0.99):.2f} ms "
        f"| p99.9 {pct(took, 0.999):.2f} ms | max {took[-1]:.1f} ms "
        f"| >5 ms {above[5]:.3%} | >10 ms {above[10]:.3%} | >100 ms {above[100]:.3%} |"
    )


def repro(redis_port: int, env: dict[str, str], limit: int, total: int, at_once: int) -> None:
    import httpx

    subprocess.run(
        ["redis-cli", "-p", str(redis_port), "FLUSHALL"], check=True, capture_output=True
    )
    work = tempfile.mkdtemp(prefix="rl-deadline-")
    Path(work, "deadline_app.py").write_text(APP)
    web = free_port()
    env = {
        **env,
        "RL_PORT": str(redis_port),
        "RL_LIMIT": str(limit),
        "PYTHONPATH": f"{KIT_SRC}:{work}",
    }
    if DEADLINE:
        env["DEADLINE"] = DEADLINE
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "deadline_app:app",
            "--port",
            str(web),
            "--log-level",
            "error",
        ],
        env=env,
        cwd=work,
    )
    try:
        wait_port(web)
        codes: list[int] = []
        with httpx.Client(
            base_url=f"http://127.0.0.1:{web}",
            timeout=30,
            limits=httpx.Limits(max_connections=at_once),
        ) as http:
            from concurrent.futures import ThreadPoolExecutor

            def get(_: int) -> int:
                return http.get("/", headers={"x-user": "burst"}).status_code

            with ThreadPoolExecutor(at_once) as pool:
                codes = list(pool.map(get, range(total)))
            stats = http.get("/stats", headers={"x-user": "stats"}).text
        print(
            f"| {total} against {limit}/min, {at_once} at once | admitted {codes.count(200)} "
            f"| {stats} |"
        )
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    port = free_port()
    work = tempfile.mkdtemp(prefix="rl-deadline-redis-")
    server = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            work,
            "--save",
            "",
            "--appendonly",
            "no",
            "--loadmodule",
            MODULE,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    burners = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(BURN)]
    env = {**os.environ, "PYTHONPATH": KIT_SRC}
    try:
        wait_port(port)
        print(
            f"kit: {KIT_SRC}; burners: {BURN}; cores: {os.cpu_count()}; "
            f"deadline: {DEADLINE or 'the default'}"
        )
        latency(port, env)
        repro(port, env, 5, 40, 40)
        repro(port, env, 100, 200, 20)
    finally:
        for b in burners:
            b.kill()
            b.wait()
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
