#!/usr/bin/env bash
# Sustained load with a replica attached: the hardening section of
# `make bench`. Starts its own master (with the module) and a replica of it,
# each a redis-server on a free loopback port, drives the master with
# redis-benchmark from many clients, pipelined and not, for a bounded number
# of requests, and prints throughput and latency percentiles for INCR (the
# baseline) and limiter commands under identical conditions. Then it checks
# the run: no error reply (redis-benchmark stops at the first one; the
# servers' error counters must not move), the replica link stayed up, and
# once the replica has caught up (same replication offset) the replica's
# DEBUG DIGEST equals the master's, and so do DUMP and PEXPIRETIME of a
# sample of keys. A benchmark reports: it exits 0 whatever it finds, but a
# failed check prints a line starting with "LOAD CHECK FAILED".
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
SAMPLE_KEYS=2000  # keys whose DUMP and PEXPIRETIME are compared
CATCH_UP_S=120    # how long the replica may take to catch up after a run

RL_NAME=load
# shellcheck source=../scripts/lib/server.sh
. scripts/lib/server.sh
rl_module
rl_require redis-server redis-cli redis-benchmark awk timeout cmp
rl_workdir
WORK="$RL_WORK"

log() { echo "load: $*" >&2; }

PROBLEMS="$WORK/problems" # one line per failed check
: >"$PROBLEMS"
problem() { echo "$*" >>"$PROBLEMS"; log "PROBLEM: $*"; }

# --- servers ----------------------------------------------------------------
# start_server name [redis-server options...]: sets STARTED_PORT.
start_server() {
  local name="$1"
  shift
  # DEBUG DIGEST needs the debug command, from loopback only.
  rl_start "$WORK/$name" --enable-debug-command local "$@"
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

# Every error reply a server has sent: total_error_replies, and the sums of
# rejected_calls and failed_calls over INFO commandstats.
error_counters() { # port
  {
    cli "$1" INFO stats
    cli "$1" INFO commandstats
  } | tr -d '\r' | awk -F: '
    $1 == "total_error_replies" { errors = $2 }
    /^cmdstat_/ {
      n = split($2, kv, ",")
      for (i = 1; i <= n; i++) {
        split(kv[i], pair, "=")
        if (pair[1] == "rejected_calls") rejected += pair[2]
        if (pair[1] == "failed_calls") failed += pair[2]
      }
    }
    END { printf "%d %d %d\n", errors, rejected, failed }'
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
RESULTS="$WORK/results" # pipeline id secs ops p50 p95 p99 p999 max us_per_op denied_pct lag_kb catch_up_s status
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
  local before after cpu_before cpu_after rc report us status lag_kb catch_up denied_before denied_pct
  shift 4
  echo "$id|$label" >>"$LABELS"
  before="$(error_counters "$MASTER")"
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
  after="$(error_counters "$MASTER")"
  denied_pct="-"
  if [ -n "$denied_before" ]; then
    denied_pct="$(awk -v a="$(denied_count "$algorithm")" -v b="$denied_before" -v n="$requests" 'BEGIN { printf "%.0f%%", (a - b) * 100 / n }')"
  fi
  status="ok"
  if [ "$rc" -ne 0 ]; then
    # redis-benchmark 7 stops at the first error reply and exits 1.
    status="FAILED"
    problem "-P $pipeline $label: redis-benchmark exit $rc: $(tr '\r' '\n' <"$WORK/err" | grep -v '^WARNING' | grep . | tail -n 1)"
  fi
  if [ "$before" != "$after" ]; then
    status="ERRORS"
    problem "-P $pipeline $label: master error counters (error replies, rejected, failed) went from $before to $after"
  fi
  if [ "$catch_up" = "-" ]; then
    status="LAG"
    problem "-P $pipeline $label: the replica was still $(replica_lag) bytes behind ${CATCH_UP_S} s after the run"
  fi
  report="$(parse_report "$WORK/out")"
  if [ "$report" = "none" ]; then
    [ "$status" = "ok" ] && { status="FAILED"; problem "-P $pipeline $label: no report from redis-benchmark"; }
    echo "$pipeline $id - - - - - - - - $denied_pct $lag_kb $catch_up $status" >>"$RESULTS"
    return 0
  fi
  us="$(awk -v a="$cpu_after" -v b="$cpu_before" -v n="$requests" 'BEGIN { printf "%.2f", (a - b) * 1e6 / n }')"
  echo "$pipeline $id $report $us $denied_pct $lag_kb $catch_up $status" >>"$RESULTS"
  log "  $(echo "$report" | awk '{ printf "%.0f ops/s in %s s, p50 %s p99 %s max %s ms", $2, $1, $3, $5, $7 }');" \
    "replica $lag_kb KB behind at the end, caught up in $catch_up s"
}

# The workloads, with limiter parameters under which no key expires during
# the section (refills of 1 per 10 minutes, windows of 10 minutes or a day),
# so that the dataset is still when it is compared. The pass without
# pipelining reuses the keys of the first (the buckets stay far from empty),
# except the sliding log's.
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

# --- checks -----------------------------------------------------------------
# What changes the master's dataset: writes, expirations, evictions.
master_writes() {
  cli "$MASTER" INFO | tr -d '\r' | awk -F: '
    $1 == "rdb_changes_since_last_save" || $1 == "expired_keys" || $1 == "evicted_keys" { printf "%s ", $2 }'
}

# DEBUG DIGEST of both servers (in parallel: it takes seconds per million
# keys), once the replica has processed all the master sent, retried if the
# master's dataset changed meanwhile (the master's periodic PING to its
# replica moves the offset but not the data). Prints "ok master replica
# offset" or "lag bytes" or "moving".
settled_digests() {
  local attempt writes_before writes_after offset m_digest r_digest
  for attempt in 1 2 3; do
    [ "$(wait_caught_up)" != "-" ] || { echo "lag $(replica_lag)"; return 0; }
    writes_before="$(master_writes)"
    offset="$(info_field "$MASTER" replication master_repl_offset)"
    [ "$(replica_lag)" -le 0 ] || continue
    cli "$MASTER" DEBUG DIGEST >"$WORK/digest.master" &
    cli "$REPLICA" DEBUG DIGEST >"$WORK/digest.replica"
    wait $!
    writes_after="$(master_writes)"
    if [ "$writes_before" = "$writes_after" ]; then
      m_digest="$(cat "$WORK/digest.master")"
      r_digest="$(cat "$WORK/digest.replica")"
      echo "ok ${m_digest:-none} ${r_digest:-none} $offset"
      return 0
    fi
    log "the master's dataset changed while digesting (attempt $attempt); again"
  done
  echo "moving"
}

# DUMP and PEXPIRETIME of up to SAMPLE_KEYS keys, on both servers, compared
# (DEBUG DIGEST covers values and which keys expire, not when).
compare_sample() {
  local port
  { cli "$MASTER" --scan || true; } | head -n "$SAMPLE_KEYS" >"$WORK/sample"
  awk '{ print "DUMP " $1; print "PEXPIRETIME " $1 }' "$WORK/sample" >"$WORK/sample.cmds"
  for port in "$MASTER" "$REPLICA"; do
    cli "$port" --no-raw <"$WORK/sample.cmds" >"$WORK/sample.$port"
  done
  SAMPLED="$(wc -l <"$WORK/sample")"
  if [ "$SAMPLED" -eq 0 ]; then
    SAMPLE_MATCH="no keys to compare"
  elif cmp -s "$WORK/sample.$MASTER" "$WORK/sample.$REPLICA"; then
    SAMPLE_MATCH="yes"
  else
    SAMPLE_MATCH="no"
  fi
}

# --- main -------------------------------------------------------------------
started_at="$(date +%s)"
start_server master --repl-diskless-sync-delay 0
MASTER="$STARTED_PORT"
start_server replica --replicaof 127.0.0.1 "$MASTER"
REPLICA="$STARTED_PORT"
log "master on 127.0.0.1:$MASTER, replica on 127.0.0.1:$REPLICA"
wait_for_link
replica_errors_before="$(error_counters "$REPLICA")"
full_syncs_before="$(info_field "$MASTER" stats sync_full)"

run_pass "$PIPELINE" "$N_PIPELINED"
if [ "$N_SINGLE" -gt 0 ]; then run_pass 1 "$N_SINGLE"; fi
load_s=$(($(date +%s) - started_at))

log "comparing the replica with the master"
checks_started_at="$(date +%s)"
settled="$(settled_digests)"
replica_errors_after="$(error_counters "$REPLICA")"
full_syncs_after="$(info_field "$MASTER" stats sync_full)"
# 1: admitted calls went to the replica with the master's time pinned.
pinned="$(info_field "$MASTER" ratelimit ratelimit_propagation_pinned)"
link_status="$(info_field "$REPLICA" replication master_link_status)"
master_keys="$(cli "$MASTER" DBSIZE)"
replica_keys="$(cli "$REPLICA" DBSIZE)"
compare_sample

read -r settled_state m_digest r_digest offset <<<"$settled"
case "$settled_state" in
  ok)
    if [ "$m_digest" = "$r_digest" ] && [ "$m_digest" != "none" ]; then
      digest_line="replica digest matches master: yes ($m_digest at offset $offset)"
    else
      digest_line="replica digest matches master: NO (master $m_digest, replica $r_digest, at offset $offset)"
      problem "DEBUG DIGEST differs with the replica caught up: master $m_digest, replica $r_digest"
    fi
    ;;
  lag)
    digest_line="replica digest matches master: NO (the replica never caught up: still $m_digest bytes behind)"
    problem "the replica did not reach the master's offset (still $m_digest bytes behind)"
    ;;
  *)
    digest_line="replica digest matches master: unknown (the master's dataset kept changing)"
    problem "the master's dataset kept changing after the load; digests not compared"
    ;;
esac
[ "$master_keys" = "$replica_keys" ] || problem "DBSIZE differs: master $master_keys, replica $replica_keys"
[ "$SAMPLE_MATCH" = "yes" ] || problem "DUMP or PEXPIRETIME of the $SAMPLED sampled keys: $SAMPLE_MATCH"
[ "$replica_errors_before" = "$replica_errors_after" ] ||
  problem "replica error counters (error replies, rejected, failed) went from $replica_errors_before to $replica_errors_after"
[ "$link_status" = "up" ] || problem "replica link is $link_status after the load"
[ "$full_syncs_before" = "$full_syncs_after" ] ||
  problem "the replica resynchronised during the load (full syncs $full_syncs_before -> $full_syncs_after)"
if grep -q "sending an error to its master" "$WORK/replica/server.log" 2>/dev/null; then
  problem "the replica's log reports errors sent to its master: $(grep -m1 "sending an error" "$WORK/replica/server.log")"
fi

echo "sustained load with a replica: master + 1 replica, both with the module, on this machine;" \
  "redis-benchmark -c $CLIENTS -r $KEYSPACE"
awk -v labels="$LABELS" -v n16="$N_PIPELINED" -v n1="$N_SINGLE" '
  BEGIN { FS = "|"; while ((getline line < labels) > 0) { split(line, f, "|"); label[f[1]] = f[2] }; FS = " " }
  { row[++n] = $0; ops[$2] = $4 }
  END {
    header = sprintf("%-40s %5s %8s %7s %6s %6s %6s %6s %7s %6s %6s %7s %6s  %s", "command", "secs", "ops/s", "vs INCR",
      "p50", "p95", "p99", "p99.9", "max", "us/op", "denied", "lag KB", "catch", "check")
    last = ""
    for (i = 1; i <= n; i++) {
      split(row[i], f, " ")
      if (f[1] != last) {
        printf "\n-P %s, %d requests per run (latency in ms)\n%s\n", f[1], f[1] == 1 ? n1 : n16, header
        last = f[1]
      }
      id = f[2]; base = "p" f[1] "-incr"
      if (f[4] == "-") { printf "%-40s %5s %8s %7s %42s %6s %7s %6s  %s\n", label[id], "-", "-", "-", "", f[11], f[12], f[13], f[14]; continue }
      vs = (ops[base] != "-" && ops[base] > 0) ? sprintf("%.2fx", f[4] / ops[base]) : "-"
      printf "%-40s %5.1f %8.0f %7s %6.3f %6.3f %6.3f %6s %7.3f %6.2f %6s %7d %6s  %s\n",
        label[id], f[3], f[4], vs, f[5], f[6], f[7], f[8], f[9], f[10], f[11], f[12], f[13], f[14]
    }
  }' "$RESULTS"
echo
if grep -q -e "redis-benchmark exit" -e "error counters" -e "no report" "$PROBLEMS"; then
  echo "error replies: SOME (see LOAD CHECK FAILED below)"
else
  echo "error replies: none (every run completed; error replies, rejected and failed calls unchanged on master and replica)"
fi
echo "module propagation pinned on the master: ${pinned:-?}"
echo "replica link: $link_status, full syncs $full_syncs_before before the load and $full_syncs_after after; keys: master $master_keys, replica $replica_keys"
echo "$digest_line"
echo "DUMP and PEXPIRETIME of $SAMPLED sampled keys identical on the replica: $SAMPLE_MATCH"
echo "load took $load_s s, checks $(($(date +%s) - checks_started_at)) s"
if [ -s "$PROBLEMS" ]; then
  echo
  while IFS= read -r line; do echo "LOAD CHECK FAILED: $line"; done <"$PROBLEMS"
fi
exit 0
