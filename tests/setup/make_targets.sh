#!/usr/bin/env bash
# Checks, with `make -n` (nothing is built or run), that the benchmark
# targets build what they measure on a fresh clone: `make bench` builds the
# module and bench/floor (the floor every ratio is taken against) before it
# runs scripts/bench.sh, and `make bench-compare` builds the module it
# compares. Prints one line per case, then "N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

passed=0
failed=0
# check NAME TARGET PATTERN...: the commands `make -n TARGET` prints contain
# every PATTERN (extended regexps), each on a line after the previous one.
check() {
  local name="$1" target="$2" line=0 at
  shift 2
  local plan
  # BEFORE: bench-compare's argument; MAKEFLAGS cleared so a parent -j or -k
  # does not change the plan.
  plan=$(MAKEFLAGS= make -n "$target" BEFORE=/nonexistent/before.so 2>&1)
  for pattern in "$@"; do
    at=$(tail -n "+$((line + 1))" <<<"$plan" | grep -n -m1 -E -e "$pattern" | cut -d: -f1)
    if [ -z "$at" ]; then
      echo "FAIL $name: no line matching '$pattern' (after line $line) in:"
      sed 's/^/    /' <<<"$plan"
      failed=$((failed + 1))
      return
    fi
    line=$((line + at))
  done
  echo "PASS $name"
  passed=$((passed + 1))
}

check "make bench builds the module, then the floor, then measures" bench \
  '^cargo build --release$' \
  '^cargo build --release -p ratelimit-bench-floor' \
  'scripts/bench\.sh'
check "make bench-compare builds the module, then compares" bench-compare \
  '^cargo build --release$' \
  'bench/compare\.sh'
check "make bench-rls builds the gateway and its load, then measures" bench-rls \
  '^cargo build --release$' \
  '^cargo build --release -p redis-ratelimit-rls .*--example rls_load' \
  'bench/rls/run\.sh'
check "make rls builds the gateway, then runs it" rls \
  '^cargo build --release$' \
  '^cargo build --release -p redis-ratelimit-rls' \
  'scripts/rls\.sh'

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
