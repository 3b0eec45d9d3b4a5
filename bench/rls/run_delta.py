"""One throughput run of bench/rls/run.sh as one JSON line: rls_load's line
and what the run cost Redis and the gateway (the differences between two
snapshots: INFO commandstats, INFO cpu and the gateway's /proc/PID/stat).

    python3 run_delta.py SERVER BEFORE AFTER RUN_JSON CLK_TCK
"""

import json
import sys


def parse(path: str, tck: int) -> tuple[dict[str, int], float, float]:
    cmds: dict[str, int] = {}
    cpu = 0.0
    gateway = 0.0
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("cmdstat_"):
                name, rest = line[len("cmdstat_") :].split(":", 1)
                fields = dict(kv.split("=", 1) for kv in rest.split(","))
                cmds[name] = int(fields["calls"])
            elif line.startswith(("used_cpu_user:", "used_cpu_sys:")):
                cpu += float(line.split(":", 1)[1])
            elif line.startswith("gateway_stat:"):
                # utime and stime are /proc/PID/stat's fields 14 and 15: the
                # 12th and 13th after the command name's closing parenthesis
                # (the name may hold spaces).
                stat = line.rsplit(")", 1)[1].split()
                gateway = (int(stat[11]) + int(stat[12])) / tck
    return cmds, cpu, gateway


def main() -> None:
    server, before, after, run, tck = sys.argv[1:6]
    c0, cpu0, gw0 = parse(before, int(tck))
    c1, cpu1, gw1 = parse(after, int(tck))
    with open(run) as f:
        r = json.load(f)
    # INFO is the snapshots' own command.
    delta = {
        k: c1[k] - c0.get(k, 0) for k in c1 if k != "info" and c1[k] > c0.get(k, 0)
    }
    print(
        json.dumps(
            {
                "kind": "throughput",
                "server": server,
                "descriptors": r["descriptors"],
                "calls_per_s": r["calls_per_s"],
                "calls": r["calls"],
                "errors": r["errors"],
                "over_limit": r["over_limit"],
                "first_error": r["first_error"],
                "cmds": delta,
                "redis_cpu_s": round(cpu1 - cpu0, 6),
                "gateway_cpu_s": round(gw1 - gw0, 6),
                "p50_us": r["p50_us"],
                "p99_us": r["p99_us"],
            }
        )
    )


if __name__ == "__main__":
    main()
