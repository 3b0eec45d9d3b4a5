#!/bin/sh
# Runs the local-path benchmark (deny cache and local level, decisions per
# second per core) on a server of its own (../with-server.sh).
#   RL_MODULE=/abs/libredis_ratelimit.so clients/go/bench/local/run.sh
# BENCH_SERVER: the server binary (default redis-server on PATH);
# BENCH_SECONDS (per row, 2) and BENCH_KEYS (10000) pass through.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../with-server.sh" sh -c 'go run ./bench/local --url "redis://$BENCH_ADDR/" --seconds "${BENCH_SECONDS:-2}" --keys "${BENCH_KEYS:-10000}"'
