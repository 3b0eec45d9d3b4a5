#!/usr/bin/env bash
# Two production set-ups, each a per-user limit and a global one checked
# together with RL.ALL: a request passes only if both admit, and a request
# the global limit refuses costs the user nothing.
#
#   1. Order API: each user 5 requests per second (bursts of 5), the endpoint
#      15,000 per second in all.
#   2. Order submission: each user 10 per minute, exactly (sliding log), and
#      1,000 per second for the whole service.
#
# Keys share a hash tag ({order:api}, {order:submit}) so that in a cluster
# each call's keys are in one slot (see docs/cluster.md).
source "$(dirname "$0")/lib.bash"

# Runs the commands given on stdin, one per line, as one MULTI/EXEC and
# prints each RL.ALL reply (six integers) on a line. A transaction runs its
# commands back to back, within microseconds: a burst, as a real one arrives,
# with no token coming back in between.
burst() {
  { echo MULTI; cat; echo EXEC; } | redis-cli -p "$PORT" |
    sed '/^$/d' | sed '/^OK$/d; /^QUEUED$/d' | paste -d' ' - - - - - -
}
line() { sed -n "$1p" <<<"$2"; }

echo "1. Order API"
keys=()
first='example:{order:api}:user:41'
user='example:{order:api}:user:42'
endpoint='example:{order:api}:endpoint'
keys+=("$first" "$user" "$endpoint")
cli DEL "${keys[@]}" >/dev/null
order_api=(TOKENBUCKET 5 5 1000 FIXEDWINDOW 15000 1000)

# The call an API gateway makes per request:
#   RL.ALL 2 <user key> <endpoint key> TOKENBUCKET 5 5 1000 FIXEDWINDOW 15000 1000
reply=$(cli RL.ALL 2 "$first" "$endpoint" "${order_api[@]}")
expect "a request is admitted; the user's bucket is the tighter limit" "1 5 4 0" "$(fields "$reply" 1-4)"
expect "denied_by 0" "0" "$(fields "$reply" 6)"

# A burst of 7 from another user: the bucket holds 5, so 5 pass and the
# rest are refused by limiter 1 (the user's bucket), told to retry when the
# next token is back (a token every 200 ms).
replies=$(for _ in 1 2 3 4 5 6 7; do echo "RL.ALL 2 $user $endpoint ${order_api[*]}"; done | burst)
for n in 1 2 3 4 5; do
  expect "burst call $n admitted, $((5 - n)) left" "1 5 $((5 - n)) 0" "$(fields "$(line "$n" "$replies")" 1-3,6)"
done
for n in 6 7; do
  expect "burst call $n denied by the user's limit (1)" "0 5 0 1" "$(fields "$(line "$n" "$replies")" 1-3,6)"
  expect_between "burst call $n: retry within 200 ms" 1 200 "$(fields "$(line "$n" "$replies")" 4)"
done

# The same with a small endpoint limit (3 per second standing for 15,000) to
# see it deny: users 1 and 2 use it up, user 3 is refused by limiter 2 and
# keeps every one of their own tokens.
small='example:{order:api}:endpoint:small'
u1='example:{order:api}:user:1'
u2='example:{order:api}:user:2'
u3='example:{order:api}:user:3'
keys+=("$small" "$u1" "$u2" "$u3")
cli DEL "$small" "$u1" "$u2" "$u3" >/dev/null
small_api=(TOKENBUCKET 5 5 1000 FIXEDWINDOW 3 1000)
# The endpoint's windows are aligned on the second: the burst must land in
# one of them, so it starts with at least 500 ms of it left.
away_from_window_end 1000 500
replies=$(burst <<EOF
RL.ALL 2 $u1 $small ${small_api[*]}
RL.ALL 2 $u1 $small ${small_api[*]}
RL.ALL 2 $u2 $small ${small_api[*]}
RL.ALL 2 $u3 $small ${small_api[*]}
EOF
)
expect "user 1, user 1, user 2 admitted" "1 1 1" \
  "$(fields "$(line 1 "$replies")" 1) $(fields "$(line 2 "$replies")" 1) $(fields "$(line 3 "$replies")" 1)"
expect "user 3 denied by the endpoint (limiter 2, limit 3)" "0 3 0 2" "$(fields "$(line 4 "$replies")" 1-3,6)"
expect "user 3's bucket was not touched" "0" "$(cli EXISTS "$u3")"
expect "user 3 still has 5 tokens" "1 5 5 0 0" "$(cli RL.TOKENBUCKET "$u3" 5 5 1000 COST 0)"
# In the endpoint's next window (they are aligned on the second), user 3 gets in.
for _ in $(seq 50); do
  reply=$(cli RL.ALL 2 "$u3" "$small" "${small_api[@]}")
  [ "$(fields "$reply" 1)" = 1 ] && break
  sleep 0.1
done
expect "user 3 admitted in the next window" "1 0" "$(fields "$reply" 1,6)"

echo "2. Order submission"
user='example:{order:submit}:user:7'
global='example:{order:submit}:global'
keys+=("$user" "$global")
cli DEL "$user" "$global" >/dev/null
order_submit=(SLIDING 10 60000 TOKENBUCKET 1000 1000 1000)

# 11 submissions at once: the first 10 pass, the 11th is refused by the
# user's own limit and told to come back when the first leaves the minute.
replies=$(for _ in $(seq 11); do echo "RL.ALL 2 $user $global ${order_submit[*]}"; done | burst)
for n in $(seq 10); do
  expect "submission $n admitted, $((10 - n)) left this minute" "1 10 $((10 - n)) 0" \
    "$(fields "$(line "$n" "$replies")" 1-3,6)"
done
expect "submission 11 denied by the user's limit (1)" "0 10 0 1" "$(fields "$(line 11 "$replies")" 1-3,6)"
expect_between "retry in about a minute" 59000 60001 "$(fields "$(line 11 "$replies")" 4)"

# With a small global limit (3 per second standing for 1,000): user 3 is
# refused by it and keeps all 10 of their submissions for the minute.
small='example:{order:submit}:global:small'
u1='example:{order:submit}:user:1'
u2='example:{order:submit}:user:2'
u3='example:{order:submit}:user:3'
keys+=("$small" "$u1" "$u2" "$u3")
cli DEL "$small" "$u1" "$u2" "$u3" >/dev/null
small_submit=(SLIDING 10 60000 TOKENBUCKET 3 3 1000)
replies=$(burst <<EOF
RL.ALL 2 $u1 $small ${small_submit[*]}
RL.ALL 2 $u1 $small ${small_submit[*]}
RL.ALL 2 $u2 $small ${small_submit[*]}
RL.ALL 2 $u3 $small ${small_submit[*]}
EOF
)
expect "user 3 denied by the global limit (2)" "0 3 0 2" "$(fields "$(line 4 "$replies")" 1-3,6)"
expect_between "retry when a global token is back (one per 334 ms)" 1 334 "$(fields "$(line 4 "$replies")" 4)"
expect "user 3's log was not created" "0" "$(cli EXISTS "$u3")"
expect "user 3 has 10 submissions left" "1 10 10 0 0" "$(cli RL.SLIDING "$u3" 10 60000 COST 0)"
for _ in $(seq 50); do
  reply=$(cli RL.ALL 2 "$u3" "$small" "${small_submit[@]}")
  [ "$(fields "$reply" 1)" = 1 ] && break
  sleep 0.1
done
expect "user 3 admitted once a global token is back" "1 0" "$(fields "$reply" 1,6)"
expect "and has 9 left: only that one counted" "1 10 9 0" \
  "$(fields "$(cli RL.SLIDING "$u3" 10 60000 COST 0)" 1-4)"

cli DEL "${keys[@]}" >/dev/null
done_testing
