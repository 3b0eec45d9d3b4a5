#!/usr/bin/env bash
# redis-ratelimit-rls against envoyproxy/ratelimit (the reference), side by
# side in one run, on one redis-server 7.0 with the module (README.md here).
#
# 1. Throughput: the same configuration for both (limits so high that
#    nothing is denied), the same load (rls_load: RLS_BENCH_CONNS
#    connections x RLS_BENCH_INFLIGHT calls in flight, RLS_BENCH_SECONDS per
#    run), 1, 3 and 8 descriptors per request; each server alone under load
#    (the other idles). Per run: ShouldRateLimit calls/s, Redis commands per
#    request (INFO commandstats, INFO itself left out), Redis CPU per call
#    (INFO cpu, user + sys), the gateway's own CPU per call (/proc), p50/p99.
# 2. The window boundary: a limit of RLS_BENCH_LIMIT per second, offered at
#    twice that during the second that straddles a boundary of the windows
#    aligned to seconds (from x.5 s to x+1.5 s), RLS_BENCH_CYCLES times with
#    2 s of quiet between; the most admitted in any 1 s span (sliding over
#    100 ms bins) relative to the limit: the reference (fixed window), ours
#    fixed_window, ours sliding_window.
# A benchmark reports; it exits 0 whatever the figures are.
#
#   RL_MODULE=/abs/libredis_ratelimit.so bench/rls/run.sh
#
# Knobs: RLS_BENCH_SECONDS (5), RLS_BENCH_CONNS (4), RLS_BENCH_INFLIGHT (16),
# RLS_BENCH_DESCRIPTORS ("1 3 8"), RLS_BENCH_VALUES (distinct values per
# descriptor key, 1000), RLS_BENCH_LIMIT (1000), RLS_BENCH_CYCLES (4),
# RLS_BENCH_BOUNDARY (1; 0 skips part 2), RLS_BIN and RLS_LOAD (our server
# and the load generator; built with cargo --release when unset),
# RLS_REF_BIN (the reference's service_cmd; built into tmp/envoyrl when
# unset), RLS_ENV (extra VAR=value words for our server only, e.g.
# "RLS_HASH_TAG=domain"), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
SECONDS_PER_RUN="${RLS_BENCH_SECONDS:-5}"
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
# start_gateway name binary runtime_root [VAR=value...]: sets GW_PID, GW_ADDR.
start_gateway() {
  local name="$1" bin="$2" runtime="$3" grpc http debug
  shift 3
  grpc="$(rl_free_port)"
  http="$(rl_free_port)"
  debug="$(rl_free_port)"
  env RUNTIME_ROOT="$runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_APPDIRECTORY=config \
    RUNTIME_WATCH_ROOT=false REDIS_SOCKET_TYPE=tcp REDIS_TYPE=single REDIS_URL="127.0.0.1:$REDIS_PORT" \
    USE_STATSD=false LOG_LEVEL=error HOST=127.0.0.1 GRPC_HOST=127.0.0.1 DEBUG_HOST=127.0.0.1 \
    GRPC_PORT="$grpc" PORT="$http" DEBUG_PORT="$debug" "$@" \
    "$bin" >"$RL_WORK/$name.log" 2>&1 &
  GW_PID=$!
  RL_PIDS+=("$GW_PID")
  GW_ADDR="127.0.0.1:$grpc"
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
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git -C "$ROOT" status --porcelain -- rls src core clients/rust 2>/dev/null)" ]; then
  COMMIT="$COMMIT+changes"
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
for d in $DESCRIPTOR_COUNTS; do
  for server in reference ours; do
    if [ "$server" = reference ]; then pid="$REF_PID" addr="$REF_ADDR"; else pid="$OUR_PID" addr="$OUR_ADDR"; fi
    log "throughput: $server, $d descriptor(s) per request, ${SECONDS_PER_RUN} s"
    snapshot "$RL_WORK/before" "$pid"
    "$LOAD" --addr "$addr" --conns "$CONNS" --inflight "$INFLIGHT" --descriptors "$d" \
      --values "$VALUES" --duration-ms $((SECONDS_PER_RUN * 1000)) >"$RL_WORK/run.json"
    snapshot "$RL_WORK/after" "$pid"
    python3 - "$server" "$RL_WORK/before" "$RL_WORK/after" "$RL_WORK/run.json" "$(getconf CLK_TCK)" >>"$results" <<'EOF'
import json, sys
server, before, after, run, tck = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
def parse(path):
    cmds, cpu, gw = {}, 0.0, 0.0
    for line in open(path):
        line = line.strip()
        if line.startswith("cmdstat_"):
            name, rest = line[len("cmdstat_"):].split(":", 1)
            fields = dict(f.split("=", 1) for f in rest.split(","))
            cmds[name] = int(fields["calls"])
        elif line.startswith(("used_cpu_user:", "used_cpu_sys:")):
            cpu += float(line.split(":", 1)[1])
        elif line.startswith("gateway_stat:"):
            # /proc/pid/stat: utime and stime are fields 14 and 15, counted
            # after the command name's closing parenthesis.
            rest = line.rsplit(")", 1)[1].split()
            gw = (int(rest[11]) + int(rest[12])) / tck
    return cmds, cpu, gw
(c0, cpu0, gw0), (c1, cpu1, gw1) = parse(before), parse(after)
r = json.load(open(run))
calls = max(r["calls"], 1)
delta = {k: c1.get(k, 0) - c0.get(k, 0) for k in c1 if k != "info"}
delta = {k: v for k, v in delta.items() if v > 0}
print(json.dumps({
    "kind": "throughput", "server": server, "descriptors": r["descriptors"],
    "calls_per_s": r["calls_per_s"], "calls": r["calls"], "errors": r["errors"],
    "over_limit": r["over_limit"], "first_error": r["first_error"],
    "cmds_per_call": round(sum(delta.values()) / calls, 2),
    "cmds": " + ".join(f"{k.upper()} {v / calls:.2g}" for k, v in sorted(delta.items(), key=lambda kv: -kv[1])),
    "redis_cpu_us": round((cpu1 - cpu0) * 1e6 / calls, 1),
    "gateway_cpu_us": round((gw1 - gw0) * 1e6 / calls, 1),
    "p50_us": r["p50_us"], "p99_us": r["p99_us"]}))
EOF
  done
done

# --- 2. the window boundary ------------------------------------------------------
if [ "$BOUNDARY" != 0 ]; then
  for run in "reference fixed" "ours fixed" "ours sliding"; do
    read -r server key <<<"$run"
    if [ "$server" = reference ]; then addr="$REF_ADDR"; else addr="$OUR_ADDR"; fi
    log "boundary: $server, $key window, $LIMIT/s offered at $((2 * LIMIT))/s across $CYCLES boundaries"
    "$LOAD" --addr "$addr" --mode boundary --domain boundary --keys "$key" --values 1 \
      --conns "$CONNS" --rate $((2 * LIMIT)) --cycles "$CYCLES" --on-ms 1000 --off-ms 2000 \
      --phase-ms 500 >"$RL_WORK/run.json"
    python3 - "$server" "$key" "$LIMIT" "$CYCLES" "$RL_WORK/run.json" >>"$results" <<'EOF'
import json, sys
server, key, limit, cycles, run = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
r = json.load(open(run))
print(json.dumps({
    "kind": "boundary", "server": server,
    "algorithm": {"fixed": "fixed_window", "sliding": "sliding_window"}[key],
    "offered": r["offered"], "admitted": r["ok"], "errors": r["errors"], "first_error": r["first_error"],
    "max_1s": round(r["max_1s_admitted"] / limit, 3),
    "per_burst": round(r["ok"] / cycles / limit, 3)}))
EOF
  done
fi

# --- the tables ---------------------------------------------------------------------
python3 - "$results" "$STARTED_AT" "$COMMIT" "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" \
  "$(nproc)" "$REDIS_VERSION" "$CONNS" "$INFLIGHT" "$SECONDS_PER_RUN" "$VALUES" "$LIMIT" "$CYCLES" <<'EOF'
import json, sys
(path, when, commit, load0, load1, cores, redis, conns, inflight, secs, values, limit, cycles) = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if l.strip()]
print()
print(f"### Results ({when}, commit {commit}, Redis {redis}, {cores} cores, "
      f"load average {load0} before, {load1} after)")
print()
print(f"Throughput: {conns} connections x {inflight} calls in flight, {secs} s per run, "
      f"{values} values per key; nothing denied.")
print()
head = ("descriptors", "server", "calls/s", "vs reference", "Redis commands/call", "which",
        "Redis CPU µs/call", "gateway CPU µs/call", "p50 µs", "p99 µs", "errors")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
ref = {}
for r in rows:
    if r["kind"] != "throughput":
        continue
    if r["server"] == "reference":
        ref[r["descriptors"]] = r["calls_per_s"]
    base = ref.get(r["descriptors"])
    ratio = f"{r['calls_per_s'] / base:.2f}x" if base and r["server"] != "reference" else ""
    name = "envoyproxy/ratelimit" if r["server"] == "reference" else "redis-ratelimit-rls"
    print("| " + " | ".join(str(x) for x in (
        r["descriptors"], name, r["calls_per_s"], ratio, r["cmds_per_call"], r["cmds"],
        r["redis_cpu_us"], r["gateway_cpu_us"], r["p50_us"], r["p99_us"], r["errors"])) + " |")
bounds = [r for r in rows if r["kind"] == "boundary"]
if bounds:
    print()
    print(f"Window boundary: a limit of {limit}/s, offered at {2 * int(limit)}/s from x.5 s to "
          f"x+1.5 s, {cycles} times, 2 s of quiet between.")
    print()
    head = ("server", "algorithm", "offered", "admitted", "most in any 1 s / limit",
            "admitted per burst / limit", "errors")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in bounds:
        name = "envoyproxy/ratelimit" if r["server"] == "reference" else "redis-ratelimit-rls"
        print("| " + " | ".join(str(x) for x in (
            name, r["algorithm"], r["offered"], r["admitted"], r["max_1s"], r["per_burst"],
            r["errors"])) + " |")
errors = [r for r in rows if r.get("first_error")]
for r in errors:
    print(f"\n{r['server']} ({r.get('descriptors', r.get('algorithm'))}): first error: {r['first_error']}")
EOF
