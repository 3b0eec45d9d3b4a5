#!/usr/bin/env bash
# Memory per key of a rate limiter, all included (key, value, expiry, the
# keyspace's and the expires dict's share), as the used_memory delta over
# BENCH_KEYS distinct keys. Run by scripts/bench.sh; usable alone against any
# server that has the ratelimit module loaded (it FLUSHALLs it):
#
#   bench/memory.sh PORT [CELL_PORT]
#
# CELL_PORT: a server with redis-cell loaded (and not this module, since both
# register CL.THROTTLE): adds redis-cell's CL.THROTTLE, measured there.
#
# Prints two tables. Per key: one row per variant, measured after one call
# per key, then (all but the slow Lua hash window) after a second call per key
# (the state a limiter hit repeatedly keeps: the Lua bucket then stores a
# fractional token count). Refill and window parameters are chosen so that no
# key expires while it is measured; the size of the state does not depend on
# them.
# Per held unit of a sliding log: BENCH_LOG_KEYS keys each fed 1,000 calls,
# paced so that a key's calls are at least 1 ms apart and no two of them can
# share a millisecond (the module keeps one entry per millisecond).
set -euo pipefail

PORT="${1:?usage: bench/memory.sh PORT [CELL_PORT]}"
MAIN_PORT="$PORT"
CELL_PORT="${2:-}"
KEYS="${BENCH_KEYS:-100000}"
LOG_KEYS="${BENCH_LOG_KEYS:-200}"
LOG_UNITS=1000
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
# so every variant uses key names of the same length. A template may hold
# several commands separated by " ; ", all sent for each key.
resp_stream() { # template [key count]
  awk -v n="${2:-$KEYS}" -v template="$1" 'BEGIN {
    ncmd = split(template, cmds, " ; ")
    for (i = 0; i < n; i++) {
      key = sprintf("k:%08d", i)
      for (c = 1; c <= ncmd; c++) {
        argc = split(cmds[c], word, " ")
        out = "*" argc "\r\n"
        for (j = 1; j <= argc; j++) {
          arg = (word[j] == "{key}") ? key : word[j]
          out = out "$" length(arg) "\r\n" arg "\r\n"
        }
        printf "%s", out
      }
    }
  }'
}

commands_in() { # template
  awk -v t="$1" 'BEGIN { print split(t, c, " ; ") }'
}

# Sends a RESP stream from stdin; fails unless every reply was a success.
pipe_checked() { # expected_replies label
  local report
  report="$(cli --pipe 2>&1)"
  case "$report" in
    *"errors: 0, replies: $1") return 0 ;;
    *) echo "memory: '$2': ${report##*$'\n'}" >&2; return 1 ;;
  esac
}

load_keys() { # template
  resp_stream "$1" | pipe_checked $((KEYS * $(commands_in "$1"))) "$1"
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

# Prints "bytes_after_1_call bytes_after_2_calls memory_usage_of_one_key";
# with passes 1, the second figure is "-".
measure() { # template [window_ms] [passes]
  local attempt before first first_keys second sample
  for attempt in 1 2 3; do
    flush_and_settle
    [ -n "${2:-}" ] && wait_for_fresh_window "$2"
    before="$(settled_used_memory)"
    load_keys "$1" || return 1
    first="$(settled_used_memory)"
    first_keys="$(cli DBSIZE)"
    if [ "${3:-2}" = 1 ]; then
      second=""
    else
      load_keys "$1" || return 1
      second="$(settled_used_memory)"
    fi
    if [ "$first_keys" = "$KEYS" ] && [ "$(cli DBSIZE)" = "$KEYS" ]; then
      sample="$(cli MEMORY USAGE k:00000000)"
      if [ -n "$second" ]; then second=$((second - before)); else second=-; fi
      echo "$((first - before)) $second $sample"
      return 0
    fi
    echo "memory: '$1': keys expired during attempt $attempt, retrying" >&2
  done
  return 1
}


load_script() { cli SCRIPT LOAD "$(cat "$BENCH_DIR/lua/$1")"; }
lua_sha="$(load_script token_bucket.lua)"
hash_sha="$(load_script hash_window.lua)"
log_sha="$(load_script sliding_log.lua)"

# A Lua hash window in full use: one field per bucket for all 60 buckets of
# the window (what hash_window.lua leaves after a window of steady traffic;
# it never holds more), written directly since the script would need the
# whole window's time to fill it.
full_hash_window() { # limit window_ms bucket_ms
  local current
  current="$(cli TIME | awk -v b="$3" 'NR == 1 { s = $1 } NR == 2 { printf "%d", (s * 1000 + int($1 / 1000)) / b }')"
  awk -v current="$current" -v n=$(($2 / $3)) -v each=$(($1 / ($2 / $3))) -v ttl="$2" 'BEGIN {
    printf "HSET {key}"
    for (b = current - n + 1; b <= current; b++) printf " %d %d", b, each
    printf " ; PEXPIRE {key} %d\n", ttl
  }'
}

# name|template|window_ms (for windows aligned to the epoch)|target ratio vs (a)|passes (2)
variants=(
  "(a) SET k 12345678 PX 3600000|SET {key} 12345678 PX 3600000||"
  # One token a minute: the state fits in the key's value pointer.
  "(b) RL.TOKENBUCKET k 100 1 60000|RL.TOKENBUCKET {key} 100 1 60000||1.15"
  # Two tokens every two minutes: a TAT in halves of a microsecond, kept
  # in 16 bytes (a refill_count above 1 never fits in the pointer).
  "(b2) RL.TOKENBUCKET k 100 2 120000|RL.TOKENBUCKET {key} 100 2 120000||1.27"
  "(c) Lua token bucket (hash)|EVALSHA $lua_sha 1 {key} 100 1 60000||"
)
# max_burst 99 = capacity 100; 1 per 60 s, like (b). A string key: its TAT
# in nanoseconds, as redis-cell keeps it.
variants+=("(x) CL.THROTTLE k 99 1 60|CL.THROTTLE {key} 99 1 60||")
if [ -n "$CELL_PORT" ]; then
  variants+=("(y) redis-cell CL.THROTTLE k 99 1 60|CL.THROTTLE {key} 99 1 60||")
fi
# A daily quota in a named zone, and the floor's smallest module key (the
# 8 bytes in the value pointer itself), when the floor module is loaded.
variants+=("(q) RL.QUOTA k 100 DAY TZ America/New_York|RL.QUOTA {key} 100 DAY TZ America/New_York||")
if redis-cli -h 127.0.0.1 -p "$PORT" COMMAND INFO FLOOR.PTR | grep -qi floor; then
  variants+=("(p) FLOOR.PTR k 3600000 (value in the pointer)|FLOOR.PTR {key} 3600000||")
fi
variants+=(
  "(d) RL.FIXEDWINDOW k 100 60000|RL.FIXEDWINDOW {key} 100 60000|60000|"
  # A queue leaking 1 a minute: it holds the calls' units for minutes.
  "(e) RL.LEAKYBUCKET k 100 1 60000|RL.LEAKYBUCKET {key} 100 1 60000||1.15"
  # A log holding one unit, then two: the fixed part of a log (see (j) for
  # what each held unit adds).
  "(f) RL.SLIDING k 1000 600000|RL.SLIDING {key} 1000 600000||"
)
# 60 buckets of 1 s, as in the throughput run. The native state has a fixed
# size; the Lua hash grows by a field per bucket used, so it is measured after
# one call (one bucket; the script is slow, so one pass) and with the whole
# window in use (i).
variants+=(
  "(g) RL.HASHWINDOW k 1000 60000 1000|RL.HASHWINDOW {key} 1000 60000 1000||"
  "(h) Lua hash window, 1 bucket used|EVALSHA $hash_sha 1 {key} 1000 60000 1000|||1"
  "(i) Lua hash window, 60 buckets used|FULL_HASH_WINDOW|||1"
)

printf '%-36s %12s %12s %12s %10s  %s\n' "variant ($KEYS keys)" "B/key 1call" "B/key 2calls" "MEMORY USAGE" "vs (a)" "target"
baseline=""
for variant in "${variants[@]}"; do
  IFS='|' read -r name template window target passes <<<"$variant"
  [ "$template" = FULL_HASH_WINDOW ] && template="$(full_hash_window 1000 60000 1000)"
  # redis-cell's own row runs on its own server.
  PORT="$MAIN_PORT"
  case "$name" in "(y) redis-cell"*) PORT="$CELL_PORT" ;; esac
  if ! result="$(measure "$template" "$window" "$passes")"; then
    printf '%-36s %12s\n' "$name" "failed"
    continue
  fi
  PORT="$MAIN_PORT"
  read -r first second sample <<<"$result"
  [ -z "$baseline" ] && baseline="$second"
  once=""
  if [ "$second" = - ]; then second="$first"; once=1; fi
  awk -v name="$name" -v keys="$KEYS" -v first="$first" -v second="$second" -v once="$once" \
    -v sample="$sample" -v base="$baseline" -v target="$target" 'BEGIN {
      worst = (first > second) ? first : second
      ratio = worst / base
      verdict = ""
      if (target != "") verdict = sprintf("<= %.2fx %s", target, (ratio <= target) ? "PASS" : "above")
      col2 = once ? sprintf("%12s", "-") : sprintf("%12.1f", second / keys)
      line = sprintf("%-36s %12.1f %s %12s %9.2fx  %s", name, first / keys, col2, sample, ratio, verdict)
      sub(/ +$/, "", line)
      print line
    }'
done

# --- sliding log: bytes per held unit ----------------------------------------
# LOG_KEYS keys each get LOG_UNITS calls of one unit, in rounds: a round sends
# one call per key (pipelined), and the next round starts only after the last
# reply of this one and a pause of at least 1 ms, so a key's calls are at
# least 1 ms apart on the server's clock and every unit has its own
# millisecond: nothing can be coalesced. The limit (100,000) and the window
# (10 minutes) admit every call and keep every unit while it is measured.
ROUND="$(mktemp "${TMPDIR:-/tmp}/rl-memory.XXXXXX")"
trap 'rm -f "$ROUND"' EXIT
# A pipe nobody writes to: `read -t` on it is a sleep without a process.
exec {PAUSE_FD}<> <(:)
pause_1ms() { read -rt 0.001 -u "$PAUSE_FD" _ || true; }

# Prints "bytes_delta memory_usage_of_one_key ms_per_round".
measure_log() { # template held_check_command expected_reply_line
  local before after started elapsed_ms held
  flush_and_settle
  resp_stream "$1" "$LOG_KEYS" >"$ROUND"
  before="$(settled_used_memory)"
  started="$(date +%s%N)"
  for _ in $(seq "$LOG_UNITS"); do
    pipe_checked "$LOG_KEYS" "$1" <"$ROUND" || return 1
    pause_1ms
  done
  elapsed_ms=$((($(date +%s%N) - started) / 1000000))
  after="$(settled_used_memory)"
  [ "$(cli DBSIZE)" = "$LOG_KEYS" ] || { echo "memory: '$1': DBSIZE $(cli DBSIZE), expected $LOG_KEYS" >&2; return 1; }
  # shellcheck disable=SC2086  # the check command is split into words
  held="$(cli ${2//\{key\}/k:$(printf '%08d' $((LOG_KEYS - 1)))} | paste -sd' ')"
  # shellcheck disable=SC2254  # the expected reply is a glob pattern
  case "$held" in $3) ;; *) echo "memory: '$1': '$2' answers '$held', expected '$3'" >&2; return 1 ;; esac
  echo "$((after - before)) $(cli MEMORY USAGE k:00000000) $((elapsed_ms / LOG_UNITS))"
}

# name|template|held check|its expected reply (one line, a glob)|target B/unit
log_variants=(
  "(j) RL.SLIDING k 100000 600000|RL.SLIDING {key} 100000 600000|RL.SLIDING {key} 100000 600000 COST 0|1 100000 $((100000 - LOG_UNITS)) 0 *|10"
  "(k) Lua sliding log (sorted set)|EVALSHA $log_sha 1 {key} 100000 600000|ZCARD {key}|$LOG_UNITS|"
)

echo
printf '%-36s %12s %12s %10s  %s\n' "sliding log ($LOG_KEYS keys x $LOG_UNITS units)" "B/unit" "MEM USAGE/u" "ms/round" "target"
for variant in "${log_variants[@]}"; do
  IFS='|' read -r name template check expected target <<<"$variant"
  if ! result="$(measure_log "$template" "$check" "$expected")"; then
    printf '%-36s %12s\n' "$name" "failed"
    continue
  fi
  read -r bytes sample ms_per_round <<<"$result"
  awk -v name="$name" -v units=$((LOG_KEYS * LOG_UNITS)) -v per_key="$LOG_UNITS" -v bytes="$bytes" \
    -v sample="$sample" -v ms="$ms_per_round" -v target="$target" 'BEGIN {
      per_unit = bytes / units
      verdict = ""
      if (target != "") verdict = sprintf("<= %d B %s", target, (per_unit <= target) ? "PASS" : "above")
      line = sprintf("%-36s %12.1f %12.1f %10s  %s", name, per_unit, sample / per_key, ms, verdict)
      sub(/ +$/, "", line)
      print line
    }'
done
flush_and_settle
