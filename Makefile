# redis-ratelimit: `make run` to try it, `make test` to check everything.
SHELL := /bin/bash
MODULE := target/release/libredis_ratelimit.so

.PHONY: all setup build run test test-unit test-integration test-cli lint bench trace cluster cluster-stop clean

all: build

setup:
	@scripts/setup.sh

build: setup
	cargo build --release

$(MODULE): build

run: build
	scripts/run.sh

# Everything: unit and property tests, integration tests against real
# redis-server and valkey-server, the redis-cli example scripts, fmt and clippy.
test: build test-unit test-integration test-cli lint

test-unit:
	cargo test --release --lib

test-integration:
	RL_MODULE=$(CURDIR)/$(MODULE) VALKEY_SERVER=$$(scripts/valkey-path.sh) cargo test --release --test '*'

test-cli:
	RL_MODULE=$(CURDIR)/$(MODULE) scripts/cli-tests.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --release --all-targets -- -D warnings

bench: build
	RL_MODULE=$(CURDIR)/$(MODULE) scripts/bench.sh

# The pictures of docs/algorithms.md, from a real run against the module.
trace: build
	python3 bench/trace.py --json docs/img/trace.json

# A 3-master, 3-replica cluster on loopback with the module on every node
# (KIND=valkey for Valkey); see docs/cluster.md.
cluster: build
	RL_MODULE=$(CURDIR)/$(MODULE) scripts/cluster.sh start $(KIND)

cluster-stop:
	scripts/cluster.sh stop $(KIND)

clean:
	cargo clean
