#!/usr/bin/env bash
# The side-by-side benchmark (`make bench`): starts its own redis-server with
# the module on a free loopback port, measures throughput of the RL commands,
# INCR and the Lua scripts they replace (bench/lua/) with redis-benchmark,
# interleaved in rounds, then memory per key and per sliding-log unit
# (bench/memory.sh), then sustained load on a master with a replica attached,
# with latency percentiles and the replica's lag (bench/load.sh, its own two
# servers), then express-rate-limit on rate-limit-redis against the Node
# kit's RLStore (clients/node/bench/stores.mjs, its own server), and prints
# the tables.
# A benchmark reports; it exits 0 whatever the ratios are.
#
#   RL_MODULE=/abs/libredis_ratelimit.so scripts/bench.sh
#
# Knobs: BENCH_ROUNDS (5), BENCH_N (requests per native run, 800000),
# BENCH_N_LUA (per Lua run, 120000; a quarter of it for the hash window, whose
# script is 4x slower), BENCH_KEYS (memory keys, 100000), BENCH_LOG_KEYS
# (sliding-log memory keys, 200), REDIS_CELL (path to a redis-cell .so: adds
# redis-cell's CL.THROTTLE rows, measured on a second server of its own, since
# both modules register CL.THROTTLE), BENCH_LOAD (1; 0 skips the load with a replica),
# BENCH_NODE (1; 0 skips the Node stores; so does a missing `npm ls`), and
# bench/load.sh's own: BENCH_LOAD_N, BENCH_LOAD_N1, BENCH_LOAD_CLIENTS,
# BENCH_LOAD_PIPELINE, BENCH_LOAD_KEYS.
set -euo pipefail

cd "$(dirname "$0")/.."
ROUNDS="${BENCH_ROUNDS:-5}"
N_NATIVE="${BENCH_N:-800000}"
N_LUA="${BENCH_N_LUA:-120000}"
CELL="${REDIS_CELL:-}"
LOAD="${BENCH_LOAD:-1}"
PIPELINE=16
CLIENTS=50
KEYSPACE=100000

RL_NAME=bench
# shellcheck source=lib/server.sh
. scripts/lib/server.sh
rl_module
MODULE="$RL_MODULE_PATH"
rl_require redis-server redis-cli redis-benchmark awk
[ -n "$CELL" ] && [ ! -f "$CELL" ] && { echo "bench: REDIS_CELL=$CELL not found, skipping it" >&2; CELL=""; }

rl_workdir
WORK="$RL_WORK"

log() { echo "bench: $*" >&2; }

# --- server -----------------------------------------------------------------
# The floor (bench/floor, which `make bench` builds): the minimal module
# command on a limiter's key path, loaded beside the module.
FLOOR="${RL_FLOOR:-$RL_ROOT/target/release/libratelimit_bench_floor.so}"
[ -f "$FLOOR" ] || { echo "bench: no floor module at $FLOOR (make bench builds it: cargo build --release -p ratelimit-bench-floor), skipping its rows" >&2; FLOOR=""; }

start_server() {
  if [ -n "$FLOOR" ]; then rl_start "$WORK/server" --loadmodule "$FLOOR"; else rl_start "$WORK/server"; fi
  PORT="$RL_PORT"
  SERVER_PID="$RL_PID"
  CELL_PORT=""
  if [ -n "$CELL" ]; then
    # redis-cell alone: it and this module both register CL.THROTTLE.
    RL_MODULE_PATH="$CELL" rl_start "$WORK/cell"
    CELL_PORT="$RL_PORT"
    CELL_PID="$RL_PID"
  fi
}

cli() { redis-cli -h 127.0.0.1 -p "$PORT" "$@"; }

# The server a workload runs on: redis-cell's for the ids starting rc_.
port_of() { # id
  case "$1" in rc_*) echo "$CELL_PORT" ;; *) echo "$PORT" ;; esac
}

server_cpu_seconds() { # port
  redis-cli -h 127.0.0.1 -p "$1" INFO cpu | tr -d '\r' | awk -F: '$1 == "used_cpu_user" || $1 == "used_cpu_sys" { s += $2 } END { printf "%.6f", s }'
}

# --- throughput -------------------------------------------------------------
# One workload per line: id|label|requests per run|command (with __rand_int__)
WORKLOADS="$WORK/workloads"
RESULTS="$WORK/results" # round id ops_per_s server_us_per_op

add_workload() { echo "$1|$2|$3|$4" >>"$WORKLOADS"; }

# A command that answers an error once would answer it N times: leave it out.
answers_ok() { # port command words...
  local reply port="$1"
  shift
  reply="$(redis-cli -h 127.0.0.1 -p "$port" "${@//__rand_int__/smoke}" 2>&1)" || return 1
  case "$reply" in ERR* | WRONGTYPE* | NOSCRIPT* | *"(error)"*) log "'$*' answers: $reply"; return 1 ;; esac
}

run_once() { # round id requests command...
  local round="$1" id="$2" requests="$3" cpu_before cpu_after csv ops port
  shift 3
  port="$(port_of "$id")"
  cpu_before="$(server_cpu_seconds "$port")"
  csv="$(redis-benchmark -h 127.0.0.1 -p "$port" -P "$PIPELINE" -c "$CLIENTS" -r "$KEYSPACE" \
    -n "$requests" --csv "$@")"
  cpu_after="$(server_cpu_seconds "$port")"
  ops="$(echo "$csv" | awk -F'","' 'NR == 2 { print $2 }')"
  [ -n "$ops" ] || { log "no result for '$*'"; return 0; }
  awk -v r="$round" -v id="$id" -v ops="$ops" -v a="$cpu_after" -v b="$cpu_before" -v n="$requests" \
    'BEGIN { printf "%s %s %s %.3f\n", r, id, ops, (a - b) * 1e6 / n }' >>"$RESULTS"
  log "round $round: $(printf '%-16s' "$id") $ops ops/s"
}

run_workloads() {
  local count round shift_by i line id label requests cmd
  local lines=()
  mapfile -t lines <"$WORKLOADS"
  count="${#lines[@]}"
  # Warm-up (not recorded): creates the keys, warms Lua and the allocator.
  for line in "${lines[@]}"; do
    IFS='|' read -r id label requests cmd <<<"$line"
    read -ra words <<<"$cmd"
    redis-benchmark -h 127.0.0.1 -p "$(port_of "$id")" -P "$PIPELINE" -c "$CLIENTS" -r "$KEYSPACE" \
      -n $((requests / 5)) --csv "${words[@]}" >/dev/null
  done
  # Interleaved rounds, each starting at another workload, so that drift in
  # machine speed hits every workload alike.
  for round in $(seq "$ROUNDS"); do
    shift_by=$(((round - 1) % count))
    for i in $(seq 0 $((count - 1))); do
      line="${lines[$(((i + shift_by) % count))]}"
      IFS='|' read -r id label requests cmd <<<"$line"
      read -ra words <<<"$cmd"
      # The deny-log pair: the same denials with the log off, then on.
      if [ "$id" = "denied_nolog" ]; then cli CONFIG SET ratelimit.log-max-len 0 >/dev/null; fi
      run_once "$round" "$id" "$requests" "${words[@]}"
      if [ "$id" = "denied_nolog" ]; then cli CONFIG SET ratelimit.log-max-len 128 >/dev/null; fi
    done
  done
}

# Medians over rounds; ratios are medians of the per-round ratios (both sides
# measured minutes apart at most, in the same server).
throughput_table() {
  awk -v workloads="$WORKLOADS" '
    function median(list,    n, v, i, j, t) {
      n = split(list, v, " ")
      for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
      if (n == 0) return ""
      return (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    function ratio(a, b,    r, list) {
      list = ""
      for (r in rounds) if ((r, a) in ops && (r, b) in ops) list = list " " ops[r, a] / ops[r, b]
      return median(list)
    }
    # The same ratio from server CPU per call (b costs / a costs): what the
    # server alone would sustain, less sensitive to a busy client or machine.
    function cpu_ratio(a, b,    r, list) {
      list = ""
      for (r in rounds) if ((r, a) in us && (r, b) in us && us[r, a] > 0) list = list " " us[r, b] / us[r, a]
      return median(list)
    }
    function ratio_row(label, a, b, target, unit,    m, c, verdict, line) {
      m = ratio(a, b)
      if (m == "") { printf "%-46s %12s\n", label, "n/a"; return }
      c = cpu_ratio(a, b)
      verdict = ""
      if (target != "") verdict = sprintf(">= %s%s %s", target, unit, (m + 0 >= target + 0) ? "PASS" : "below")
      line = sprintf("%-46s %11.2fx %13.2fx  %s", label, m, c, verdict)
      sub(/ +$/, "", line)
      print line
    }
    BEGIN { FS = "|"; while ((getline line < workloads) > 0) { split(line, f, "|"); order[++k] = f[1]; label[f[1]] = f[2] }; FS = " " }
    { rounds[$1] = 1; ops[$1, $2] = $3; us[$1, $2] = $4; list_ops[$2] = list_ops[$2] " " $3; list_us[$2] = list_us[$2] " " $4 }
    END {
      printf "%-46s %12s %14s\n", "command (median over rounds)", "ops/s", "server us/op"
      for (i = 1; i <= k; i++) {
        id = order[i]
        if (!(id in list_ops)) { printf "%-46s %12s\n", label[id], "skipped"; continue }
        printf "%-46s %12.0f %14.2f\n", label[id], median(list_ops[id]), median(list_us[id])
      }
      printf "\n%-46s %12s %14s  %s\n", "ratio (median of per-round ratios)", "by ops/s", "by server CPU", "target (ops/s)"
      ratio_row("FLOOR.HIT (module API floor) / SET PX 60000", "floor", "setpx", "", "")
      ratio_row("SET PX 60000 / INCR (reference)", "setpx", "incr", "", "")
      ratio_row("RL.TOKENBUCKET (live) / SET PX 60000", "tokenbucket", "setpx", "1.1", "x")
      ratio_row("RL.TOKENBUCKET (churn) / SET PX 1", "tokenchurn", "setpx1", "1.0", "x")
      ratio_row("RL.FIXEDWINDOW / SET PX 60000", "fixedwindow", "setpx", "1.1", "x")
      ratio_row("RL.LEAKYBUCKET / SET PX 60000", "leakybucket", "setpx", "1.1", "x")
      ratio_row("RL.SLIDING / SET PX 60000", "sliding", "setpx", "1.1", "x")
      ratio_row("RL.HASHWINDOW / SET PX 60000", "hashwindow", "setpx", "1.1", "x")
      ratio_row("RL.QUOTA / SET PX 60000", "quota", "setpx", "1.1", "x")
      ratio_row("RL.CONCURRENCY / SET PX 60000", "concurrency", "setpx", "0.9", "x")
      ratio_row("RL.ALL, two limiters / SET PX 60000", "all2", "setpx", "0.7", "x")
      # The binding targets (SPEC, Performance): ratios to the floor.
      ratio_row("RL.TOKENBUCKET (live) / FLOOR.HIT", "tokenbucket", "floor", "0.95", "x")
      ratio_row("RL.FIXEDWINDOW / FLOOR.HIT", "fixedwindow", "floor", "0.95", "x")
      ratio_row("RL.LEAKYBUCKET / FLOOR.HIT", "leakybucket", "floor", "0.95", "x")
      ratio_row("RL.SLIDING / FLOOR.HIT", "sliding", "floor", "0.9", "x")
      ratio_row("RL.HASHWINDOW / FLOOR.HIT", "hashwindow", "floor", "0.9", "x")
      ratio_row("RL.QUOTA / FLOOR.HIT", "quota", "floor", "0.95", "x")
      ratio_row("RL.HIT / FLOOR.HIT", "hit", "floor", "0.95", "x")
      ratio_row("RL.CONCURRENCY / FLOOR.HIT", "concurrency", "floor", "0.8", "x")
      ratio_row("RL.ALL, two limiters / FLOOR.HIT", "all2", "floor", "0.5", "x")
      ratio_row("RL.HIT / RL.TOKENBUCKET (live)", "hit", "tokenbucket", "", "")
      ratio_row("RL.HIT adaptive / RL.HIT plain", "hitadapt", "hit", "0.95", "x")
      ratio_row("RL.OUTCOME / INCR", "outcome", "incr", "", "")
      ratio_row("denials, deny log on / off", "denied_log", "denied_nolog", "", "")
      ratio_row("RL.TOKENBUCKET / Lua, live keys", "tokenbucket", "lua", "5", "x")
      ratio_row("RL.TOKENBUCKET / Lua, churning keys", "tokenchurn", "luachurn", "5", "x")
      ratio_row("RL.SLIDING / Lua sorted-set log", "sliding", "lualog", "5", "x")
      ratio_row("RL.HASHWINDOW / Lua hash window", "hashwindow", "luahash", "5", "x")
      ratio_row("CL.THROTTLE (live) / INCR", "throttle", "incr", "", "")
      ratio_row("CL.THROTTLE (churn) / INCR", "throttlechurn", "incr", "", "")
      ratio_row("CL.THROTTLE / RL.TOKENBUCKET, live keys", "throttle", "tokenbucket", "", "")
      ratio_row("CL.THROTTLE / RL.TOKENBUCKET, churning keys", "throttlechurn", "tokenchurn", "", "")
      if ("rc_live" in list_ops) {
        # Across two servers (redis-cell cannot share one with this module).
        ratio_row("redis-cell CL.THROTTLE (live) / INCR", "rc_live", "incr", "", "")
        ratio_row("RL.TOKENBUCKET / redis-cell, live keys", "tokenbucket", "rc_live", "1.8", "x")
        ratio_row("RL.TOKENBUCKET / redis-cell, churning keys", "tokenchurn", "rc_churn", "1.4", "x")
        ratio_row("CL.THROTTLE / redis-cell, live keys", "throttle", "rc_live", "1.8", "x")
        ratio_row("CL.THROTTLE / redis-cell, churning keys", "throttlechurn", "rc_churn", "1.4", "x")
      }
    }' "$RESULTS"
}

# --- main -------------------------------------------------------------------
# What is measured, read before the server loads the module.
head="$(git rev-parse --short HEAD 2>/dev/null || echo "none")"
built="$(date -u -r "$MODULE" '+%Y-%m-%d %H:%M UTC')"
server_version="$(redis-server --version | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^v=|^malloc=/) { printf "%s%s", sep, $i; sep = " " } }')"
started_at="$(date +%s)"
loadavg_at_start="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo "?")"
start_server
log "redis-server pid $SERVER_PID on 127.0.0.1:$PORT"

LUA_SHA="$(cli SCRIPT LOAD "$(cat bench/lua/token_bucket.lua)")"
LOG_SHA="$(cli SCRIPT LOAD "$(cat bench/lua/sliding_log.lua)")"
HASH_SHA="$(cli SCRIPT LOAD "$(cat bench/lua/hash_window.lua)")"
# RL.HIT's policy: the live token bucket's parameters.
cli RL.POLICY SET bench-tb TOKENBUCKET 1000 1 1000 >/dev/null
# The same rule with the protection loop on (ADAPT and STAGES, 10 s
# windows): what counting calls in the policy's window and checking for its
# end adds to RL.HIT. Outcomes arrive as RL.OUTCOME, measured on its own.
cli RL.POLICY SET bench-adapt TOKENBUCKET 1000 1 1000 ADAPT ERRORS 5 STAGES 30 50 >/dev/null
: >"$WORKLOADS"
: >"$RESULTS"
add_workload incr "INCR key:r" "$N_NATIVE" "INCR key:__rand_int__"
# The baselines (SPEC, Performance): the cheapest write with a TTL, on keys
# still live when called again (PX 60000) and on keys expired and created
# again (PX 1, "churn"); and the floor of a module command on that path.
add_workload setpx "SET k v PX 60000 (live)" "$N_NATIVE" "SET px:__rand_int__ 12345678 PX 60000"
add_workload setpx1 "SET k v PX 1 (churn)" "$N_NATIVE" "SET p1:__rand_int__ 12345678 PX 1"
[ -n "$FLOOR" ] && add_workload floor "FLOOR.HIT fl:r 60000 (the module API's floor)" "$N_NATIVE" "FLOOR.HIT fl:__rand_int__ 60000"
# Two token-bucket regimes. "live": 1 token/s, so a key touched every ~0.4 s
# is never idle and its state is updated in place. "churn": 10 tokens/s, so
# the key is idle (full, expired) by the next call and is created again each
# time, which INCR never has to do.
add_workload tokenbucket "RL.TOKENBUCKET tb:r 1000 1 1000 (live)" "$N_NATIVE" "RL.TOKENBUCKET tb:__rand_int__ 1000 1 1000"
add_workload tokenchurn "RL.TOKENBUCKET tc:r 100 10 1000 (churn)" "$N_NATIVE" "RL.TOKENBUCKET tc:__rand_int__ 100 10 1000"
add_workload fixedwindow "RL.FIXEDWINDOW fw:r 100 60000" "$N_NATIVE" "RL.FIXEDWINDOW fw:__rand_int__ 100 60000"
# A queue of 1000 leaking 1 a second: every call is admitted and waits.
add_workload leakybucket "RL.LEAKYBUCKET lb:r 1000 1 1000" "$N_NATIVE" "RL.LEAKYBUCKET lb:__rand_int__ 1000 1 1000"
# 1000 a minute: every call is admitted, and a key's log holds its calls of
# the last minute (about 8 to 16 with the default request counts).
add_workload sliding "RL.SLIDING sl:r 1000 60000" "$N_NATIVE" "RL.SLIDING sl:__rand_int__ 1000 60000"
add_workload hashwindow "RL.HASHWINDOW hw:r 1000 60000 1000" "$N_NATIVE" "RL.HASHWINDOW hw:__rand_int__ 1000 60000 1000"
# A daily quota in a named zone (every call admitted; the zone is read once).
add_workload quota "RL.QUOTA q:r 1000000 DAY TZ America/New_York" "$N_NATIVE" "RL.QUOTA q:__rand_int__ 1000000 DAY TZ America/New_York"
add_workload concurrency "RL.CONCURRENCY cc:r 1000000 60000" "$N_NATIVE" "RL.CONCURRENCY cc:__rand_int__ 1000000 60000"
# Denials (COST above the capacity, so every call is denied and nothing is
# written), with the deny log off and on: what recording a denial costs.
add_workload denied_nolog "RL.TOKENBUCKET denied, deny log off" "$N_NATIVE" "RL.TOKENBUCKET dn:__rand_int__ 5 1 1000 COST 6"
add_workload denied_log "RL.TOKENBUCKET denied, deny log on" "$N_NATIVE" "RL.TOKENBUCKET dl:__rand_int__ 5 1 1000 COST 6"
# The live token bucket through a policy, set before the workloads (FLUSHALL
# keeps policies): what looking up the rule, its mode and roll-out adds.
add_workload hit "RL.HIT bench-tb ht:r (policy 1000 1 1000)" "$N_NATIVE" "RL.HIT bench-tb ht:__rand_int__"
add_workload hitadapt "RL.HIT bench-adapt ha:r (policy + ADAPT + STAGES)" "$N_NATIVE" "RL.HIT bench-adapt ha:__rand_int__"
# A kit's outcome report: one call per policy per second per instance, here
# as fast as the server takes them.
add_workload outcome "RL.OUTCOME bench-adapt 10 0" "$N_NATIVE" "RL.OUTCOME bench-adapt 10 0"
# Two limits in one call: a per-user token bucket and a shared window.
add_workload all2 "RL.ALL 2 (token bucket + fixed window)" "$N_NATIVE" "RL.ALL 2 au:__rand_int__ ag:__rand_int__ TOKENBUCKET 1000 1 1000 FIXEDWINDOW 100000 60000"
add_workload lua "Lua token bucket lua:r 1000 1 1000 (live)" "$N_LUA" "EVALSHA $LUA_SHA 1 lua:__rand_int__ 1000 1 1000"
add_workload luachurn "Lua token bucket lc:r 100 10 1000 (churn)" "$N_LUA" "EVALSHA $LUA_SHA 1 lc:__rand_int__ 100 10 1000"
add_workload lualog "Lua sorted-set log ls:r 1000 60000" "$N_LUA" "EVALSHA $LOG_SHA 1 ls:__rand_int__ 1000 60000"
add_workload luahash "Lua hash window lh:r 1000 60000 1000" $((N_LUA / 4)) "EVALSHA $HASH_SHA 1 lh:__rand_int__ 1000 60000 1000"
# This module's CL.THROTTLE with the token buckets' parameters (capacity
# 1000, 1 a second: live; capacity 100, 10 a second: churn), and, with
# REDIS_CELL, redis-cell's on its own server.
add_workload throttle "CL.THROTTLE th:r 999 1 1 (live)" "$N_NATIVE" "CL.THROTTLE th:__rand_int__ 999 1 1"
add_workload throttlechurn "CL.THROTTLE tx:r 99 10 1 (churn)" "$N_NATIVE" "CL.THROTTLE tx:__rand_int__ 99 10 1"
if [ -n "$CELL" ]; then
  add_workload rc_live "redis-cell CL.THROTTLE cl:r 999 1 1 (live)" "$N_NATIVE" "CL.THROTTLE cl:__rand_int__ 999 1 1"
  add_workload rc_churn "redis-cell CL.THROTTLE cc:r 99 10 1 (churn)" "$N_NATIVE" "CL.THROTTLE cc:__rand_int__ 99 10 1"
fi

# Keep only the workloads whose command works here.
mapfile -t candidates <"$WORKLOADS"
: >"$WORKLOADS"
: >"$WORK/skipped"
for line in "${candidates[@]}"; do
  IFS='|' read -r id label requests cmd <<<"$line"
  read -ra words <<<"$cmd"
  if answers_ok "$(port_of "$id")" "${words[@]}"; then echo "$line" >>"$WORKLOADS"; else echo "$label" >>"$WORK/skipped"; fi
done
cli FLUSHALL SYNC >/dev/null
[ -n "$CELL_PORT" ] && redis-cli -h 127.0.0.1 -p "$CELL_PORT" FLUSHALL SYNC >/dev/null

run_workloads
cli FLUSHALL SYNC >/dev/null
log "measuring memory per key"
memory_table="$(bench/memory.sh "$PORT" $CELL_PORT)" || memory_table="memory: bench/memory.sh failed"

node_table=""
if [ "${BENCH_NODE:-1}" != "0" ]; then
  if npm ls --prefix clients/node --depth=0 >/dev/null 2>&1; then
    log "express-rate-limit stores (clients/node/bench/stores.mjs; BENCH_NODE=0 skips it)"
    node_table="$(cd clients/node && npm run --silent build >&2 && RL_MODULE="$MODULE" node bench/stores.mjs)" ||
      node_table="node: clients/node/bench/stores.mjs failed"
  else
    node_table="node: skipped, the Node kit's dependencies are not installed (scripts/setup.sh)"
  fi
fi

load_table=""
if [ "$LOAD" != "0" ]; then
  # The load section starts its own master and replica: stop this server
  # first, so that it takes no CPU or memory from them.
  rl_stop "$SERVER_PID"
  [ -n "$CELL_PORT" ] && rl_stop "$CELL_PID"
  log "sustained load with a replica (bench/load.sh; BENCH_LOAD=0 skips it)"
  load_table="$(RL_MODULE="$MODULE" bench/load.sh)" || load_table="load: bench/load.sh failed"
fi

echo
echo "redis-ratelimit benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "server: redis-server ${server_version}; nproc $(nproc);" \
  "load average $loadavg_at_start at start, $(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo "?") at end"
echo "module: $(basename "$MODULE") built $built (HEAD $head)${CELL:+; redis-cell $(basename "$CELL")}"
echo "load:   redis-benchmark -P $PIPELINE -c $CLIENTS -r $KEYSPACE; $ROUNDS interleaved rounds;" \
  "-n $N_NATIVE per native run, $N_LUA per Lua run ($((N_LUA / 4)) for the hash window)"
echo
throughput_table
if [ -s "$WORK/skipped" ]; then
  echo "skipped (command failed its smoke test): $(paste -sd, "$WORK/skipped")"
fi
echo
echo "$memory_table"
echo
if [ -n "$load_table" ]; then
  echo "$load_table"
  echo
fi
if [ -n "$node_table" ]; then
  echo "$node_table"
  echo
fi
echo "bench took $(($(date +%s) - started_at)) s"
exit 0
