#!/usr/bin/env bash
# `make test` after `make build`: every suite, the independent ones side by
# side so that a fresh machine runs them in well under 20 minutes.
#
# - In the foreground, the cargo chain (one target directory, so one cargo
#   at a time): unit and property tests, the integration suite (three
#   servers side by side), the redis-cli scripts, the Rust kit, the
#   exporter, fmt and clippy.
# - Beside it, each in its own process with its own log: the Java kit, the
#   Python kit and its linters, the Node kit, and deploy/'s rules and
#   dashboard. They need only the module `make build` made; they start
#   their own servers on free ports (their JVM start-ups, npm builds and
#   waits on servers overlap the cargo compiles).
#
# Each side suite's log is in tmp/test-logs/<suite>.log; a failed suite's
# log is printed whole, a passed one's last lines. Exits non-zero when any
# suite failed. TEST_SERIAL=1 runs everything one after the other instead.
set -uo pipefail
cd "$(dirname "$0")/.."

MAKE="${MAKE:-make}"
LOGS=tmp/test-logs
mkdir -p "$LOGS"

SIDE=(test-kit-java "test-kit-python lint-python" test-kit-node test-deploy)
MAIN=(test-setup test-unit test-integration test-cli test-kit-rust test-exporter lint)

if [ "${TEST_SERIAL:-}" = 1 ]; then
  # shellcheck disable=SC2068 # each entry is one or more targets
  exec "$MAKE" --no-print-directory ${MAIN[@]} ${SIDE[@]}
fi

declare -A pids
for targets in "${SIDE[@]}"; do
  name="${targets%% *}"
  # shellcheck disable=SC2086 # one or more targets
  "$MAKE" --no-print-directory $targets >"$LOGS/$name.log" 2>&1 &
  pids[$name]=$!
  echo "test: $targets started (log: $LOGS/$name.log)"
done

failed=()
start=$SECONDS
if ! "$MAKE" --no-print-directory "${MAIN[@]}"; then
  failed+=("cargo chain")
fi
echo "test: the cargo chain took $((SECONDS - start)) s"

for name in "${!pids[@]}"; do
  if wait "${pids[$name]}"; then
    echo "test: $name passed; its last lines:"
    tail -n 15 "$LOGS/$name.log"
  else
    echo "test: $name FAILED; its log:"
    cat "$LOGS/$name.log"
    failed+=("$name")
  fi
done
echo "test: all suites took $((SECONDS - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "test: FAILED: ${failed[*]}"
  exit 1
fi
echo "test: every suite passed"
