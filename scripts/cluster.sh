#!/usr/bin/env bash
# A local Redis Cluster with the ratelimit module, to try RL.* in cluster mode:
# 3 masters and 3 replicas on 127.0.0.1, every node loading the module.
#
#   scripts/cluster.sh start [redis|valkey]    start (or check) the cluster
#   scripts/cluster.sh stop  [redis|valkey]    shut it down, remove its files
#   scripts/cluster.sh status [redis|valkey]   CLUSTER INFO of the first node
#
# The default kind is redis (redis-server on PATH, or $REDIS_SERVER); valkey
# uses $VALKEY_SERVER or what scripts/valkey-path.sh finds. redis-cli drives
# both. Environment:
#   RL_MODULE        module to load (default target/release/libredis_ratelimit.so)
#   CLUSTER_PORT     first of six consecutive ports (default 7000 for redis,
#                    7100 for valkey); each node's bus port is its port + 10000
#   CLUSTER_DIR      state directory (default tmp/cluster-<kind>), one
#                    subdirectory per node with its config, log and pid file
#   CLUSTER_TIMEOUT  seconds to wait for the nodes and the cluster (default 60)
#
# Starting twice is harmless: a cluster already up is reported and left as it
# is; leftovers of a cluster that is no longer running are cleared first.
set -euo pipefail
cd "$(dirname "$0")/.."
RL_NAME=cluster
# shellcheck source=lib/server.sh
. scripts/lib/server.sh

usage() {
  sed -n '4,6p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

action="${1:-}"
kind="${2:-redis}"
case "$action" in start | stop | status) ;; *) usage ;; esac
case "$kind" in
  redis)
    server="${REDIS_SERVER:-redis-server}"
    first_port="${CLUSTER_PORT:-7000}"
    ;;
  valkey)
    server="$(scripts/valkey-path.sh)" || {
      echo "cluster: valkey-server not found; set VALKEY_SERVER or run scripts/setup.sh" >&2
      exit 1
    }
    first_port="${CLUSTER_PORT:-7100}"
    ;;
  *) usage ;;
esac
cli="${REDIS_CLI:-redis-cli}"
state_dir="${CLUSTER_DIR:-$PWD/tmp/cluster-$kind}"
timeout_s="${CLUSTER_TIMEOUT:-60}"
ports=()
for i in 0 1 2 3 4 5; do ports+=($((first_port + i))); done
# Marks a directory this script created, so stop never removes anything else.
marker=".rl-cluster"

node_cli() {
  local port=$1
  shift
  "$cli" -h 127.0.0.1 -p "$port" "$@"
}

answers() {
  [ "$(node_cli "$1" PING 2>/dev/null)" = "PONG" ]
}

# The value of FIELD in CLUSTER INFO of the node on PORT.
cluster_field() {
  node_cli "$1" CLUSTER INFO 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"
}

# Runs CHECK (a command) every 0.1 s until it succeeds; fails after the timeout.
wait_for() {
  local what=$1
  shift
  local deadline=$((SECONDS + timeout_s))
  until "$@"; do
    if ((SECONDS >= deadline)); then
      echo "cluster: timed out after ${timeout_s}s waiting for $what" >&2
      return 1
    fi
    sleep 0.1
  done
}

all_answer() {
  local port
  for port in "${ports[@]}"; do answers "$port" || return 1; done
}

cluster_ok() {
  local port
  for port in "${ports[@]}"; do
    [ "$(cluster_field "$port" cluster_state)" = "ok" ] || return 1
    [ "$(cluster_field "$port" cluster_known_nodes)" = "6" ] || return 1
  done
}

# Every replica has finished its initial sync with its master.
replicas_synced() {
  local port info
  for port in "${ports[@]}"; do
    info=$(node_cli "$port" INFO replication 2>/dev/null | tr -d '\r')
    grep -q '^role:slave' <<<"$info" || continue
    grep -q '^master_link_status:up' <<<"$info" || return 1
    grep -q '^master_sync_in_progress:0' <<<"$info" || return 1
  done
}

print_usage() {
  cat <<EOF
$kind cluster with the ratelimit module: 3 masters, 3 replicas on 127.0.0.1:${ports[0]}-${ports[5]}
  redis-cli -c -p ${ports[0]} RL.TOKENBUCKET user:42 5 5 1000
  redis-cli -c -p ${ports[0]} RL.ALL 2 {order:create}:user:42 {order:create}:global TOKENBUCKET 5 5 1000 FIXEDWINDOW 15000 1000
  redis-cli -p ${ports[0]} CLUSTER NODES
  redis-cli --cluster call 127.0.0.1:${ports[0]} INFO ratelimit
Logs: $state_dir/<port>/server.log
Stop: scripts/cluster.sh stop $kind   (or: make cluster-stop$( [ "$kind" = redis ] || echo " KIND=$kind"))
EOF
}

# Shuts down every node of the state directory: SHUTDOWN NOSAVE, then, for a
# node that does not exit, its own pid (from its pid file) only.
stop_nodes() {
  local port pid_file pid
  for port in "${ports[@]}"; do
    if answers "$port"; then node_cli "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true; fi
  done
  for port in "${ports[@]}"; do
    pid_file="$state_dir/$port/server.pid"
    [ -f "$pid_file" ] || continue
    pid=$(cat "$pid_file")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      # Only if that pid is still a server of ours (pids get reused).
      if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--port $port "; then
        local deadline=$((SECONDS + 10))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null || true; fi
      fi
    fi
  done
  local deadline=$((SECONDS + 10))
  for port in "${ports[@]}"; do
    while answers "$port" && ((SECONDS < deadline)); do sleep 0.1; done
  done
}

remove_state_dir() {
  if [ -d "$state_dir" ]; then
    if [ -f "$state_dir/$marker" ]; then
      rm -rf "$state_dir"
    else
      echo "cluster: $state_dir was not made by this script; left alone" >&2
    fi
  fi
}

start() {
  if cluster_ok 2>/dev/null; then
    echo "cluster: already running"
    print_usage
    return 0
  fi
  local port
  for port in "${ports[@]}"; do
    if answers "$port" && [ ! -f "$state_dir/$port/server.pid" ]; then
      echo "cluster: something else answers on port $port; set CLUSTER_PORT" >&2
      exit 1
    fi
  done
  rl_module
  command -v "$server" >/dev/null 2>&1 || {
    echo "cluster: $server not found" >&2
    exit 1
  }
  command -v "$cli" >/dev/null 2>&1 || {
    echo "cluster: $cli not found" >&2
    exit 1
  }
  # Leftovers of an earlier run (nodes half up, or a stale nodes.conf) would
  # keep the cluster from forming: start from scratch.
  stop_nodes
  remove_state_dir
  mkdir -p "$state_dir"
  touch "$state_dir/$marker"

  echo "cluster: starting 6 $kind nodes on ports ${ports[0]}-${ports[5]}"
  for port in "${ports[@]}"; do
    local dir="$state_dir/$port"
    mkdir -p "$dir"
    rl_options "$port" "$dir"
    "$server" "${RL_OPTIONS[@]}" \
      --cluster-enabled yes --cluster-config-file nodes.conf \
      --cluster-node-timeout 5000 --repl-diskless-sync-delay 0 \
      --daemonize yes --pidfile "$dir/server.pid" --logfile "$dir/server.log"
  done
  wait_for "every node to answer PING" all_answer || {
    echo "cluster: see the logs in $state_dir/*/server.log" >&2
    exit 1
  }

  local addresses=()
  for port in "${ports[@]}"; do addresses+=("127.0.0.1:$port"); done
  "$cli" --cluster create "${addresses[@]}" --cluster-replicas 1 --cluster-yes
  wait_for "cluster_state:ok on every node" cluster_ok
  wait_for "every replica to sync with its master" replicas_synced
  echo
  print_usage
}

case "$action" in
  start) start ;;
  stop)
    stop_nodes
    remove_state_dir
    echo "cluster: $kind cluster on ports ${ports[0]}-${ports[5]} stopped"
    ;;
  status)
    node_cli "${ports[0]}" CLUSTER INFO | tr -d '\r' | grep -E '^cluster_(state|slots_ok|known_nodes|size):' ||
      { echo "cluster: no node answers on port ${ports[0]}" >&2; exit 1; }
    ;;
esac
