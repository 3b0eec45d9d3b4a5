#!/usr/bin/env bash
# Runs the redis-cli example scripts (tests/cli/*.sh) against a fresh
# redis-server with the module loaded, on a free port in a temporary
# directory. Prints one line per script, then "N passed, M failed"; exits
# non-zero if any failed. RL_MODULE overrides the module path.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

RL_NAME=cli-tests
# shellcheck source=lib/server.sh
. scripts/lib/server.sh
rl_module
rl_require redis-server redis-cli
rl_workdir
rl_start "$RL_WORK"
PORT="$RL_PORT"
export PORT

passed=0
failed=0
for script in tests/cli/*.sh; do
  name=$(basename "$script" .sh)
  if output=$(timeout 120 bash "$script" 2>&1); then
    echo "PASS $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name"
    while IFS= read -r line; do echo "    $line"; done <<<"$output"
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
