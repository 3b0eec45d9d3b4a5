# Shared by the redis-cli examples in tests/cli/*.sh (sourced, not run).
#
#   cli ARGS...                  runs redis-cli against $PORT; an array reply
#                                comes back on one line: "1 5 4 0 1000"
#   expect WHAT EXPECTED ACTUAL  passes if ACTUAL is EXPECTED
#   expect_match WHAT PATTERN ACTUAL      passes if ACTUAL matches the glob PATTERN
#   expect_between WHAT LOW HIGH ACTUAL   passes if LOW <= ACTUAL <= HIGH
#   fields REPLY LIST            some integers of a reply, by position (cut -f):
#                                fields "1 5 4 0 1000" 1-3  ->  "1 5 4"
#   away_from_window_end WINDOW_MS MARGIN_MS
#                                returns once the server's clock is at least
#                                MARGIN_MS before the end of its epoch-aligned
#                                window of WINDOW_MS (polls TIME), so that calls
#                                made within MARGIN_MS land in one window
#   done_testing                 exits 1 if anything failed
#
# Run one example by hand against a server with the module loaded:
#   PORT=6379 tests/cli/token_bucket.sh
set -uo pipefail
: "${PORT:?set PORT to the port of a redis-server with the ratelimit module loaded}"
failures=0

cli() {
  redis-cli -p "$PORT" "$@" | sed '/^$/d' | paste -sd' ' -
}

expect() {
  if [[ "$3" == "$2" ]]; then
    echo "  ok: $1"
  else
    printf '  FAIL: %s\n    expected: %s\n    got:      %s\n' "$1" "$2" "$3"
    failures=$((failures + 1))
  fi
}

expect_match() {
  # shellcheck disable=SC2053 # $2 is a glob on purpose
  if [[ "$3" == $2 ]]; then
    echo "  ok: $1"
  else
    printf '  FAIL: %s\n    expected: %s\n    got:      %s\n' "$1" "$2" "$3"
    failures=$((failures + 1))
  fi
}

expect_between() {
  if [[ "$4" =~ ^-?[0-9]+$ ]] && (($2 <= $4 && $4 <= $3)); then
    echo "  ok: $1 ($4)"
  else
    printf '  FAIL: %s\n    expected: %s..%s\n    got:      %s\n' "$1" "$2" "$3" "$4"
    failures=$((failures + 1))
  fi
}

fields() {
  cut -d' ' -f"$2" <<<"$1"
}

away_from_window_end() {
  local window_ms=$1 margin_ms=$2 time now_ms polls=0
  while :; do
    time=$(cli TIME)
    now_ms=$(( $(fields "$time" 1) * 1000 + 10#$(fields "$time" 2) / 1000 ))
    (( window_ms - now_ms % window_ms >= margin_ms )) && return 0
    # At most one window (and a little) of polling.
    (( polls++ < window_ms / 20 + 100 )) || { echo "  FAIL: the server's clock does not move"; exit 1; }
    sleep 0.02
  done
}

done_testing() {
  ((failures == 0)) || { echo "  $failures check(s) failed"; exit 1; }
}
