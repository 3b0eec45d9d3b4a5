# redis-ratelimit: `make run` to try it, `make test` to check everything.
SHELL := /bin/bash
MODULE := target/release/libredis_ratelimit.so

.PHONY: all setup build run test test-setup test-unit test-integration test-cli test-kit-rust test-kit-java test-kit-python test-kit-node test-kit-go test-rls lint lint-python lint-go bench bench-floor bench-compare bench-grants bench-kit-rust bench-kit-java bench-kit-node bench-kit-go bench-rls rls example example-java trace cluster cluster-stop clean fuzz

all: build

setup:
	@scripts/setup.sh

build: setup
	cargo build --release

$(MODULE): build

run: build
	scripts/run.sh

# Everything: the install checks of scripts/setup.sh, unit and property
# tests, integration tests against real redis-server (7.0 and 8.2) and
# valkey-server, the redis-cli example scripts, the Rust, Java, Python and
# Node client kits, the INFO exporter, the alert rules and the dashboard
# (promtool), fmt and clippy, ruff and mypy.
# scripts/test-all.sh: one suite after the other; TEST_PARALLEL=1 runs the
# other kits and deploy/ in a lane of their own beside the cargo suites.
test: build
	MAKE="$(MAKE)" scripts/test-all.sh

# scripts/setup.sh's package detection, against fake package managers; the
# benchmark targets build what they measure (make -n).
test-setup:
	tests/setup/detect.sh
	tests/setup/make_targets.sh

# (The gateway's unit tests start redis-server with the module for a few of
# its parts: RL_MODULE.)
test-unit: build
	RL_MODULE=$(CURDIR)/$(MODULE) cargo test --profile test-release --workspace --lib

# The integration suite on Redis 7.0, Valkey and Redis 8.2, one process per
# server side by side (scripts/integration-tests.sh).
test-integration:
	RL_MODULE=$(CURDIR)/$(MODULE) scripts/integration-tests.sh

test-cli:
	RL_MODULE=$(CURDIR)/$(MODULE) scripts/cli-tests.sh

# The Rust client kit (clients/rust): its unit tests, and its own servers,
# cluster and example-service processes (docs/clients.md).
test-kit-rust:
	RL_MODULE=$(CURDIR)/$(MODULE) VALKEY_SERVER=$$(scripts/valkey-path.sh) cargo test --profile test-release -p redis-ratelimit-client

# The kit's example service (per-user 5/s and global 15,000/s in one RL.ALL)
# on 127.0.0.1:3000, against `make run`'s server (RL_URL to change it).
example:
	cargo run --release -p redis-ratelimit-client --example service

# The Java kit (clients/java): JUnit 5 against redis-server processes with
# the module, started by the tests on free ports, then the client's tests
# again on valkey-server; Maven Central's dependencies land in ~/.m2 on the
# first run.
test-kit-java:
	cd clients/java && RL_MODULE=$(CURDIR)/$(MODULE) mvn -q -B verify
	cd clients/java && RL_MODULE=$(CURDIR)/$(MODULE) REDIS_SERVER=$$(cd $(CURDIR) && scripts/valkey-path.sh) \
		mvn -q -B -pl redis-ratelimit-client surefire:test

# Seed 000's order API on the Java kit, against `make run`'s server
# (REDIS_URL, default redis://127.0.0.1:6379); see docs/clients.md.
example-java:
	cd clients/java && mvn -q -B -DskipTests install && \
		mvn -q -B -f redis-ratelimit-example/pom.xml spring-boot:run

# The Python kit (clients/python) against real servers with the module: the
# typed calls (standalone, Sentinel, a 3-master cluster), the limits storage,
# flask-limiter and slowapi apps and the ASGI middleware over real HTTP.
test-kit-python:
	cd clients/python && RL_MODULE=$(CURDIR)/$(MODULE) VALKEY_SERVER=$$($(CURDIR)/scripts/valkey-path.sh) python3 -m pytest -q -p no:cacheprovider

lint-python:
	cd clients/python && ruff check src tests examples bench && ruff format --check src tests examples bench && mypy

# The Node kit (clients/node): tsc's strict check, the ESM+CJS build, a
# user's TypeScript against the built .d.ts (test/types), then
# node's test runner against redis-server with this module (and plain
# servers, for rate-limiter-flexible's own store to compare with).
test-kit-node: setup
	cd clients/node && npm run --silent typecheck && npm run --silent build && npm run --silent typecheck:consumer
	cd clients/node && RL_MODULE=$(abspath $(MODULE)) VALKEY_SERVER=$$($(CURDIR)/scripts/valkey-path.sh) node --test --test-concurrency=1 test/*.test.mjs

# The go command of scripts/go-path.sh first on PATH (the e2e tests and the
# benchmarks' scripts run `go` themselves).
GO_PATH_ENV = PATH="$$(dirname "$$($(CURDIR)/scripts/go-path.sh)"):$$PATH"

# The Go kit (clients/go): `go test -race` against real redis-server (7.0
# and 8.2), valkey-server, Sentinel and a 3-master cluster, started by the
# tests (internal/testserver); the example service as real processes. The
# go command is one of at least 1.26 (scripts/go-path.sh; scripts/setup.sh
# installs it from the Go module proxy when the machine has none).
test-kit-go: setup
	cd clients/go && $(GO_PATH_ENV) RL_MODULE=$(abspath $(MODULE)) VALKEY_SERVER=$$($(CURDIR)/scripts/valkey-path.sh) \
		REDIS82_SERVER=$$($(CURDIR)/scripts/redis8-path.sh) go test -race -count=1 -p 1 -timeout 15m ./...

# go vet, gofmt and staticcheck (honnef.co/go/tools, pinned; the go command
# fetches it from the Go module proxy and checks it against go.sum's database).
lint-go: setup
	cd clients/go && export $(GO_PATH_ENV) && go vet ./... && \
		unformatted=$$(gofmt -l .) && { [ -z "$$unformatted" ] || { echo "gofmt: $$unformatted"; exit 1; }; } && \
		go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

# The INFO exporter (exporter/): its parsing, and scrapes of real
# redis-server and valkey-server nodes checked by promtool (docs/operations.md).
test-exporter: build
	RL_MODULE=$(CURDIR)/$(MODULE) VALKEY_SERVER=$$(scripts/valkey-path.sh) cargo test --profile test-release -p redis-ratelimit-exporter

# The alert and recording rules (promtool check and test rules, each alert's
# threshold flipped must fail its test) and the Grafana dashboard's queries
# (deploy/test.sh; docs/monitoring.md).
test-deploy:
	deploy/test.sh

# The gateway (rls/): its unit tests and its end-to-end tests, which start
# redis-server, a 3-master cluster and the redis-ratelimit-rls binary, and
# ask it over real gRPC and HTTP (docs/gateway.md).
test-rls: build
	RL_MODULE=$(CURDIR)/$(MODULE) VALKEY_SERVER=$$(scripts/valkey-path.sh) cargo test --profile test-release -p redis-ratelimit-rls

# Envoy's rate limit service on the `make run` server (or on a server of its
# own when nothing answers on 6379), with rls/examples/rls.yaml.
rls: build
	cargo build --release -p redis-ratelimit-rls
	scripts/rls.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --release --all-targets --workspace -- -D warnings

# The floor every ratio of `make bench` is taken against: bench/floor, a
# workspace member that `make build` (the module alone) leaves out.
bench-floor: build
	cargo build --release -p ratelimit-bench-floor

# One global limit larger than one node (docs/cluster.md): a 3-master
# cluster, client processes offering twice the limit on one global token
# bucket, one key vs batched vs striped vs both, side by side.
bench-grants: build
	RL_MODULE=$(CURDIR)/$(MODULE) bench/grants/run.sh

# redis-ratelimit-rls against envoyproxy/ratelimit (built from the Go module
# proxy) on one Redis: calls/s, Redis calls and CPU per request, and what
# each admits across a window boundary (docs/benchmarks.md).
bench-rls: build
	cargo build --release -p redis-ratelimit-rls --bin redis-ratelimit-rls --example rls_load
	RL_MODULE=$(CURDIR)/$(MODULE) bench/rls/run.sh

bench: build bench-floor bench-kit-rust bench-kit-java bench-kit-node bench-kit-go bench-grants bench-rls
	RL_MODULE=$(CURDIR)/$(MODULE) scripts/bench.sh
	RL_MODULE=$(CURDIR)/$(MODULE) python3 bench/limits_python.py
	RL_MODULE=$(CURDIR)/$(MODULE) python3 bench/blocking.py
	RL_MODULE=$(CURDIR)/$(MODULE) python3 bench/protection.py
	RL_MODULE=$(CURDIR)/$(MODULE) python3 clients/python/bench/metrics.py

# This build against another one, side by side (bench/compare.sh):
# make bench-compare BEFORE=/abs/path/to/other/libredis_ratelimit.so
bench-compare: build
	RL_MODULE=$(CURDIR)/$(MODULE) RL_MODULE_BEFORE=$(BEFORE) bench/compare.sh

# The client kit's side of the benchmark: the layer's cost per request, and
# Redis calls saved by the local level and the deny cache.
bench-kit-rust: build
	RL_MODULE=$(CURDIR)/$(MODULE) clients/rust/bench.sh

# The Java kit's side of the benchmark: @RateLimited's cost per request, and
# Redis calls per 1,000 requests with and without the local level and the
# deny cache (clients/java/bench.sh).
bench-kit-java: build
	RL_MODULE=$(CURDIR)/$(MODULE) clients/java/bench.sh

# The Node kit's side: RateLimiterRL (one RL.SLIDING per consume) against
# rate-limiter-flexible's RateLimiterRedis, side by side at 64 callers; then
# decisions/s with metrics and deny events on vs off (bench/metrics.mjs).
# The Go kit: its local path (deny cache and local level, decisions per
# second per core), redisrate against go-redis/redis_rate v10 on one server,
# and the net/http middleware against a bare handler under load.
bench-kit-go: build
	$(GO_PATH_ENV) RL_MODULE=$(CURDIR)/$(MODULE) clients/go/bench/local/run.sh
	$(GO_PATH_ENV) RL_MODULE=$(CURDIR)/$(MODULE) clients/go/bench/redisrate/run.sh
	cd clients/go && $(GO_PATH_ENV) RL_MODULE=$(CURDIR)/$(MODULE) go run ./bench/middleware -c 32 -d 5s

bench-kit-node: build
	cd clients/node && npm run --silent build && RL_MODULE=$(abspath $(MODULE)) node bench/flexible.mjs && \
		RL_MODULE=$(abspath $(MODULE)) node bench/metrics.mjs

# The pictures of docs/algorithms.md, from a real run against the module.
trace: build
	python3 bench/trace.py --json docs/img/trace.json

# A 3-master, 3-replica cluster on loopback with the module on every node
# (KIND=valkey for Valkey); see docs/cluster.md.
cluster: build
	RL_MODULE=$(CURDIR)/$(MODULE) scripts/cluster.sh start $(KIND)

cluster-stop:
	scripts/cluster.sh stop $(KIND)

# Fuzzing (docs/fuzzing.md): each cargo-fuzz target for FUZZ_SECONDS, seeded
# from fuzz/corpus and fuzz/regressions, which stay untouched: new inputs go to
# fuzz/scratch/<target>, crashes to fuzz/artifacts/<target>. Fails if any
# target crashed. Nightly if rustup has it, else stable with RUSTC_BOOTSTRAP=1
# (or say which: FUZZ_CARGO="env RUSTC_BOOTSTRAP=1 cargo").
# Not part of `make test`: the corpus is replayed there by `cargo test --lib`.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= command rdb
FUZZ_ARGS ?= -rss_limit_mb=2048 -malloc_limit_mb=64 -timeout=10 -print_final_stats=1
FUZZ_CARGO ?= $(shell cargo +nightly --version >/dev/null 2>&1 && echo "cargo +nightly" || echo "env RUSTC_BOOTSTRAP=1 cargo")

fuzz:
	@command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
	@echo "fuzz: $(FUZZ_CARGO) fuzz, $(FUZZ_SECONDS) s per target: $(FUZZ_TARGETS)"
	@failed=""; \
	for target in $(FUZZ_TARGETS); do \
		mkdir -p fuzz/scratch/$$target; \
		seeds="fuzz/corpus/$$target"; \
		if [ -d fuzz/regressions/$$target ]; then seeds="$$seeds fuzz/regressions/$$target"; fi; \
		$(FUZZ_CARGO) fuzz run -O -a $$target fuzz/scratch/$$target $$seeds -- \
			-max_total_time=$(FUZZ_SECONDS) $(FUZZ_ARGS) \
			|| failed="$$failed $$target"; \
	done; \
	if [ -n "$$failed" ]; then \
		echo "fuzz: crashed:$$failed (inputs in fuzz/artifacts/, see docs/fuzzing.md)"; exit 1; \
	fi; \
	echo "fuzz: no crash; new inputs in fuzz/scratch/ (docs/fuzzing.md says how to merge them)"

clean:
	cargo clean
