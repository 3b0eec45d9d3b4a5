#!/usr/bin/env bash
# redis-ratelimit-rls against envoyproxy/ratelimit (the reference), side by
# side in one run, on one redis-server 7.0 with the module (README.md here).
#
# 1. Throughput: the same configuration for both (limits so high that
#    nothing is denied), the same load (rls_load: RLS_BENCH_CONNS
#    connections x RLS_BENCH_INFLIGHT calls in flight, RLS_BENCH_SECONDS per
#    run, RLS_BENCH_ROUNDS interleaved rounds), 1, 3 and 8 descriptors per
#    request; each server alone under load (the other idles). Per run:
#    ShouldRateLimit calls/s, Redis commands per call (INFO commandstats,
#    INFO itself left out), Redis CPU per call (INFO cpu, user + sys), the
#    gateway's own CPU per call (/proc), p50/p99 (run_delta.py).
# 2. The window boundary: a limit of RLS_BENCH_LIMIT per second, offered at
#    twice that during the second that straddles a boundary of the windows
#    aligned to seconds (from x.5 s to x+1.5 s), RLS_BENCH_CYCLES times with
#    2 s of quiet between; the most admitted in any 1 s span (sliding over
#    100 ms bins) relative to the limit: the reference (fixed window), ours
#    fixed_window, ours sliding_window.
# The tables (report.py) go to stdout, progress to stderr. A benchmark
# reports; it exits 0 whatever the figures are.
#
#   RL_MODULE=/abs/libredis_ratelimit.so bench/rls/run.sh
#
# Knobs: RLS_BENCH_SECONDS (5), RLS_BENCH_ROUNDS (3), RLS_BENCH_CONNS (4),
# RLS_BENCH_INFLIGHT (16), RLS_BENCH_DESCRIPTORS ("1 3 8"), RLS_BENCH_VALUES
# (distinct values per descriptor key, 1000), RLS_BENCH_LIMIT (1000),
# RLS_BENCH_CYCLES (4), RLS_BENCH_BOUNDARY (1; 0 skips part 2), RLS_BIN and
# RLS_LOAD (our server and the load generator; built with cargo --release
# when unset), RLS_REF_BIN (the reference's service_cmd; built into
# tmp/envoyrl when unset), RLS_ENV (extra VAR=value words for our server
# only, e.g. "RLS_HASH_TAG=domain"), RLS_BENCH_LABEL (what the table says
# was measured; default the tree's commit), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
SECONDS_PER_RUN="${RLS_BENCH_SECONDS:-5}"
ROUNDS="${RLS_BENCH_ROUNDS:-3}"
CONNS="${RLS_BENCH_CONNS:-4}"
INFLIGHT="${RLS_BENCH_INFLIGHT:-16}"
DESCRIPTOR_COUNTS="${RLS_BENCH_DESCRIPTORS:-1 3 8}"
VALUES="${RLS_BENCH_VALUES:-1000}"
LIMIT="${RLS_BENCH_LIMIT:-1000}"
CYCLES="${RLS_BENCH_CYCLES:-4}"
BOUNDARY="${RLS_BENCH_BOUNDARY:-1}"
# The reference: envoyproxy/ratelimit's main of 2026-01-22, the version the
# Go module proxy serves for this pseudo-version.
REF_MODULE=github.com/envoyproxy/ratelimit
REF_VERSION=v1.4.1-0.20260122083618-3fb702589d36

RL_NAME=bench-rls
# shellcheck source=../../scripts/lib/server.sh
. scripts/lib/server.sh
rl_module
rl_require redis-server redis-cli python3
rl_workdir
log() { echo "bench-rls: $*" >&2; }

# --- the binaries -------------------------------------------------------------
RLS_BIN="${RLS_BIN:-}"
LOAD="${RLS_LOAD:-}"
if [ -z "$RLS_BIN" ] || [ -z "$LOAD" ]; then
  log "building redis-ratelimit-rls and rls_load (cargo --release)"
  cargo build --release -q -p redis-ratelimit-rls --example rls_load --bin redis-ratelimit-rls
  out="${CARGO_TARGET_DIR:-$ROOT/target}/release"
  RLS_BIN="${RLS_BIN:-$out/redis-ratelimit-rls}"
  LOAD="${LOAD:-$out/examples/rls_load}"
fi
[ -x "$RLS_BIN" ] || rl_die "RLS_BIN=$RLS_BIN is not an executable"
[ -x "$LOAD" ] || rl_die "RLS_LOAD=$LOAD is not an executable"

REF_BIN="${RLS_REF_BIN:-}"
if [ -z "$REF_BIN" ]; then
  GO_CMD="$(scripts/go-path.sh)" || rl_die "no go command of 1.26 or later; run 'make setup' (scripts/setup.sh installs one)"
  REF_BIN="$ROOT/tmp/envoyrl/bin/service_cmd"
  built_version() {
    "$GO_CMD" version -m "$REF_BIN" 2>/dev/null |
      awk -v m="$REF_MODULE" '$1 == "mod" && $2 == m { print $3 }'
  }
  if [ "$(built_version)" != "$REF_VERSION" ]; then
    log "building $REF_MODULE/src/service_cmd@$REF_VERSION from the Go module proxy into tmp/envoyrl"
    mkdir -p "$ROOT/tmp/envoyrl/bin"
    GOBIN="$ROOT/tmp/envoyrl/bin" "$GO_CMD" install "$REF_MODULE/src/service_cmd@$REF_VERSION"
    [ "$(built_version)" = "$REF_VERSION" ] || rl_die "$REF_BIN is not $REF_MODULE@$REF_VERSION after go install"
  fi
fi
[ -x "$REF_BIN" ] || rl_die "RLS_REF_BIN=$REF_BIN is not an executable"

# --- Redis --------------------------------------------------------------------
rl_start "$RL_WORK/redis"
REDIS_PORT="$RL_PORT"
REDIS_VERSION="$(redis-cli -p "$REDIS_PORT" INFO server | tr -d '\r' | sed -n 's/^redis_version://p')"

# --- the configuration: the same files for both, plus ours' extension -------
# RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY: root/ratelimit/config.
write_config() { # dir with_sliding
  local dir="$1/ratelimit/config" i
  mkdir -p "$dir"
  {
    echo "domain: bench"
    echo "descriptors:"
    for i in 1 2 3 4 5 6 7 8; do
      printf '  - key: k%s\n    rate_limit:\n      unit: second\n      requests_per_unit: 1000000000\n' "$i"
    done
  } >"$dir/bench.yaml"
  {
    echo "domain: boundary"
    echo "descriptors:"
    printf '  - key: fixed\n    rate_limit:\n      unit: second\n      requests_per_unit: %s\n' "$LIMIT"
    if [ "$2" = 1 ]; then
      printf '  - key: sliding\n    rate_limit:\n      unit: second\n      requests_per_unit: %s\n      algorithm: sliding_window\n' "$LIMIT"
    fi
  } >"$dir/boundary.yaml"
}
write_config "$RL_WORK/ref-runtime" 0
write_config "$RL_WORK/our-runtime" 1

# --- the servers ----------------------------------------------------------------
# start_gateway name binary runtime_root [VAR=value...]: starts it on three
# free ports and waits (30 s at most) until its gRPC and HTTP ports accept; another
# three ports if it exits meanwhile saying a port was taken (by another
# process between the choice and its bind). Sets GW_PID, GW_ADDR.
start_gateway() {
  local name="$1" bin="$2" runtime="$3" grpc http debug attempt tries
  shift 3
  for attempt in 1 2 3 4 5; do
    grpc="$(rl_free_port)"
    http="$(rl_free_port)"
    debug="$(rl_free_port)"
    if [ "$grpc" = "$http" ] || [ "$grpc" = "$debug" ] || [ "$http" = "$debug" ]; then continue; fi
    env RUNTIME_ROOT="$runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_APPDIRECTORY=config \
      RUNTIME_WATCH_ROOT=false REDIS_SOCKET_TYPE=tcp REDIS_TYPE=single REDIS_URL="127.0.0.1:$REDIS_PORT" \
      USE_STATSD=false LOG_LEVEL=error HOST=127.0.0.1 GRPC_HOST=127.0.0.1 DEBUG_HOST=127.0.0.1 \
      GRPC_PORT="$grpc" PORT="$http" DEBUG_PORT="$debug" "$@" \
      "$bin" >"$RL_WORK/$name.log" 2>&1 &
    GW_PID=$!
    RL_PIDS+=("$GW_PID")
    GW_ADDR="127.0.0.1:$grpc"
    for tries in $(seq 300); do
      # Both ports: a server that took one may still fail on the other.
      if (: <>"/dev/tcp/127.0.0.1/$grpc") 2>/dev/null && (: <>"/dev/tcp/127.0.0.1/$http") 2>/dev/null &&
        kill -0 "$GW_PID" 2>/dev/null; then
        return 0
      fi
      kill -0 "$GW_PID" 2>/dev/null || break
      sleep 0.1
    done
    rl_stop "$GW_PID"
    grep -qi "address already in use" "$RL_WORK/$name.log" || break
    log "$name: a port was taken (attempt $attempt, $tries x 0.1 s); three others"
  done
  log "$name did not start; its log:"
  tail -n 20 "$RL_WORK/$name.log" >&2 || true
  exit 1
}

# Warm-up (also the wait for the server to answer): a second of load.
warm_up() { # name pid addr
  if ! "$LOAD" --addr "$3" --wait-ms 30000 --duration-ms 1000 --conns "$CONNS" \
    --inflight "$INFLIGHT" --values "$VALUES" >/dev/null 2>"$RL_WORK/$1.warmup.err" ||
    ! kill -0 "$2" 2>/dev/null; then
    log "$1 did not come up; its log:"
    tail -n 20 "$RL_WORK/$1.log" "$RL_WORK/$1.warmup.err" >&2 || true
    exit 1
  fi
}

start_gateway reference "$REF_BIN" "$RL_WORK/ref-runtime"
REF_PID="$GW_PID" REF_ADDR="$GW_ADDR"
# shellcheck disable=SC2086 # RLS_ENV is a list of VAR=value words
start_gateway ours "$RLS_BIN" "$RL_WORK/our-runtime" ${RLS_ENV:-}
OUR_PID="$GW_PID" OUR_ADDR="$GW_ADDR"
warm_up reference "$REF_PID" "$REF_ADDR"
warm_up ours "$OUR_PID" "$OUR_ADDR"

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
STARTED_AT="$(date -u '+%Y-%m-%d %H:%M UTC')"
# What the table says was measured: RLS_BENCH_LABEL, or the tree's commit
# (when RLS_BIN or RL_MODULE come from elsewhere, say so with the label).
COMMIT="${RLS_BENCH_LABEL:-}"
if [ -z "$COMMIT" ]; then
  COMMIT="commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  if [ -n "$(git -C "$ROOT" status --porcelain -- rls src core clients/rust 2>/dev/null)" ]; then
    COMMIT="$COMMIT with uncommitted changes"
  fi
fi

results="$RL_WORK/results"
: >"$results"
snapshot() { # file pid
  {
    redis-cli -p "$REDIS_PORT" INFO commandstats
    redis-cli -p "$REDIS_PORT" INFO cpu
    echo "gateway_stat:$(cat "/proc/$2/stat")"
  } | tr -d '\r' >"$1"
}

# --- 1. throughput --------------------------------------------------------------
# ROUNDS interleaved rounds; which server goes first alternates.
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then order="reference ours"; else order="ours reference"; fi
  for d in $DESCRIPTOR_COUNTS; do
    for server in $order; do
      if [ "$server" = reference ]; then pid="$REF_PID" addr="$REF_ADDR"; else pid="$OUR_PID" addr="$OUR_ADDR"; fi
      log "round $round/$ROUNDS: $server, $d descriptor(s) per request, ${SECONDS_PER_RUN} s"
      snapshot "$RL_WORK/before" "$pid"
      "$LOAD" --addr "$addr" --conns "$CONNS" --inflight "$INFLIGHT" --descriptors "$d" \
        --values "$VALUES" --duration-ms $((SECONDS_PER_RUN * 1000)) >"$RL_WORK/run.json"
      snapshot "$RL_WORK/after" "$pid"
      python3 bench/rls/run_delta.py "$server" "$RL_WORK/before" "$RL_WORK/after" \
        "$RL_WORK/run.json" "$(getconf CLK_TCK)" >>"$results"
    done
  done
done

# --- 2. the window boundary ------------------------------------------------------
if [ "$BOUNDARY" != 0 ]; then
  for run in "reference fixed_window fixed" "ours fixed_window fixed" "ours sliding_window sliding"; do
    read -r server algorithm key <<<"$run"
    if [ "$server" = reference ]; then addr="$REF_ADDR"; else addr="$OUR_ADDR"; fi
    log "boundary: $server, $algorithm, $LIMIT/s offered at $((2 * LIMIT))/s across $CYCLES boundaries"
    "$LOAD" --addr "$addr" --mode boundary --domain boundary --keys "$key" --values 1 \
      --conns "$CONNS" --rate $((2 * LIMIT)) --cycles "$CYCLES" --on-ms 1000 --off-ms 2000 \
      --phase-ms 500 >"$RL_WORK/run.json"
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); r.update(kind="boundary", server=sys.argv[2], algorithm=sys.argv[3]); print(json.dumps(r))' \
      "$RL_WORK/run.json" "$server" "$algorithm" >>"$results"
  done
fi

# --- the tables -------------------------------------------------------------------
python3 bench/rls/report.py "$results" when="$STARTED_AT" commit="$COMMIT" \
  load_before="$LOAD_BEFORE" load_after="$(cut -d' ' -f1-3 /proc/loadavg)" cores="$(nproc)" \
  redis="$REDIS_VERSION" conns="$CONNS" inflight="$INFLIGHT" seconds="$SECONDS_PER_RUN" \
  rounds="$ROUNDS" values="$VALUES" limit="$LIMIT" cycles="$CYCLES"
