"""bench/rls/run.sh's tables, in Markdown for docs/benchmarks.md, from the
JSON lines the runs left (run_delta.py's and the boundary runs').

    python3 report.py RESULTS KEY=VALUE...

KEY=VALUE: when, commit, load_before, load_after, cores, redis, conns,
inflight, seconds, rounds, values, limit, cycles.
"""

import json
import statistics
import sys
from typing import Any

NAMES = {"reference": "envoyproxy/ratelimit", "ours": "redis-ratelimit-rls"}


def row(cells: list[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def throughput(rows: list[dict[str, Any]], info: dict[str, str]) -> None:
    runs = [r for r in rows if r["kind"] == "throughput"]
    if not runs:
        return
    print(
        f"Throughput: {info['conns']} connection(s) x {info['inflight']} call(s) in flight, "
        f"{info['seconds']} s per run, {info['rounds']} interleaved round(s) (calls/s and "
        f"latencies: the median run; per call: all rounds' totals over all their calls), "
        f"{info['values']} values per key, nothing denied."
    )
    print()
    print(
        row(
            [
                "descriptors",
                "server",
                "calls/s",
                "vs reference",
                "Redis commands/call",
                "which",
                "Redis CPU µs/call",
                "gateway CPU µs/call",
                "p50 µs",
                "p99 µs",
                "errors",
            ]
        )
    )
    print("|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["descriptors"], r["server"]), []).append(r)
    for d in sorted({k[0] for k in groups}):
        ref = groups.get((d, "reference"))
        ref_rate = statistics.median(r["calls_per_s"] for r in ref) if ref else None
        for server in ("reference", "ours"):
            g = groups.get((d, server))
            if not g:
                continue
            calls = max(sum(r["calls"] for r in g), 1)
            cmds: dict[str, int] = {}
            for r in g:
                for k, v in r["cmds"].items():
                    cmds[k] = cmds.get(k, 0) + v
            # Commands below one per hundred calls (connection checks, the
            # breaker's probes) count in the total but are not named.
            which = " + ".join(
                f"{k.upper()} {v / calls:.3g}"
                for k, v in sorted(cmds.items(), key=lambda kv: -kv[1])
                if v / calls >= 0.01
            )
            rate = statistics.median(r["calls_per_s"] for r in g)
            ratio = (
                f"{rate / ref_rate:.2f}x" if ref_rate and server != "reference" else ""
            )
            print(
                row(
                    [
                        d,
                        NAMES[server],
                        f"{rate:,.0f}",
                        ratio,
                        f"{sum(cmds.values()) / calls:.2f}",
                        which,
                        f"{sum(r['redis_cpu_s'] for r in g) * 1e6 / calls:.1f}",
                        f"{sum(r['gateway_cpu_s'] for r in g) * 1e6 / calls:.1f}",
                        f"{statistics.median(r['p50_us'] for r in g):,.0f}",
                        f"{statistics.median(r['p99_us'] for r in g):,.0f}",
                        sum(r["errors"] for r in g),
                    ]
                )
            )


def boundary(rows: list[dict[str, Any]], info: dict[str, str]) -> None:
    runs = [r for r in rows if r["kind"] == "boundary"]
    if not runs:
        return
    limit = int(info["limit"])
    print()
    print(
        f"Window boundary: a limit of {limit:,}/s, offered at {2 * limit:,}/s from x.5 s "
        f"to x+1.5 s (across a boundary of the windows aligned to seconds), "
        f"{info['cycles']} times, 2 s of quiet between."
    )
    print()
    print(
        row(
            [
                "server",
                "algorithm",
                "offered",
                "admitted",
                "most admitted in any 1 s / limit",
                "admitted per burst / limit",
                "errors",
            ]
        )
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in runs:
        print(
            row(
                [
                    NAMES[r["server"]],
                    r["algorithm"],
                    f"{r['offered']:,}",
                    f"{r['ok']:,}",
                    f"{r['max_1s_admitted'] / limit:.3f}",
                    f"{r['ok'] / int(info['cycles']) / limit:.3f}",
                    r["errors"],
                ]
            )
        )


def main() -> None:
    with open(sys.argv[1]) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    info = dict(a.split("=", 1) for a in sys.argv[2:])
    print()
    print(
        f"### Results ({info['when']}, {info['commit']}, Redis {info['redis']}, "
        f"{info['cores']} cores, load average {info['load_before']} before, "
        f"{info['load_after']} after)"
    )
    print()
    throughput(rows, info)
    boundary(rows, info)
    for r in rows:
        if r.get("first_error"):
            what = r.get("descriptors", r.get("algorithm"))
            print(f"\n{NAMES[r['server']]} ({what}): first error: {r['first_error']}")


if __name__ == "__main__":
    main()
