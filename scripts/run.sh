#!/usr/bin/env bash
# Starts redis-server on 127.0.0.1:${PORT:-6379} with the module loaded, in the
# foreground. Extra arguments go to redis-server (e.g. --appendonly yes).
set -euo pipefail
cd "$(dirname "$0")/.."
MODULE="$PWD/target/release/libredis_ratelimit.so"
PORT="${PORT:-6379}"
[ -f "$MODULE" ] || { echo "run: $MODULE is missing; run 'make build' first" >&2; exit 1; }
if redis-cli -p "$PORT" ping >/dev/null 2>&1; then
  echo "run: something already answers on 127.0.0.1:$PORT; stop it or use PORT=6380 make run" >&2
  exit 1
fi
cat <<MSG
redis-server on 127.0.0.1:$PORT with the ratelimit module. Try, in another terminal:
  redis-cli RL.TOKENBUCKET user:42 5 1 1000      # 5 tokens, 1 back per second
  redis-cli RL.FIXEDWINDOW api:global 100 60000  # 100 requests per minute
Reply: allowed, limit, remaining, wait_ms (Retry-After), reset_ms. Ctrl-C stops the server.
MSG
exec redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "${TMPDIR:-/tmp}" --loadmodule "$MODULE" "$@"
