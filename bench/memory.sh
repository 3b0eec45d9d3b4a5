#!/usr/bin/env bash
# Memory per key of a rate limiter, all included (key, value, expiry, the
# keyspace's and the expires dict's share), as the used_memory delta over
# BENCH_KEYS distinct keys. Run by scripts/bench.sh; usable alone against any
# server that has the ratelimit module loaded (it FLUSHALLs it):
#
#   bench/memory.sh PORT
#
# Prints one table row per variant. Each variant is measured twice: after one
# call per key, then after a second call per key (the state a limiter hit
# repeatedly keeps: the Lua bucket then stores a fractional token count).
# Refill and window parameters are chosen so that no key expires while it is
# measured; the size of the state does not depend on them.
set -euo pipefail

PORT="${1:?usage: bench/memory.sh PORT}"
KEYS="${BENCH_KEYS:-100000}"
BENCH_DIR="$(cd "$(dirname "$0")" && pwd)"

cli() { redis-cli -h 127.0.0.1 -p "$PORT" "$@"; }

info_field() { # section field
  cli INFO "$1" | tr -d '\r' | awk -F: -v f="$2" '$1 == f { print $2; exit }'
}

# Waits until used_memory stops moving (incremental rehashing of the keyspace
# dicts finishes in serverCron) and prints it.
settled_used_memory() {
  local previous current tries=0
  previous="$(info_field memory used_memory)"
  while :; do
    sleep 0.2
    current="$(info_field memory used_memory)"
    tries=$((tries + 1))
    if [ "$current" = "$previous" ] || [ "$tries" -ge 25 ]; then
      echo "$current"
      return
    fi
    previous="$current"
  done
}

flush_and_settle() {
  cli FLUSHALL SYNC >/dev/null
  local tries=0
  while [ "$(info_field memory lazyfree_pending_objects)" != "0" ] && [ "$tries" -lt 100 ]; do
    sleep 0.1
    tries=$((tries + 1))
  done
}

# RESP for one command per key; "{key}" in the template becomes k:NNNNNNNN,
# so every variant uses key names of the same length.
resp_stream() { # template
  awk -v n="$KEYS" -v template="$1" 'BEGIN {
    argc = split(template, word, " ")
    for (i = 0; i < n; i++) {
      key = sprintf("k:%08d", i)
      out = "*" argc "\r\n"
      for (j = 1; j <= argc; j++) {
        arg = (word[j] == "{key}") ? key : word[j]
        out = out "$" length(arg) "\r\n" arg "\r\n"
      }
      printf "%s", out
    }
  }'
}

load_keys() { # template; fails unless every reply was a success
  local report
  report="$(resp_stream "$1" | cli --pipe 2>&1 | tail -n 1)"
  case "$report" in
    "errors: 0, replies: $KEYS") return 0 ;;
    *) echo "memory: '$1': $report" >&2; return 1 ;;
  esac
}

# Fixed windows are aligned to the epoch: keys created just before a boundary
# would expire while being measured, so start early in a window.
wait_for_fresh_window() { # window_ms
  local now_ms into_window_ms
  now_ms="$(cli TIME | awk 'NR == 1 { s = $1 } NR == 2 { printf "%.0f", s * 1000 + int($1 / 1000) }')"
  into_window_ms=$((now_ms % $1))
  if [ $(($1 - into_window_ms)) -lt 20000 ]; then
    sleep "$(awk -v ms=$(($1 - into_window_ms + 200)) 'BEGIN { printf "%.3f", ms / 1000 }')"
  fi
}

# Prints "bytes_after_1_call bytes_after_2_calls memory_usage_of_one_key".
measure() { # template [window_ms]
  local attempt before first first_keys second sample
  for attempt in 1 2 3; do
    flush_and_settle
    [ -n "${2:-}" ] && wait_for_fresh_window "$2"
    before="$(settled_used_memory)"
    load_keys "$1" || return 1
    first="$(settled_used_memory)"
    first_keys="$(cli DBSIZE)"
    load_keys "$1" || return 1
    second="$(settled_used_memory)"
    if [ "$first_keys" = "$KEYS" ] && [ "$(cli DBSIZE)" = "$KEYS" ]; then
      sample="$(cli MEMORY USAGE k:00000000)"
      echo "$((first - before)) $((second - before)) $sample"
      return 0
    fi
    echo "memory: '$1': keys expired during attempt $attempt, retrying" >&2
  done
  return 1
}

has_command() { cli COMMAND INFO "$1" | grep -qi "$1"; }

lua_sha="$(cli SCRIPT LOAD "$(cat "$BENCH_DIR/lua/token_bucket.lua")")"

# name|template|window_ms (for windows aligned to the epoch)|target ratio vs (a)
variants=(
  "(a) SET k 12345678 PX 3600000|SET {key} 12345678 PX 3600000||"
  "(b) RL.TOKENBUCKET k 100 1 60000|RL.TOKENBUCKET {key} 100 1 60000||1.1"
  "(c) Lua token bucket (hash)|EVALSHA $lua_sha 1 {key} 100 1 60000||"
  "(d) RL.FIXEDWINDOW k 100 60000|RL.FIXEDWINDOW {key} 100 60000|60000|"
)
if has_command CL.THROTTLE; then
  # max_burst 99 = capacity 100; 1 per 60 s, like (b).
  variants+=("(e) redis-cell CL.THROTTLE k 99 1 60|CL.THROTTLE {key} 99 1 60||")
fi

printf '%-36s %12s %12s %12s %10s  %s\n' "variant ($KEYS keys)" "B/key 1call" "B/key 2calls" "MEMORY USAGE" "vs (a)" "target"
baseline=""
for variant in "${variants[@]}"; do
  IFS='|' read -r name template window target <<<"$variant"
  if ! result="$(measure "$template" "$window")"; then
    printf '%-36s %12s\n' "$name" "failed"
    continue
  fi
  read -r first second sample <<<"$result"
  [ -z "$baseline" ] && baseline="$second"
  awk -v name="$name" -v keys="$KEYS" -v first="$first" -v second="$second" \
    -v sample="$sample" -v base="$baseline" -v target="$target" 'BEGIN {
      worst = (first > second) ? first : second
      ratio = worst / base
      verdict = ""
      if (target != "") verdict = sprintf("<= %.1fx %s", target, (ratio <= target) ? "PASS" : "above")
      line = sprintf("%-36s %12.1f %12.1f %12s %9.2fx  %s", name, first / keys, second / keys, sample, ratio, verdict)
      sub(/ +$/, "", line)
      print line
    }'
done
flush_and_settle
