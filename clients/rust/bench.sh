#!/usr/bin/env bash
# The client kit's benchmark (`make bench-kit-rust`, part of `make bench`):
# starts its own redis-server with the module and the example service
# (clients/rust/examples/service.rs) on free loopback ports, drives them with
# the kit's load generator (examples/loadgen.rs), and prints two tables:
#   1. the layer's cost per request: the service with the layer (per-user
#      and global rules in one RL.ALL) against the same axum app without it,
#      interleaved in rounds;
#   2. Redis calls per 1,000 requests with and without the local level and
#      the deny cache, under a skewed load (one abusive user sends most);
#   3. the protection loop's server calls per instance (RL.OUTCOME reports,
#      RL.POLICY STATS reads) per second, at two request rates;
#   4. metrics and deny events: decisions per second of one Limiter with them
#      off and on, side by side in one run (examples/observe.rs), on the
#      Redis path and on the deny cache's (every decision a deny event).
# A benchmark reports; it exits 0 whatever the figures are.
#
# Knobs: KIT_BENCH_N (requests per run, 20000), KIT_BENCH_C (connections, 32),
# KIT_BENCH_ROUNDS (3).
set -euo pipefail
cd "$(dirname "$0")/../.."
N="${KIT_BENCH_N:-20000}"
C="${KIT_BENCH_C:-32}"
ROUNDS="${KIT_BENCH_ROUNDS:-3}"

RL_NAME=bench-kit
# shellcheck source=../../scripts/lib/server.sh
. scripts/lib/server.sh
rl_module
rl_require redis-server redis-cli awk
rl_workdir
cargo build --release -q -p redis-ratelimit-client --examples
SERVICE="${CARGO_TARGET_DIR:-target}/release/examples/service"
LOADGEN="${CARGO_TARGET_DIR:-target}/release/examples/loadgen"
OBSERVE="${CARGO_TARGET_DIR:-target}/release/examples/observe"

rl_start "$RL_WORK/redis"
PORT="$RL_PORT"
cli() { redis-cli -h 127.0.0.1 -p "$PORT" "$@"; }

# start_service NAME VAR=VALUE...: the service on a free port; sets SVC_PORT, SVC_PID.
# rl_free_port only checks that nothing listens: the port may still be the
# local port of a connection (its range overlaps the ephemeral ports that
# loadgen's and the services' connections take), and then the service's bind
# fails and it exits. So: ready only when its log says it listens on that
# port (a connect alone may reach another process), and a service that exited
# is started again on another port.
start_service() {
  local name="$1" attempt; shift
  for attempt in 1 2 3 4 5; do
    SVC_PORT="$(rl_free_port)"
    env PORT="$SVC_PORT" RL_URL="redis://127.0.0.1:$PORT/" "$@" "$SERVICE" >"$RL_WORK/$name.log" 2>&1 &
    SVC_PID=$!
    RL_PIDS+=("$SVC_PID")
    for _ in $(seq 200); do
      if grep -q "listening on 127.0.0.1:$SVC_PORT" "$RL_WORK/$name.log" &&
        (exec 3<>"/dev/tcp/127.0.0.1/$SVC_PORT") 2>/dev/null; then
        return 0
      fi
      kill -0 "$SVC_PID" 2>/dev/null || break
      sleep 0.05
    done
    echo "bench-kit: service $name did not start on port $SVC_PORT (attempt $attempt): $(tail -1 "$RL_WORK/$name.log")" >&2
    kill "$SVC_PID" 2>/dev/null || true; wait "$SVC_PID" 2>/dev/null || true
  done
  rl_die "service $name did not start: $(tail -3 "$RL_WORK/$name.log")"
}
stop_service() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
field() { tr ' ' '\n' | awk -F= -v k="$1" '$1 == k { print $2 }'; }
rl_all_calls() { cli INFO commandstats | tr -d '\r' | awk -F'[:,=]' '$1 == "cmdstat_RL.ALL" { print $3 } END { }' | tail -1; }

echo "bench-kit: the layer's cost per request ($N requests, $C connections, $ROUNDS rounds, 1000 users)" >&2
# Limits that never bind: every request is admitted, so both sides do the same work.
start_service bare RL_BARE=1; BARE_PORT=$SVC_PORT; BARE_PID=$SVC_PID
start_service layer RL_USER_LIMIT=100000 RL_GLOBAL_LIMIT=1000000000 RL_DEADLINE_MS=100; LAYER_PORT=$SVC_PORT; LAYER_PID=$SVC_PID
declare -A RPS P50 P99
for r in $(seq "$ROUNDS"); do
  for side in bare layer; do
    port=$BARE_PORT; [ "$side" = layer ] && port=$LAYER_PORT
    line="$("$LOADGEN" "http://127.0.0.1:$port/" "$N" "$C" 1000 0)"
    RPS[$side]="${RPS[$side]:-} $(echo "$line" | field rps)"
    P50[$side]="${P50[$side]:-} $(echo "$line" | field p50_us)"
    P99[$side]="${P99[$side]:-} $(echo "$line" | field p99_us)"
    echo "bench-kit: round $r $side: $line" >&2
  done
done
FALLBACK="$(curl -s "http://127.0.0.1:$LAYER_PORT/stats" | tr ',' '\n' | awk -F: '/fallback_admitted|fallback_denied/ { s += $2 } END { print s + 0 }')"
stop_service "$BARE_PID"; stop_service "$LAYER_PID"
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
b_rps=$(echo "${RPS[bare]}" | median); l_rps=$(echo "${RPS[layer]}" | median)
b50=$(echo "${P50[bare]}" | median); l50=$(echo "${P50[layer]}" | median)
b99=$(echo "${P99[bare]}" | median); l99=$(echo "${P99[layer]}" | median)
echo
echo "| service | requests/s | p50 µs | p99 µs | µs per request (1 / rate) |"
echo "|---|---|---|---|---|"
awk -v r="$b_rps" -v p="$b50" -v q="$b99" 'BEGIN { printf "| bare axum handler | %d | %d | %d | %.1f |\n", r, p, q, 1e6 / r }'
awk -v r="$l_rps" -v p="$l50" -v q="$l99" 'BEGIN { printf "| with the layer (RL.ALL of 2 rules) | %d | %d | %d | %.1f |\n", r, p, q, 1e6 / r }'
awk -v b="$b_rps" -v l="$l_rps" -v p="$b50" -v q="$l50" 'BEGIN { printf "| ratio layer / bare | %.2fx | %.2fx | | +%.1f µs |\n", l / b, q / p, 1e6 / l - 1e6 / b }'
echo "(requests the fallback decided during the layer runs: $FALLBACK)"

echo "bench-kit: Redis calls per 1,000 requests, skewed load ($N requests, 90% from one user)" >&2
echo
echo "| local level | deny cache | RL.ALL calls per 1,000 requests | admitted | denied | seconds |"
echo "|---|---|---|---|---|---|"
for cfg in "0 0" "1 0" "0 1" "1 1"; do
  set -- $cfg
  # Per-user 5/s and a global 500/s that the load exceeds; a clean server.
  cli FLUSHALL >/dev/null
  start_service "skew-$1$2" RL_LOCAL="$1" RL_DENY_CACHE="$2" RL_GLOBAL_LIMIT=500 RL_DEADLINE_MS=100
  before="$(rl_all_calls)"; before="${before:-0}"
  line="$("$LOADGEN" "http://127.0.0.1:$SVC_PORT/" "$N" "$C" 1000 0.9)"
  after="$(rl_all_calls)"; after="${after:-0}"
  stop_service "$SVC_PID"
  echo "bench-kit: local=$1 deny_cache=$2: $line, RL.ALL calls $((after - before))" >&2
  awk -v c=$((after - before)) -v n="$(echo "$line" | field requests)" -v l="$1" -v d="$2" \
      -v ok="$(echo "$line" | field ok)" -v no="$(echo "$line" | field limited)" \
      -v t="$(echo "$line" | field seconds)" \
      'BEGIN { printf "| %s | %s | %.0f | %d | %d | %s |\n", (l == 1 ? "on" : "off"), (d == 1 ? "on" : "off"), c * 1000 / n, ok, no, t }'
done

echo "bench-kit: the protection loop's server calls per instance ($N requests, 1 and $C connections)" >&2
# A policy that never denies, with the loop on; the service reports and reads
# it every second (the kit's defaults) whatever the request rate.
cli FLUSHALL >/dev/null
cli RL.POLICY SET bench-loop TOKENBUCKET 1000000000 1000000000 1000 ADAPT ERRORS 5 STAGES 30 50 WINDOW 1000 >/dev/null
start_service loop RL_POLICY=bench-loop RL_DEADLINE_MS=100
calls_of() { cli INFO commandstats | tr -d '\r' | awk -F'[:,=]' -v k="cmdstat_$1" 'tolower($1) == tolower(k) { print $3 }' | tail -1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
echo
echo "| connections | requests/s | RL.OUTCOME calls/s | RL.POLICY STATS calls/s | outcome calls per 1,000 requests |"
echo "|---|---|---|---|---|"
for c in 1 "$C"; do
  # Load for at least 5 s (several report intervals), at the rate $c connections give.
  o0="$(calls_of RL.OUTCOME)"; p0="$(calls_of 'RL.POLICY|STATS')"; t0="$(now_ms)"; n=0
  while [ $(( $(now_ms) - t0 )) -lt 5000 ]; do
    line="$("$LOADGEN" "http://127.0.0.1:$SVC_PORT/api" "$N" "$c" 1000 0)"
    n=$(( n + $(echo "$line" | field requests) ))
  done
  t1="$(now_ms)"; o1="$(calls_of RL.OUTCOME)"; p1="$(calls_of 'RL.POLICY|STATS')"
  o=$(( ${o1:-0} - ${o0:-0} )); p=$(( ${p1:-0} - ${p0:-0} ))
  echo "bench-kit: loop, $c connections: $n requests in $(( t1 - t0 )) ms, RL.OUTCOME $o, RL.POLICY STATS $p" >&2
  awk -v c="$c" -v n="$n" -v o="$o" -v p="$p" -v ms=$(( t1 - t0 )) \
      'BEGIN { printf "| %d | %d | %.2f | %.2f | %.3f |\n", c, n * 1000 / ms, o * 1000 / ms, p * 1000 / ms, o * 1000 / n }'
done
stop_service "$SVC_PID"

echo "bench-kit: metrics and deny events, off and on ($N decisions per run, $C tasks, $ROUNDS rounds)" >&2
cli FLUSHALL >/dev/null
echo
echo "| path | decisions/s, metrics and deny events off | on | ratio on / off |"
echo "|---|---|---|---|"
"$OBSERVE" "redis://127.0.0.1:$PORT/" "$N" "$C" "$ROUNDS" "$RL_WORK/deny-events.jsonl" >"$RL_WORK/observe.out"
MICRO=""
while read -r line; do
  echo "bench-kit: observe: $line" >&2
  case "$line" in
    micro*) MICRO="$line"; continue ;;
  esac
  awk -v p="$(echo "$line" | field path)" -v a="$(echo "$line" | field off)" -v b="$(echo "$line" | field on)" -v r="$(echo "$line" | field ratio)" \
      'BEGIN { printf "| %s | %d | %d | %.2fx |\n", (p == "redis" ? "Redis round trip (admitted)" : "deny cache (every decision a deny event)"), a, b, r }'
done <"$RL_WORK/observe.out"
if [ -n "$MICRO" ]; then
  echo "(one deny event on one thread: $(echo "$MICRO" | field record_ns) ns to build and record on the request path, $(echo "$MICRO" | field json_ns) ns to format, $(echo "$MICRO" | field ship_ns) ns to format and append to a file on the flusher)"
fi
exit 0
