#!/usr/bin/env bash
# `make rls`: redis-ratelimit-rls (Envoy's rate limit service on the module)
# in the foreground, on the `make run` server (127.0.0.1:6379) with the
# example configuration rls/examples/rls.yaml. When nothing answers on 6379,
# it starts a server with the module on a free port itself (stopped at exit).
# The environment is the gateway's (rls/README.md): GRPC_PORT, PORT,
# LOG_LEVEL... pass through; REDIS_URL picks another server.
set -euo pipefail
cd "$(dirname "$0")/.."
RL_NAME=rls
# shellcheck source=lib/server.sh
. scripts/lib/server.sh
BIN="${RLS_BIN:-target/release/redis-ratelimit-rls}"
[ -x "$BIN" ] || rl_die "$BIN not found; run 'cargo build --release -p redis-ratelimit-rls'"

if [ -z "${REDIS_URL:-}" ]; then
  if rl_answers 6379; then
    REDIS_URL=127.0.0.1:6379
  else
    rl_module
    rl_workdir
    rl_start "$RL_WORK"
    REDIS_URL="127.0.0.1:$RL_PORT"
    echo "rls: nothing answers on 127.0.0.1:6379 ('make run'); started redis-server with the module on $REDIS_URL"
  fi
fi

# The reference's layout: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml.
RUNTIME="$PWD/tmp/rls-runtime"
mkdir -p "$RUNTIME/ratelimit/config"
cp rls/examples/rls.yaml "$RUNTIME/ratelimit/config/config.yaml"

cat <<MSG
rls: gRPC on :${GRPC_PORT:-8081} (envoy.service.ratelimit.v3.RateLimitService), HTTP on :${PORT:-8080}.
Configuration: $RUNTIME/ratelimit/config/config.yaml (edit it: reloaded within two seconds).
Try, in another terminal:
  curl -s localhost:${PORT:-8080}/json -d '{"domain":"example","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}'
  curl -s localhost:${PORT:-8080}/metrics | grep ratelimit_service
Ctrl-C stops it.
MSG
export REDIS_SOCKET_TYPE=tcp REDIS_URL
export RUNTIME_ROOT="${RUNTIME_ROOT:-$RUNTIME}" RUNTIME_SUBDIRECTORY="${RUNTIME_SUBDIRECTORY:-ratelimit}"
export LOG_LEVEL="${LOG_LEVEL:-info}"
"$BIN"
