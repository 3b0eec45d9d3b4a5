#!/usr/bin/env bash
# Sustained load with a replica attached: the hardening section of
# `make bench`. Starts its own master (with the module) and a replica of it,
# each a redis-server on a free loopback port, drives the master with
# redis-benchmark from many clients, pipelined and not, for a bounded number
# of requests, and prints throughput and latency percentiles for INCR (the
# baseline) and limiter commands under identical conditions, with the
# master's CPU per call and how far the replica lagged. It reports and exits
# 0; that such load ends without an error and with the replica identical to
# its master is what tests/integration/operations/sustained_load.rs checks.
#
#   RL_MODULE=/abs/libredis_ratelimit.so bench/load.sh
#
# Run by scripts/bench.sh (BENCH_LOAD=0 skips it). Knobs: BENCH_LOAD_N
# (requests per pipelined run, 1500000), BENCH_LOAD_N1 (per run without
# pipelining, 200000; 0 skips those runs), BENCH_LOAD_CLIENTS (100),
# BENCH_LOAD_PIPELINE (16), BENCH_LOAD_KEYS (keyspace, 100000).
set -euo pipefail

cd "$(dirname "$0")/.."
N_PIPELINED="${BENCH_LOAD_N:-1500000}"
N_SINGLE="${BENCH_LOAD_N1:-200000}"
CLIENTS="${BENCH_LOAD_CLIENTS:-100}"
PIPELINE="${BENCH_LOAD_PIPELINE:-16}"
KEYSPACE="${BENCH_LOAD_KEYS:-100000}"
RUN_TIMEOUT_S=300 # a run that takes longer than this is stopped and reported
CATCH_UP_S=120    # how long the replica may take to catch up after a run

RL_NAME=load
# shellcheck source=../scripts/lib/server.sh
. scripts/lib/server.sh
rl_module
rl_require redis-server redis-cli redis-benchmark awk timeout
rl_workdir
WORK="$RL_WORK"

log() { echo "load: $*" >&2; }

# --- servers ----------------------------------------------------------------
# start_server name [redis-server options...]: sets STARTED_PORT.
start_server() {
  local name="$1"
  shift
  rl_start "$WORK/$name" "$@"
  STARTED_PORT="$RL_PORT"
}

cli() { # port words...
  local port="$1"
  shift
  redis-cli -h 127.0.0.1 -p "$port" "$@"
}

info_field() { # port section field
  cli "$1" INFO "$2" | tr -d '\r' | awk -F: -v f="$3" '$1 == f { print $2; exit }'
}

cpu_seconds() { # port
  cli "$1" INFO cpu | tr -d '\r' | awk -F: '$1 == "used_cpu_user" || $1 == "used_cpu_sys" { s += $2 } END { printf "%.6f", s }'
}

# Polls until the replica's link is up and the master sees it online.
wait_for_link() {
  local tries
  for tries in $(seq 300); do
    if [ "$(info_field "$REPLICA" replication master_link_status)" = "up" ] &&
      cli "$MASTER" INFO replication | grep -q "^slave0:.*state=online"; then
      log "replica linked after $tries polls of 0.1 s"
      return 0
    fi
    sleep 0.1
  done
  echo "load: the replica did not link to the master in 30 s; the end of its log:" >&2
  tail -n 5 "$WORK/replica/server.log" >&2 2>/dev/null || true
  exit 1
}

# Bytes the replica has still to process.
replica_lag() {
  local m_off r_off
  m_off="$(info_field "$MASTER" replication master_repl_offset)"
  r_off="$(info_field "$REPLICA" replication slave_repl_offset)"
  echo $((m_off - ${r_off:-0}))
}

# Polls until the replica has processed all the master sent; prints the
# seconds it took, or "-" after CATCH_UP_S.
wait_caught_up() {
  local started now
  started="$(date +%s.%N)"
  while :; do
    now="$(date +%s.%N)"
    if [ "$(replica_lag)" -le 0 ]; then
      awk -v s="$started" -v e="$now" 'BEGIN { printf "%.1f", e - s }'
      return 0
    fi
    if awk -v s="$started" -v e="$now" -v t="$CATCH_UP_S" 'BEGIN { exit !(e - s > t) }'; then
      echo "-"
      return 0
    fi
    sleep 0.05
  done
}

# Counter of the module's INFO section: ratelimit_<algorithm>_<what>.
denied_count() { # algorithm
  info_field "$MASTER" ratelimit "ratelimit_$1_denied"
}

# --- runs -------------------------------------------------------------------
RESULTS="$WORK/results" # pipeline id secs ops p50 p95 p99 p999 max us_per_op denied_pct lag_kb catch_up_s
: >"$RESULTS"
LABELS="$WORK/labels" # id|label
: >"$LABELS"

# Reads redis-benchmark's report (its default, non-CSV output): the summary
# line of avg/min/p50/p95/p99/max, the throughput, the elapsed seconds, and
# p99.9 from the percentile distribution (its first line at or above 99.9%,
# which redis-benchmark prints as 99.902%; CSV output has no p99.9).
parse_report() { # file
  tr '\r' '\n' <"$1" | awk '
    /requests completed in/ { secs = $(NF - 1) }
    /^Latency by percentile distribution/ { in_dist = 1; next }
    in_dist && /^[0-9.]+% <=/ {
      pct = $1; sub(/%/, "", pct)
      if (p999 == "" && pct + 0 >= 99.9) p999 = $3
      next
    }
    in_dist { in_dist = 0 }
    /throughput summary:/ { ops = $3 }
    /avg +min +p50 +p95 +p99 +max/ { getline; p50 = $3; p95 = $4; p99 = $5; max = $6 }
    END {
      if (ops == "" || p50 == "") { print "none"; exit }
      if (p999 == "") p999 = "-"
      printf "%s %s %s %s %s %s %s\n", secs, ops, p50, p95, p99, p999, max
    }'
}

# id is p<pipeline>-<algorithm as INFO ratelimit names it, or incr>.
run_load() { # pipeline id label requests command...
  local pipeline="$1" id="$2" label="$3" requests="$4" algorithm="${2#*-}"
  local cpu_before cpu_after rc report us lag_kb catch_up denied_before denied_pct
  shift 4
  echo "$id|$label" >>"$LABELS"
  cpu_before="$(cpu_seconds "$MASTER")"
  denied_before="$(denied_count "$algorithm")"
  log "-P $pipeline: $label, $requests requests"
  rc=0
  timeout "$RUN_TIMEOUT_S" redis-benchmark -h 127.0.0.1 -p "$MASTER" -c "$CLIENTS" -P "$pipeline" \
    -r "$KEYSPACE" -n "$requests" --precision 3 "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
  cpu_after="$(cpu_seconds "$MASTER")"
  lag_kb=$(($(replica_lag) / 1024))
  # The next run starts with the replica idle, as this one did.
  catch_up="$(wait_caught_up)"
  denied_pct="-"
  if [ -n "$denied_before" ]; then
    denied_pct="$(awk -v a="$(denied_count "$algorithm")" -v b="$denied_before" -v n="$requests" 'BEGIN { printf "%.0f%%", (a - b) * 100 / n }')"
  fi
  # redis-benchmark 7 stops at the first error reply and exits 1: then
  # there is no figure to report.
  [ "$rc" -eq 0 ] ||
    log "  redis-benchmark exit $rc: $(tr '\r' '\n' <"$WORK/err" | grep -v '^WARNING' | grep . | tail -n 1)"
  report="$(parse_report "$WORK/out")"
  if [ "$rc" -ne 0 ] || [ "$report" = "none" ]; then
    echo "$pipeline $id - - - - - - - - $denied_pct $lag_kb $catch_up" >>"$RESULTS"
    return 0
  fi
  us="$(awk -v a="$cpu_after" -v b="$cpu_before" -v n="$requests" 'BEGIN { printf "%.2f", (a - b) * 1e6 / n }')"
  echo "$pipeline $id $report $us $denied_pct $lag_kb $catch_up" >>"$RESULTS"
  log "  $(echo "$report" | awk '{ printf "%.0f ops/s in %s s, p50 %s p99 %s max %s ms", $2, $1, $3, $5, $7 }');" \
    "replica $lag_kb KB behind at the end, caught up in $catch_up s"
}

# The workloads, with limiter parameters under which no key expires during
# the section (refills of 1 per 10 minutes, windows of 10 minutes or a day),
# so that no run pays for expiries. The pass without pipelining reuses the
# keys of the first (the buckets stay far from empty), except the sliding
# log's.
run_pass() { # pipeline requests
  local pipeline="$1" requests="$2" sliding_limit
  # The sliding log admits about half of its calls: its limit is half the
  # calls each of its keys receives in the pass, so the run mixes admissions
  # (propagated) and denials (not propagated).
  sliding_limit=$((requests / KEYSPACE / 2))
  [ "$sliding_limit" -ge 1 ] || sliding_limit=1
  run_load "$pipeline" "p$pipeline-incr" "INCR key:r" "$requests" \
    INCR "key:__rand_int__"
  run_load "$pipeline" "p$pipeline-tokenbucket" "RL.TOKENBUCKET tb:r 1000 1 600000" "$requests" \
    RL.TOKENBUCKET "tb:__rand_int__" 1000 1 600000
  run_load "$pipeline" "p$pipeline-sliding" "RL.SLIDING sl:r $sliding_limit 600000" "$requests" \
    RL.SLIDING "sl$pipeline:__rand_int__" "$sliding_limit" 600000
  run_load "$pipeline" "p$pipeline-all" "RL.ALL 2 (token bucket + fixed window)" "$requests" \
    RL.ALL 2 "au:__rand_int__" "ag:__rand_int__" TOKENBUCKET 1000 1 600000 FIXEDWINDOW 1000000 86400000
}

# --- main -------------------------------------------------------------------
started_at="$(date +%s)"
start_server master --repl-diskless-sync-delay 0
MASTER="$STARTED_PORT"
start_server replica --replicaof 127.0.0.1 "$MASTER"
REPLICA="$STARTED_PORT"
log "master on 127.0.0.1:$MASTER, replica on 127.0.0.1:$REPLICA"
wait_for_link

run_pass "$PIPELINE" "$N_PIPELINED"
if [ "$N_SINGLE" -gt 0 ]; then run_pass 1 "$N_SINGLE"; fi
# 1: admitted calls went to the replica with the master's time pinned, the
# form measured here.
pinned="$(info_field "$MASTER" ratelimit ratelimit_propagation_pinned)"

echo "sustained load with a replica: master + 1 replica, both with the module, on this machine;" \
  "redis-benchmark -c $CLIENTS -r $KEYSPACE"
awk -v labels="$LABELS" -v n16="$N_PIPELINED" -v n1="$N_SINGLE" '
  BEGIN { FS = "|"; while ((getline line < labels) > 0) { split(line, f, "|"); label[f[1]] = f[2] }; FS = " " }
  { row[++n] = $0; ops[$2] = $4 }
  END {
    header = sprintf("%-40s %5s %8s %7s %6s %6s %6s %6s %7s %6s %6s %7s %6s", "command", "secs", "ops/s", "vs INCR",
      "p50", "p95", "p99", "p99.9", "max", "us/op", "denied", "lag KB", "catch")
    last = ""
    for (i = 1; i <= n; i++) {
      split(row[i], f, " ")
      if (f[1] != last) {
        printf "\n-P %s, %d requests per run (latency in ms)\n%s\n", f[1], f[1] == 1 ? n1 : n16, header
        last = f[1]
      }
      id = f[2]; base = "p" f[1] "-incr"
      if (f[4] == "-") { printf "%-40s %5s %8s %7s %42s %6s %7s %6s\n", label[id], "-", "-", "-", "", f[11], f[12], f[13]; continue }
      vs = (ops[base] != "-" && ops[base] > 0) ? sprintf("%.2fx", f[4] / ops[base]) : "-"
      printf "%-40s %5.1f %8.0f %7s %6.3f %6.3f %6.3f %6s %7.3f %6.2f %6s %7d %6s\n",
        label[id], f[3], f[4], vs, f[5], f[6], f[7], f[8], f[9], f[10], f[11], f[12], f[13]
    }
  }' "$RESULTS"
echo
echo "module propagation pinned on the master: ${pinned:-?}"
echo "load took $(($(date +%s) - started_at)) s"
exit 0
