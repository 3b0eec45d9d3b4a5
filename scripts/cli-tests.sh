#!/usr/bin/env bash
# Runs the redis-cli example scripts (tests/cli/*.sh) against a fresh
# redis-server with the module loaded, on a free port in a temporary
# directory. Prints one line per script, then "N passed, M failed"; exits
# non-zero if any failed. RL_MODULE overrides the module path.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

MODULE="${RL_MODULE:-$PWD/target/release/libredis_ratelimit.so}"
[ -f "$MODULE" ] || { echo "cli-tests: module $MODULE not found; run 'make build'" >&2; exit 1; }
for tool in redis-server redis-cli; do
  command -v "$tool" >/dev/null 2>&1 || { echo "cli-tests: $tool not found; run scripts/setup.sh" >&2; exit 1; }
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/rl-cli-tests.XXXXXX")
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A loopback port nothing answers on.
free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
}

# Starts redis-server and waits (up to 10 s) for PONG; retries on another
# port if the chosen one was taken in between.
start_server() {
  local tries
  for _ in 1 2 3 4 5; do
    PORT=$(free_port)
    redis-server --port "$PORT" --bind 127.0.0.1 --dir "$dir" --save "" --appendonly no \
      --daemonize no --loadmodule "$MODULE" >"$dir/server.log" 2>&1 &
    pid=$!
    for tries in $(seq 100); do
      if [ "$(redis-cli -p "$PORT" PING 2>/dev/null)" = "PONG" ]; then
        return 0
      fi
      kill -0 "$pid" 2>/dev/null || break
      ((tries < 100)) && sleep 0.1
    done
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    pid=""
    grep -q "Address already in use" "$dir/server.log" || break
  done
  echo "cli-tests: redis-server did not start; its log:" >&2
  cat "$dir/server.log" >&2
  return 1
}

start_server || exit 1
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
