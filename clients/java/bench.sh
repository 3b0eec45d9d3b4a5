#!/usr/bin/env bash
# The Java kit's benchmark (`make bench-kit-java`, part of `make bench`):
# starts its own redis-server with the module on a free loopback port, then
# the example app (clients/java/redis-ratelimit-example) in process, driven
# over real HTTP by KitBench, which prints two tables:
#   1. @RateLimited's cost per request against the same endpoint without it;
#   2. Redis calls per 1,000 requests with and without the local level and
#      the deny cache, under a skewed load (90% of requests from one user);
#   3. the Limiter's decisions per second in process with metrics (Micrometer,
#      a Prometheus registry) and deny events on vs off, as a ratio;
#   4. one global limit offered twice over by 4 instances, plain then batched:
#      admitted per second against the bucket's bound, Redis calls per 1,000.
# A benchmark reports; it exits 0 whatever the figures are.
#
# Knobs: KIT_BENCH_N (requests per run, 20000), KIT_BENCH_C (connections, 16),
# KIT_BENCH_ROUNDS (3), KIT_BENCH_ONLY=observability (table 3 alone),
# KIT_BENCH_ONLY=grants (table 4 alone).
set -euo pipefail
cd "$(dirname "$0")/../.."

RL_NAME=bench-kit-java
# shellcheck source=../../scripts/lib/server.sh
. scripts/lib/server.sh
rl_module
rl_require redis-server java mvn
rl_workdir
(cd clients/java && mvn -q -B -DskipTests install) >&2
JAR=clients/java/redis-ratelimit-example/target/redis-ratelimit-example-0.1.0-SNAPSHOT.jar
rl_start "$RL_WORK/redis"
java -Dloader.main=io.redisratelimit.example.KitBench -cp "$JAR" \
  org.springframework.boot.loader.launch.PropertiesLauncher "$RL_PORT" || echo "bench-kit-java: KitBench failed" >&2
exit 0
