#!/usr/bin/env bash
# Token bucket basics.
#
#   RL.TOKENBUCKET key capacity refill_count refill_ms [COST n]
#   reply: allowed limit remaining wait_ms reset_ms
#
# A bucket of 5 tokens that gets 1 token back every minute: bursts of 5, then
# one request a minute. The bucket starts full and refills continuously.
source "$(dirname "$0")/lib.bash"

key=example:tb:user:42
cli DEL "$key" >/dev/null

# The first call is admitted and leaves 4 tokens; the bucket is full again
# (and the key gone) 60000 ms later.
expect "a new bucket starts full" \
  "1 5 4 0 60000" "$(cli RL.TOKENBUCKET "$key" 5 1 60000)"
expect "the key is a token bucket" "rl-tokbkt" "$(cli TYPE "$key")"
expect_between "its TTL is reset_ms" 1 60000 "$(cli PTTL "$key")"

# Four more calls empty it.
for remaining in 3 2 1 0; do
  reply=$(cli RL.TOKENBUCKET "$key" 5 1 60000)
  expect "admitted, $remaining left" "1 5 $remaining 0" "$(fields "$reply" 1-4)"
done

# The sixth is denied: wait_ms says when to retry (HTTP Retry-After), about
# one minute; reset_ms says when the bucket is full again, about five.
reply=$(cli RL.TOKENBUCKET "$key" 5 1 60000)
expect "the sixth call is denied, nothing left" "0 5 0" "$(fields "$reply" 1-3)"
expect_between "wait_ms: about a minute" 50000 60000 "$(fields "$reply" 4)"
expect_between "reset_ms: about five minutes" 290000 300000 "$(fields "$reply" 5)"

# Waiting wait_ms is enough: a bucket of 1 token per 200 ms.
fast=example:tb:fast
cli DEL "$fast" >/dev/null
expect "admitted" "1" "$(fields "$(cli RL.TOKENBUCKET "$fast" 1 1 200)" 1)"
reply=$(cli RL.TOKENBUCKET "$fast" 1 1 200)
expect "denied right after" "0" "$(fields "$reply" 1)"
wait_ms=$(fields "$reply" 4)
expect_between "wait_ms" 1 200 "$wait_ms"
sleep "$(printf '0.%03d' "$wait_ms")"
expect "admitted after waiting wait_ms" "1" "$(fields "$(cli RL.TOKENBUCKET "$fast" 1 1 200)" 1)"

cli DEL "$key" "$fast" >/dev/null
done_testing
