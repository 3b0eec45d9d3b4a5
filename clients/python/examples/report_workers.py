"""Leases and waiting: at most 2 reports built at once across every worker,
and a partner API called at most 5 times a second, each call waiting in the
server (BLOCK) for its turn instead of failing or polling.

    make run
    pip install ./clients/python  # redis-ratelimit-client, from the repo root
    python report_workers.py      # 6 threads; prints the peak in flight
"""

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import redis

from redis_ratelimit_client import Client, Concurrency, Denied, TokenBucket

REDIS = os.environ.get("RL_REDIS", "127.0.0.1:6379")
host, port = REDIS.rsplit(":", 1)

rl = Client(redis.Redis(host=host, port=int(port), socket_timeout=0.5))
REPORTS = Concurrency(2, 10_000)  # 2 at once; a crashed worker's lease ends after 10 s
PARTNER = TokenBucket(5, 5, 1000)  # 5 calls a second, no burst above 5

lock = threading.Lock()
in_flight = peak = 0


def build_report(n: int) -> str:
    global in_flight, peak
    # Waits for one of the 2 units; a release admits the next waiter at once. The server
    # holds a waiter only if the leases ahead of it would have expired within the
    # timeout (6 workers on 2 units: 2 lease times), so the timeout covers that.
    with rl.lease("rl:reports", REPORTS, timeout_ms=30_000, renew=True):
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        # The partner call waits for its token in the server (on a connection of its own).
        d = rl.acquire("rl:partner", PARTNER, timeout_ms=5_000)
        if not d.allowed:
            raise RuntimeError(f"partner API busy, retry after {d.retry_after} s")
        time.sleep(0.05)  # the work
        with lock:
            in_flight -= 1
    return f"report {n}"


def main() -> int:
    try:
        with ThreadPoolExecutor(6) as pool:
            done = list(pool.map(build_report, range(6)))
    except Denied as e:
        print("no unit within the timeout:", e)
        return 1
    print(f"{len(done)} reports, at most {peak} at once")
    rl.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
