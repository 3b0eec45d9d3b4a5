#!/bin/sh
# Starts a server with the module on a free port, runs the local-path
# benchmark (deny cache and local level, decisions per second per core) on
# it, stops it.
#   RL_MODULE=/abs/libredis_ratelimit.so clients/go/bench/local/run.sh
# BENCH_SERVER: the server binary (default redis-server on PATH);
# BENCH_SECONDS (per row, 2) and BENCH_KEYS (10000) pass through.
set -eu
: "${RL_MODULE:?set RL_MODULE to the module (.so)}"
here=$(cd "$(dirname "$0")" && pwd)
server=${BENCH_SERVER:-redis-server}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
"$server" --port "$port" --bind 127.0.0.1 --dir "$dir" --save "" --appendonly no \
	--logfile "$dir/server.log" --loadmodule "$RL_MODULE" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"' EXIT INT TERM
i=0
until redis-cli -p "$port" ping >/dev/null 2>&1; do
	i=$((i + 1))
	if [ "$i" -gt 300 ]; then echo "the server did not start:"; cat "$dir/server.log"; exit 1; fi
	sleep 0.1
done
cd "$here/../.."
go run ./bench/local --url "redis://127.0.0.1:$port/" --seconds "${BENCH_SECONDS:-2}" --keys "${BENCH_KEYS:-10000}"
