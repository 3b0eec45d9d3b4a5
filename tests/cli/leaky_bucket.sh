#!/usr/bin/env bash
# Leaky bucket: a shaping queue.
#
#   RL.LEAKYBUCKET key capacity leak_count leak_ms [COST n]
#   reply: allowed limit remaining wait_ms reset_ms
#
# A queue of 5 that lets one request through every 10 seconds. A request is
# not refused while the queue has room: wait_ms tells it when its turn comes,
# so callers that wait it act 10 seconds apart, with no burst at all.
# remaining is the room left in the queue, reset_ms the time until it is
# empty (the key's TTL).
source "$(dirname "$0")/lib.bash"

key=example:lb:sms:42
cli DEL "$key" >/dev/null

reply=$(cli RL.LEAKYBUCKET "$key" 5 1 10000)
expect "the first request goes at once" "1 5 4 0" "$(fields "$reply" 1-4)"
expect_between "the queue is empty again 10 s later" 9000 10000 "$(fields "$reply" 5)"
expect "the key is a leaky bucket" "rl-leakbk" "$(cli TYPE "$key")"
expect_between "its TTL is reset_ms" 1 10000 "$(cli PTTL "$key")"

# Two more at once: each waits for the ones ahead of it.
reply=$(cli RL.LEAKYBUCKET "$key" 5 1 10000)
expect "the second is queued" "1 5 3" "$(fields "$reply" 1-3)"
expect_between "and acts about 10 s later" 9000 10000 "$(fields "$reply" 4)"
reply=$(cli RL.LEAKYBUCKET "$key" 5 1 10000)
expect "the third is queued" "1 5 2" "$(fields "$reply" 1-3)"
expect_between "and acts about 20 s later" 19000 20000 "$(fields "$reply" 4)"

# COST 0 peeks: the delay a request sent now would get, nothing queued.
reply=$(cli RL.LEAKYBUCKET "$key" 5 1 10000 COST 0)
expect "peek: 2 places left" "1 5 2" "$(fields "$reply" 1-3)"
expect_between "a request now would act about 30 s later" 29000 30000 "$(fields "$reply" 4)"

# A request of 2 units fills the queue; the next one is denied until a place
# frees up, and 6 units never fit in a queue of 5.
expect "2 units take the last 2 places" "1 5 0" "$(fields "$(cli RL.LEAKYBUCKET "$key" 5 1 10000 COST 2)" 1-3)"
reply=$(cli RL.LEAKYBUCKET "$key" 5 1 10000)
expect "a full queue denies" "0 5 0" "$(fields "$reply" 1-3)"
expect_between "wait_ms: until one unit has left" 1 10000 "$(fields "$reply" 4)"
expect_between "reset_ms: until all 5 have left" 49000 50000 "$(fields "$reply" 5)"
expect "6 units never fit" "0 5 -1" "$(fields "$(cli RL.LEAKYBUCKET "$key" 5 1 10000 COST 6)" 1,2,4)"

# Waiting wait_ms is enough: a queue of 1 that drains one unit per 200 ms.
fast=example:lb:fast
cli DEL "$fast" >/dev/null
expect "admitted" "1" "$(fields "$(cli RL.LEAKYBUCKET "$fast" 1 1 200)" 1)"
reply=$(cli RL.LEAKYBUCKET "$fast" 1 1 200)
expect "denied right after" "0" "$(fields "$reply" 1)"
wait_ms=$(fields "$reply" 4)
expect_between "wait_ms" 1 200 "$wait_ms"
sleep "$(printf '0.%03d' "$wait_ms")"
expect "admitted after waiting wait_ms" "1" "$(fields "$(cli RL.LEAKYBUCKET "$fast" 1 1 200)" 1)"

expect "a bad parameter is named" \
  "ERR leak_ms must be an integer from 1 to 1099511627776" \
  "$(cli RL.LEAKYBUCKET "$key" 5 1 0)"

cli DEL "$key" "$fast" >/dev/null
done_testing
