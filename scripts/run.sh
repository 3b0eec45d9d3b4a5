#!/usr/bin/env bash
# Starts redis-server on 127.0.0.1:${PORT:-6379} with the module loaded, in the
# foreground. Extra arguments go to redis-server (e.g. --appendonly yes).
set -euo pipefail
cd "$(dirname "$0")/.."
RL_NAME=run
# shellcheck source=lib/server.sh
. scripts/lib/server.sh
PORT="${PORT:-6379}"
rl_module
if rl_answers "$PORT"; then
  echo "run: something already answers on 127.0.0.1:$PORT; stop it or use PORT=6380 make run" >&2
  exit 1
fi
cat <<MSG
redis-server on 127.0.0.1:$PORT with the ratelimit module. Try, in another terminal:
  redis-cli RL.TOKENBUCKET user:42 5 1 1000      # 5 tokens, 1 back per second
  redis-cli RL.FIXEDWINDOW api:global 100 60000  # 100 requests per minute
Reply: allowed, limit, remaining, wait_ms (Retry-After), reset_ms. Ctrl-C stops the server.
MSG
rl_options "$PORT" "${TMPDIR:-/tmp}"
exec redis-server "${RL_OPTIONS[@]}" "$@"
