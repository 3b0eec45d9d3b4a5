#!/usr/bin/env bash
# Sliding log: an exact limit over the last window_ms, wherever the window
# starts.
#
#   RL.SLIDING key limit window_ms [COST n]
#   reply: allowed limit remaining wait_ms reset_ms
#
# 3 login attempts per minute. Each admitted request is logged (at the next
# whole millisecond) and counts for exactly one window after it: there is no
# window edge where a second burst gets through.
source "$(dirname "$0")/lib.bash"

key=example:sl:login:42
cli DEL "$key" >/dev/null

for remaining in 2 1 0; do
  reply=$(cli RL.SLIDING "$key" 3 60000)
  expect "admitted, $remaining left" "1 3 $remaining 0" "$(fields "$reply" 1-4)"
  # The window is empty a minute after this request (+1 ms of rounding).
  expect_between "reset_ms: a minute" 60000 60001 "$(fields "$reply" 5)"
done
expect "the key is a sliding log" "rl-slilog" "$(cli TYPE "$key")"

# The fourth is denied until the first attempt is a minute old.
reply=$(cli RL.SLIDING "$key" 3 60000)
expect "the fourth is denied" "0 3 0" "$(fields "$reply" 1-3)"
expect_between "wait_ms: until the first leaves" 50000 60001 "$(fields "$reply" 4)"
expect "COST 0 peeks" "1 3 0 0" "$(fields "$(cli RL.SLIDING "$key" 3 60000 COST 0)" 1-4)"
expect "more than the limit never fits" "0 3 -1" "$(fields "$(cli RL.SLIDING "$key" 3 60000 COST 4)" 1,2,4)"

# No double burst: 2 per 400 ms. 200 ms after a burst the log still holds
# it, whatever the clock says; it frees up one window after the burst.
short=example:sl:short
cli DEL "$short" >/dev/null
expect "a burst of 2" "1 2 0" "$(fields "$(cli RL.SLIDING "$short" 2 400 COST 2)" 1-3)"
sleep 0.2
reply=$(cli RL.SLIDING "$short" 2 400)
expect "200 ms later: still denied" "0 2 0" "$(fields "$reply" 1-3)"
wait_ms=$(fields "$reply" 4)
expect_between "wait_ms: the rest of the window" 1 201 "$wait_ms"
sleep "$(printf '0.%03d' "$wait_ms")"
expect "admitted once the burst left" "1" "$(fields "$(cli RL.SLIDING "$short" 2 400)" 1)"

# The largest limit is a module config (each held unit takes memory).
expect "the default bound" "ratelimit.sliding-max-limit 100000" "$(cli CONFIG GET ratelimit.sliding-max-limit)"
expect "a limit above it is refused" \
  "ERR limit is above ratelimit.sliding-max-limit (100000)" \
  "$(cli RL.SLIDING example:sl:big 100001 1000)"
expect "it can be changed at run time" "OK" "$(cli CONFIG SET ratelimit.sliding-max-limit 200000)"
expect "and applies at once" "1 100001 100000" "$(fields "$(cli RL.SLIDING example:sl:big 100001 1000)" 1-3)"
cli CONFIG SET ratelimit.sliding-max-limit 100000 >/dev/null

cli DEL "$key" "$short" example:sl:big >/dev/null
done_testing
