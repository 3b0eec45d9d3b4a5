#!/usr/bin/env bash
# Tests of deploy/: the Prometheus rules and the Grafana dashboard.
#   1. promtool check rules      deploy/prometheus/rules.yml is valid
#   2. promtool test rules       every alert fires above its threshold and
#                                stays silent below it and without traffic
#   3. mutation check            each alert's comparison flipped and its
#                                threshold moved: the tests must then fail
#   4. dashboard up to date      redis-ratelimit.json is what build.py writes
#   5. check_dashboard.py        every query parses and names known series
#   6. check_dashboard self-test a bad dashboard and bad rules are refused
#   7. ruff                      the Python tools lint-clean (deploy/ruff.toml)
# Runs every step, prints a summary, exits non-zero if any step failed.
# Needs promtool (Debian's prometheus package; scripts/setup.sh) and python3.
set -u
cd "$(dirname "$0")/.."

PROMTOOL=${PROMTOOL:-$(command -v promtool || echo /usr/bin/promtool)}
if [ ! -x "$PROMTOOL" ]; then
    echo "deploy/test.sh: promtool not found (install Debian's prometheus package: scripts/setup.sh)" >&2
    exit 1
fi

results=()
failed=0
step() {
    local name=$1
    shift
    echo "== $name"
    if "$@"; then
        results+=("ok    $name")
    else
        results+=("FAIL  $name")
        failed=$((failed + 1))
    fi
}

step "promtool check rules" "$PROMTOOL" check rules deploy/prometheus/rules.yml
step "promtool test rules ($(ls deploy/prometheus/tests/*.yml | wc -l) files)" \
    "$PROMTOOL" test rules deploy/prometheus/tests/*.yml
step "mutation check of the alert tests" python3 deploy/prometheus/mutate.py --promtool "$PROMTOOL"
step "dashboard is what deploy/grafana/build.py writes" python3 deploy/grafana/build.py --check
step "check_dashboard.py (dashboard and rules use known series)" python3 deploy/check_dashboard.py --promtool "$PROMTOOL"
step "check_dashboard.py --self-test" python3 deploy/check_dashboard.py --promtool "$PROMTOOL" --self-test
if command -v ruff >/dev/null 2>&1; then
    step "ruff check and format (deploy/ruff.toml)" \
        bash -c 'cd deploy && ruff check --quiet . && ruff format --check --quiet .'
else
    results+=("skip  ruff (not installed; scripts/setup.sh installs it)")
fi

echo
echo "deploy/test.sh summary:"
printf '  %s\n' "${results[@]}"
if [ "$failed" -ne 0 ]; then
    echo "deploy/test.sh: $failed step(s) FAILED"
    exit 1
fi
echo "deploy/test.sh: passed"
