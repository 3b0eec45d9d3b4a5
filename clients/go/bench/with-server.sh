#!/bin/sh
# Starts a server with the module on a free loopback port, runs the command
# given with BENCH_ADDR=127.0.0.1:<port> in its environment (from
# clients/go), stops the server. The Go benchmarks' run.sh scripts use it.
#   RL_MODULE=/abs/libredis_ratelimit.so clients/go/bench/with-server.sh CMD ARGS...
# BENCH_SERVER: the server binary (default redis-server on PATH).
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
cd "$here/.."
BENCH_ADDR=127.0.0.1:$port "$@"
