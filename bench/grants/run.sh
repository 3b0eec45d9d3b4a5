#!/usr/bin/env bash
# One global limit larger than one node (issue 27): a 3-master cluster
# (scripts/cluster.sh on ports of its own), several client processes
# (clients/rust/examples/grants_load.rs) offering twice the limit on ONE
# global token bucket, four ways side by side in one run:
#   one             one key, a Redis call per decision
#   batched         UPTO grants spent in process (hold_ms 50, max_share_pct 10)
#   striped         3 stripes, one per master; own stripe, then the next
#   batched-striped both
# For each: decisions/s, admitted per second over the limit in the steady
# state (the first 2 s and the last one left out; the mean, the lowest and
# the highest second), Redis calls per 1,000 decisions (the processes'
# counters: limiter calls and REFUNDs), and each master's share of the
# calls (INFO commandstats before and after). A benchmark reports; it exits
# 0 whatever the figures are.
#
# Knobs: GRANTS_LIMIT (the limit per second, 4000), GRANTS_PROCS (client
# processes, 3), GRANTS_SECONDS (per way, 10), GRANTS_PORT (first of the
# cluster's six ports, 7450; bus ports +10000), GRANTS_HOLD_MS (the batched
# ways' hold_ms, 50), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
LIMIT="${GRANTS_LIMIT:-4000}"
PROCS="${GRANTS_PROCS:-3}"
SECONDS_PER_WAY="${GRANTS_SECONDS:-10}"
PORT="${GRANTS_PORT:-7450}"
HOLD_MS="${GRANTS_HOLD_MS:-50}"

RL_NAME=bench-grants
# shellcheck source=../../scripts/lib/server.sh
. scripts/lib/server.sh
rl_module
rl_require redis-server redis-cli python3
rl_workdir
export RL_MODULE="$RL_MODULE_PATH"
# GRANTS_LOAD: another kit's load process with the same options and JSON
# line (the Go kit's: clients/go/bench/grants); the Rust kit's by default.
LOAD="${GRANTS_LOAD:-}"
if [ -z "$LOAD" ]; then
  cargo build --release -q -p redis-ratelimit-client --example grants_load
  LOAD="${CARGO_TARGET_DIR:-target}/release/examples/grants_load"
fi

export CLUSTER_PORT="$PORT" CLUSTER_DIR="$RL_WORK/cluster"
stop_cluster() { scripts/cluster.sh stop redis >/dev/null 2>&1 || true; }
trap 'stop_cluster; rl_cleanup' EXIT
scripts/cluster.sh start redis >/dev/null
MASTERS=()
for p in $(seq "$PORT" $((PORT + 5))); do
  if redis-cli -p "$p" ROLE | head -1 | grep -q master; then MASTERS+=("$p"); fi
done
NODES=""
for p in $(seq "$PORT" $((PORT + 5))); do NODES="${NODES:+$NODES,}redis://127.0.0.1:$p/"; done

# The bucket: LIMIT per second, refilled every 10 ms, holding one second of
# it (so that the default max_share_pct, 10 % of the capacity, does not cap
# a batch below hold_ms worth of an instance's rate).
CAPACITY=$LIMIT
REFILL=$((LIMIT / 100))
RATE=$((2 * LIMIT / PROCS))

calls_of() {
  redis-cli -p "$1" INFO commandstats | tr -d '\r' |
    awk -F'[=,:]' 'tolower($1) == "cmdstat_rl.tokenbucket" { print $3; found=1 } END { if (!found) print 0 }'
}

echo "grants: ${#MASTERS[@]} masters, $PROCS processes offering $((RATE * PROCS))/s on a limit of $LIMIT/s"
echo "(token bucket $CAPACITY $REFILL 10, hold_ms $HOLD_MS), ${SECONDS_PER_WAY} s per way"
results="$RL_WORK/results"
: >"$results"
for mode in one batched striped batched-striped; do
  before=()
  for m in "${MASTERS[@]}"; do before+=("$(calls_of "$m")"); done
  start_at=$(($(date +%s%3N) + 1500))
  pids=()
  for i in $(seq 1 "$PROCS"); do
    "$LOAD" --nodes "$NODES" --mode "$mode" --key "bench:$mode" \
      --capacity "$CAPACITY" --refill-count "$REFILL" --refill-ms 10 \
      --rate "$RATE" --hold-ms "$HOLD_MS" --tasks 16 --duration-ms $((SECONDS_PER_WAY * 1000)) \
      --start-at-ms "$start_at" >"$RL_WORK/$mode.$i.json" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  shares=""
  for j in "${!MASTERS[@]}"; do
    shares="$shares $(($(calls_of "${MASTERS[$j]}") - before[j]))"
  done
  cat "$RL_WORK/$mode".*.json | python3 -c '
import json, sys
mode, limit, shares = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3:]]
runs = [json.loads(l) for l in sys.stdin if l.strip()]
dec = sum(r["decisions"] for r in runs)
calls = sum(r["redis_calls"] for r in runs)
secs = max(r["elapsed_ms"] for r in runs) / 1000
n = min(len(r["admitted_per_s"]) for r in runs)
per_s = [sum(r["admitted_per_s"][i] for r in runs) for i in range(n)]
steady = per_s[2:n - 1] or per_s
ratios = [a / limit for a in steady]
total = sum(shares) or 1
print(json.dumps({"mode": mode, "decisions_per_s": round(dec / secs), "admitted_over_limit":
  round(sum(ratios) / len(ratios), 4), "lowest_second": round(min(ratios), 4), "highest_second":
  round(max(ratios), 4), "calls_per_1000": round(calls * 1000 / max(dec, 1), 2),
  "master_shares": [round(s / total, 3) for s in shares], "fallback": sum(r["fallback"] for r in runs)}))
' "$mode" "$LIMIT" $shares >>"$results"
done

python3 - "$results" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
head = ("way", "decisions/s", "admitted/limit", "lowest s", "highest s", "calls/1000", "masters' shares", "fallback")
print()
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for r in rows:
    print("| " + " | ".join(str(x) for x in (r["mode"], r["decisions_per_s"], r["admitted_over_limit"],
        r["lowest_second"], r["highest_second"], r["calls_per_1000"],
        " / ".join(f"{s:.0%}" for s in r["master_shares"]), r["fallback"])) + " |")
EOF
