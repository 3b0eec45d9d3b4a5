#!/usr/bin/env bash
# Prints the path of a `go` command of at least the Go kit's version
# (clients/go/go.mod's `go` line, 1.26): $GO, `go` on PATH, /usr/local/go's,
# or the toolchain scripts/setup.sh unpacks from the Go module proxy into
# $GO_TOOLCHAIN_DIR (default /usr/local/lib/redis-ratelimit-go). Each
# candidate is asked its own version (`go env GOVERSION`), never judged by
# its path. Exits 1 if none is new enough.
set -euo pipefail
GO_MIN="${GO_MIN:-1.26}"
GO_TOOLCHAIN_DIR="${GO_TOOLCHAIN_DIR:-/usr/local/lib/redis-ratelimit-go}"

# new_enough go1.26.8 -> 0 when >= GO_MIN
new_enough() {
  local v="${1#go}" maj min want_maj want_min
  maj="${v%%.*}"; v="${v#*.}"; min="${v%%[.a-z]*}"
  want_maj="${GO_MIN%%.*}"; want_min="${GO_MIN#*.}"
  [[ "$maj" =~ ^[0-9]+$ && "$min" =~ ^[0-9]+$ ]] || return 1
  (( maj > want_maj || (maj == want_maj && min >= want_min) ))
}

# shellcheck disable=SC2086 # GO_SEARCH is a list of paths
for candidate in "${GO:-}" "$(command -v go 2>/dev/null || true)" ${GO_SEARCH-/usr/local/go/bin/go} "$GO_TOOLCHAIN_DIR/bin/go"; do
  [ -n "$candidate" ] && [ -x "$candidate" ] || continue
  # GOTOOLCHAIN=local: the version of this binary, not one it would fetch.
  version=$(GOTOOLCHAIN=local "$candidate" env GOVERSION 2>/dev/null) || continue
  if new_enough "$version"; then echo "$candidate"; exit 0; fi
done
exit 1
