#!/usr/bin/env bash
# Hash window: a sliding window made of fixed buckets, in fixed memory.
#
#   RL.HASHWINDOW key limit window_ms bucket_ms [COST n]
#   reply: allowed limit remaining wait_ms reset_ms
#
# 100 requests per minute, counted in 60 buckets of one second aligned on
# the Unix epoch: a request is admitted when the buckets of the last minute
# hold room for it. Units leave a bucket at a time, so the window slides in
# steps of bucket_ms.
source "$(dirname "$0")/lib.bash"

key=example:hw:api:42
cli DEL "$key" >/dev/null

reply=$(cli RL.HASHWINDOW "$key" 100 60000 1000 COST 30)
expect "30 of 100" "1 100 70 0" "$(fields "$reply" 1-4)"
expect_between "reset_ms: about a minute, to a bucket edge" 58000 61000 "$(fields "$reply" 5)"
expect "the key is a hash window" "rl-hashwn" "$(cli TYPE "$key")"
expect "COST 0 peeks" "1 100 70 0" "$(fields "$(cli RL.HASHWINDOW "$key" 100 60000 1000 COST 0)" 1-4)"

# 71 do not fit: denied until the bucket holding the 30 leaves the window,
# which is also when the window is empty.
reply=$(cli RL.HASHWINDOW "$key" 100 60000 1000 COST 71)
expect "71 more are denied" "0 100 70" "$(fields "$reply" 1-3)"
expect "wait_ms is reset_ms (one bucket holds everything)" "$(fields "$reply" 5)" "$(fields "$reply" 4)"
expect "more than the limit never fits" "0 100 -1" "$(fields "$(cli RL.HASHWINDOW "$key" 100 60000 1000 COST 101)" 1,2,4)"

# Memory is fixed: 2 bytes per bucket (while every count fits in 16 bits)
# and a small header, however busy.
expect_between "MEMORY USAGE of 60 buckets" 122 340 "$(cli MEMORY USAGE "$key")"

# bucket_ms must divide window_ms, and the number of buckets is bounded by
# the module config ratelimit.hashwindow-max-buckets (default 3600).
expect "buckets must tile the window" \
  "ERR bucket_ms must divide window_ms" \
  "$(cli RL.HASHWINDOW "$key" 100 60000 7000)"
expect "at most 3600 buckets by default" \
  "ERR window_ms / bucket_ms is above ratelimit.hashwindow-max-buckets (3600)" \
  "$(cli RL.HASHWINDOW "$key" 100 3601000 1000)"
expect "errors leave the limiter alone" "1 100 70 0" "$(fields "$(cli RL.HASHWINDOW "$key" 100 60000 1000 COST 0)" 1-4)"

cli DEL "$key" >/dev/null
done_testing
