# shellcheck shell=bash
# Starting a server with the module, for the scripts that need one: sourced
# (not run) by scripts/cli-tests.sh, scripts/bench.sh, bench/load.sh,
# scripts/run.sh and scripts/cluster.sh. Works with and without `set -e`.
#
#   RL_NAME=bench            how messages start ("bench: ..."); set it first
#   rl_module                sets RL_MODULE_PATH to $RL_MODULE or the release
#                            build, and exits if there is no such file
#   rl_require TOOL...       exits naming the first TOOL not on PATH
#   rl_workdir               sets RL_WORK: a temporary directory, removed at exit
#   rl_answers PORT          true if 127.0.0.1:PORT answers PING with PONG
#   rl_free_port             prints a loopback port nothing listens on
#   rl_options PORT DIR      sets RL_OPTIONS: what every server here gets (loopback,
#                            no persistence, DIR, the module), before its own options
#   rl_start DIR [OPTION...] starts redis-server with RL_OPTIONS and
#                            OPTIONs on a free port, its log in DIR/server.log,
#                            and waits (10 s at most) until it answers PONG;
#                            another port if that one was taken meanwhile.
#                            Sets RL_PORT and RL_PID. Exits, with the end of
#                            the log, if the server does not start.
#   rl_stop PID              stops a server rl_start started, and waits for it
#
# rl_workdir and rl_start arrange, at their first call, that every server
# they started is stopped and the directory removed when the script exits
# (Ctrl-C included).

RL_NAME="${RL_NAME:-$(basename "$0" .sh)}"
RL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RL_PIDS=()
RL_WORK=""
RL_TRAPPED=""

rl_die() {
  echo "$RL_NAME: $*" >&2
  exit 1
}

rl_module() {
  RL_MODULE_PATH="${RL_MODULE:-$RL_ROOT/target/release/libredis_ratelimit.so}"
  [ -f "$RL_MODULE_PATH" ] || rl_die "module $RL_MODULE_PATH not found; run 'make build' or set RL_MODULE"
}

rl_require() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || rl_die "$tool not found; run scripts/setup.sh"
  done
}

# shellcheck disable=SC2317  # invoked by the EXIT trap
rl_cleanup() {
  local pid
  for pid in "${RL_PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  RL_PIDS=()
  if [ -n "$RL_WORK" ]; then rm -rf "$RL_WORK"; fi
}

rl_trap() {
  [ -n "$RL_TRAPPED" ] && return 0
  RL_TRAPPED=1
  trap rl_cleanup EXIT
  trap 'exit 130' INT TERM
}

rl_workdir() {
  rl_trap
  [ -n "$RL_WORK" ] || RL_WORK="$(mktemp -d "${TMPDIR:-/tmp}/rl-$RL_NAME.XXXXXX")"
}

rl_answers() {
  [ "$(redis-cli -h 127.0.0.1 -p "$1" PING 2>/dev/null)" = "PONG" ]
}

rl_free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 40000))
    if ! (: <>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
}

rl_options() {
  [ -n "${RL_MODULE_PATH:-}" ] || rl_module
  RL_OPTIONS=(--port "$1" --bind 127.0.0.1 --dir "$2" --save "" --appendonly no
    --loadmodule "$RL_MODULE_PATH")
}

# The pid of the server answering on PORT, once it answers PING.
rl_answering_pid() {
  rl_answers "$1" || return 1
  redis-cli -h 127.0.0.1 -p "$1" INFO server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p'
}

rl_start() {
  local dir="$1" attempt port pid tries answering
  shift
  rl_trap
  mkdir -p "$dir"
  for attempt in 1 2 3 4 5; do
    port="$(rl_free_port)"
    rl_options "$port" "$dir"
    rm -f "$dir/server.log"
    # What the server prints before it opens its log file (a bad option)
    # goes to the same file.
    redis-server "${RL_OPTIONS[@]}" --daemonize no --logfile "$dir/server.log" "$@" \
      >>"$dir/server.log" 2>&1 &
    pid=$!
    RL_PIDS+=("$pid")
    for tries in $(seq 100); do
      answering="$(rl_answering_pid "$port" || true)"
      if [ "$answering" = "$pid" ]; then
        RL_PORT="$port"
        RL_PID="$pid"
        return 0
      fi
      # Another server answers on the port: ours lost the race for it.
      [ -n "$answering" ] && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    rl_stop "$pid"
    # Only a port taken in the meantime is worth another try.
    if [ -z "$answering" ] && ! grep -q "Address already in use" "$dir/server.log" 2>/dev/null; then
      break
    fi
    echo "$RL_NAME: port $port was taken (attempt $attempt, waited $tries x 0.1 s); another one" >&2
  done
  echo "$RL_NAME: redis-server did not start; the end of its log:" >&2
  tail -n 20 "$dir/server.log" >&2 2>/dev/null || true
  exit 1
}

rl_stop() {
  local pid="$1" kept=() p
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  for p in "${RL_PIDS[@]}"; do
    [ "$p" = "$pid" ] || kept+=("$p")
  done
  RL_PIDS=("${kept[@]}")
}
