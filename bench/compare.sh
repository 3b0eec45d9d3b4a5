#!/usr/bin/env bash
# Two builds of the module side by side (`make bench-compare BEFORE=...`):
# the same workloads on two redis-servers, one per build, in interleaved
# rounds, and, where valgrind is installed, the instructions the server
# spends per call under callgrind, which do not depend on what else the
# machine is doing. It prints, per command, each build's median and the
# median of the per-round ratios after / before. A benchmark reports; it
# exits 0 whatever the ratios are.
#
#   RL_MODULE_BEFORE=/abs/old.so RL_MODULE=/abs/new.so bench/compare.sh
#
# Knobs: COMPARE_ROUNDS (5), COMPARE_N (requests per run, 300000),
# COMPARE_CALLS (calls per command under callgrind, on 100 live keys, 2000;
# 0 skips it), COMPARE_CACHE_KEYS (keys of the cache simulation, each called
# once to create it and once measured, 20000; 0 skips it).
set -euo pipefail

cd "$(dirname "$0")/.."
ROUNDS="${COMPARE_ROUNDS:-5}"
N="${COMPARE_N:-300000}"
CALLS="${COMPARE_CALLS:-2000}"
CACHE_KEYS="${COMPARE_CACHE_KEYS:-3000}"
BEFORE="${RL_MODULE_BEFORE:-}"

RL_NAME=compare
# shellcheck source=../scripts/lib/server.sh
. scripts/lib/server.sh
rl_module
AFTER="$RL_MODULE_PATH"
[ -n "$BEFORE" ] && [ -f "$BEFORE" ] || rl_die "set RL_MODULE_BEFORE to the other build's .so"
rl_require redis-server redis-cli redis-benchmark awk
rl_workdir
WORK="$RL_WORK"
log() { echo "compare: $*" >&2; }

# The workloads: id|command (redis-benchmark's __rand_int__ for keys). Live
# keys: every key is touched again long before it goes idle.
WORKLOADS=(
  "incr|INCR key:__rand_int__"
  "tokenbucket|RL.TOKENBUCKET tb:__rand_int__ 1000 1 1000"
  "fixedwindow|RL.FIXEDWINDOW fw:__rand_int__ 1000000 60000"
  "leakybucket|RL.LEAKYBUCKET lb:__rand_int__ 1000000 1 1"
  "sliding|RL.SLIDING sl:__rand_int__ 1000 60000"
  "hashwindow|RL.HASHWINDOW hw:__rand_int__ 1000000 60000 1000"
  "hit|RL.HIT bench-tb hit:__rand_int__"
  "all2|RL.ALL 2 {u:__rand_int__}a {u:__rand_int__}b TOKENBUCKET 1000 1 1000 FIXEDWINDOW 1000000 60000"
)

start() { # name module -> sets PORT_<name>
  local name="$1" module="$2"
  # rl_options loads the module at RL_MODULE_PATH: each side its own.
  RL_MODULE_PATH="$module" rl_start "$WORK/$name"
  redis-cli -p "$RL_PORT" RL.POLICY SET bench-tb TOKENBUCKET 1000 1 1000 >/dev/null
  printf -v "PORT_$name" '%s' "$RL_PORT"
}
start before "$BEFORE"
start after "$AFTER"
log "before: $BEFORE on port $PORT_before"
log "after:  $AFTER on port $PORT_after"

RESULTS="$WORK/results"
: >"$RESULTS"
bench_once() { # port command words...
  local port="$1"
  shift
  redis-benchmark -h 127.0.0.1 -p "$port" -P 16 -c 50 -r 100000 -n "$N" --csv "$@" |
    awk -F'","' 'NR == 2 { print $2 }'
}

# Warm-up: creates the keys in both servers.
for w in "${WORKLOADS[@]}"; do
  read -ra words <<<"${w#*|}"
  for side in before after; do
    port="PORT_$side"
    bench_once "${!port}" "${words[@]}" >/dev/null
  done
done
for round in $(seq "$ROUNDS"); do
  for w in "${WORKLOADS[@]}"; do
    id="${w%%|*}"
    read -ra words <<<"${w#*|}"
    # Alternate which side goes first, round by round.
    if ((round % 2)); then sides=(before after); else sides=(after before); fi
    for side in "${sides[@]}"; do
      port="PORT_$side"
      ops="$(bench_once "${!port}" "${words[@]}")"
      echo "$round $id $side $ops" >>"$RESULTS"
    done
    log "round $round: $id"
  done
done

echo "Throughput: $ROUNDS interleaved rounds of $N requests (redis-benchmark -P 16 -c 50 -r 100000), load average $(cut -d' ' -f1-3 /proc/loadavg)"
awk '
  function median(list,    n, v, i, j, t) {
    n = split(list, v, " ")
    for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
    return (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  { ops[$1, $2, $3] = $4; if (!($2 in seen)) { seen[$2] = 1; order[++k] = $2 }; rounds[$1] = 1 }
  END {
    printf "%-14s %14s %14s %16s\n", "command", "before ops/s", "after ops/s", "after / before"
    for (i = 1; i <= k; i++) {
      id = order[i]; b = ""; a = ""; r = ""
      for (n in rounds) { b = b " " ops[n, id, "before"]; a = a " " ops[n, id, "after"]; r = r " " ops[n, id, "after"] / ops[n, id, "before"] }
      printf "%-14s %14.0f %14.0f %15.3fx\n", id, median(b), median(a), median(r)
    }
  }' "$RESULTS"

# Starts side `side`'s build (before or after) under callgrind in
# $WORK/<folder>, counting inside the module's command dispatcher, with
# callgrind's options after the folder; sets `port`, `pid` and `dir`, and
# fails (logging the server's last lines) if it does not answer.
under_callgrind() {
  local side="$1" folder="$2" module="$BEFORE"
  shift 2
  [ "$side" = after ] && module="$AFTER"
  port="$(rl_free_port)"
  dir="$WORK/$folder"
  mkdir -p "$dir"
  valgrind --tool=callgrind --collect-atstart=no --toggle-collect=RedisModuleCommandDispatcher \
    "$@" --callgrind-out-file="$dir/out.%p" \
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
    --loadmodule "$module" >"$dir/valgrind.log" 2>&1 &
  pid=$!
  RL_PIDS+=("$pid")
  for _ in $(seq 600); do rl_answers "$port" && break; sleep 0.1; done
  if ! rl_answers "$port"; then
    log "the $side server did not start under valgrind; its log:"
    tail -n 5 "$dir/valgrind.log" >&2
    return 1
  fi
}

# Instructions per call under callgrind: each build's server alone, the
# same calls on 100 live keys, counted from a zeroed counter.
if [ "$CALLS" -gt 0 ] && command -v valgrind >/dev/null && command -v callgrind_control >/dev/null; then
  echo
  echo "Instructions per call inside the command's function (callgrind, $CALLS calls on 100 live keys):"
  printf "%-14s %14s %14s %16s\n" "command" "before" "after" "after / before"
  declare -A IR
  for side in before after; do
    # Only what runs inside a command's own function: the module's dispatcher
    # (the module's code and the module API calls it makes), INCR's
    # `incrCommand`; not the event loop, the socket reads and writes, the
    # propagation after the command or serverCron.
    under_callgrind "$side" "cg-$side" --toggle-collect=incrCommand || continue
    redis-cli -p "$port" RL.POLICY SET bench-tb TOKENBUCKET 1000 1 1000 >/dev/null
    for w in "${WORKLOADS[@]}"; do
      id="${w%%|*}"
      cmd="${w#*|}"
      # 100 live keys in turn, each far from its limit: every call is an
      # admission on an existing key. Warm them and the code, then count
      # exactly CALLS calls.
      calls() { for i in $(seq "$1"); do echo "${cmd//__rand_int__/$((i % 100))}"; done; }
      calls 200 | redis-cli -p "$port" >/dev/null
      callgrind_control --zero "$pid" >/dev/null
      calls "$CALLS" | redis-cli -p "$port" >/dev/null
      callgrind_control --dump="$id" "$pid" >/dev/null
      file="$(ls -t "$dir"/out.* | head -1)"
      IR["$side,$id"]="$(awk '/^summary:/ { print $2 }' "$file")"
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  for w in "${WORKLOADS[@]}"; do
    id="${w%%|*}"
    b="${IR[before,$id]:-0}"
    a="${IR[after,$id]:-0}"
    awk -v id="$id" -v b="$b" -v a="$a" -v n="$CALLS" \
      'BEGIN { if (b > 0) printf "%-14s %14.0f %14.0f %15.3fx\n", id, b / n, a / n, a / b }'
  done
fi

# Data cache misses per call over many keys (callgrind's cache simulation,
# deterministic): each key is called nine times, then a tenth, measured,
# each pass in another order, so a key is called after most other keys
# were touched, as a call over a large keyspace finds it. What a state's layout costs in misses,
# which the instruction counts above cannot show.
CACHE_WORKLOADS=(
  "tokenbucket|RL.TOKENBUCKET tb:__rand_int__ 1000 1 1000"
  "sliding|RL.SLIDING sl:__rand_int__ 1000 60000"
  "hashwindow|RL.HASHWINDOW hw:__rand_int__ 1000 60000 1000"
)
if [ "$CACHE_KEYS" -gt 0 ] && command -v valgrind >/dev/null && command -v callgrind_control >/dev/null; then
  echo
  echo "Data cache misses per call inside the command's function (callgrind --cache-sim, $CACHE_KEYS keys each called ten times in shuffled orders, the tenth measured; L1 32 KiB, LL 8 MiB):"
  printf "%-14s %14s %14s %14s %14s\n" "command" "before D1" "after D1" "before LL" "after LL"
  declare -A MISS
  for side in before after; do
    under_callgrind "$side" "cache-$side" --cache-sim=yes --D1=32768,8,64 --LL=8388608,16,64 || continue
    for w in "${CACHE_WORKLOADS[@]}"; do
      id="${w%%|*}"
      cmd="${w#*|}"
      # Created in one shuffled order, measured in another (a fixed seed:
      # both builds see the same orders), so that no key's neighbour in
      # memory is the next one called, as with random keys.
      calls() { seq "$CACHE_KEYS" | shuf --random-source=<(yes "$1") | while read -r i; do echo "${cmd//__rand_int__/$i}"; done; }
      # Nine calls a key first: live keys (a log of 9 entries), where
      # neither build's ring grows on the measured tenth call.
      for pass in $(seq 9); do calls "create-$pass" | redis-cli -p "$port" >/dev/null; done
      callgrind_control --zero "$pid" >/dev/null
      calls measure | redis-cli -p "$port" >/dev/null
      callgrind_control --dump="$id" "$pid" >/dev/null
      file="$(ls -t "$dir"/out.* | head -1)"
      # The summary's events, named by the `events:` line.
      MISS["$side,$id"]="$(awk '/^events:/ { for (i = 2; i <= NF; i++) col[$i] = i - 1 }
        /^summary:/ { printf "%d %d", $(col["D1mr"] + 1) + $(col["D1mw"] + 1), $(col["DLmr"] + 1) + $(col["DLmw"] + 1) }' "$file")"
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  for w in "${CACHE_WORKLOADS[@]}"; do
    id="${w%%|*}"
    read -r bd bl <<<"${MISS[before,$id]:-0 0}"
    read -r ad al <<<"${MISS[after,$id]:-0 0}"
    awk -v id="$id" -v bd="$bd" -v bl="$bl" -v ad="$ad" -v al="$al" -v n="$CACHE_KEYS" \
      'BEGIN { printf "%-14s %14.2f %14.2f %14.2f %14.2f\n", id, bd / n, ad / n, bl / n, al / n }'
  done
fi
