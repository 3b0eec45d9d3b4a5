#!/bin/sh
# Runs the side-by-side benchmark of redisrate against go-redis/redis_rate
# v10 on a server of its own (../with-server.sh).
#   RL_MODULE=/abs/libredis_ratelimit.so clients/go/bench/redisrate/run.sh
# BENCH_SERVER: the server binary (default redis-server on PATH); the
# benchmark's own variables (BENCH_GOROUTINES, BENCH_SECONDS, BENCH_KEYS)
# pass through.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../with-server.sh" sh -c 'REDISRATE_BENCH_ADDR=$BENCH_ADDR go run ./bench/redisrate'
