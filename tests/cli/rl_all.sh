#!/usr/bin/env bash
# RL.ALL: several limiters in one call, all or nothing.
#
#   RL.ALL numkeys key [key ...] <spec> [<spec> ...] [COST n]
#   spec:  TOKENBUCKET capacity refill_count refill_ms
#          FIXEDWINDOW limit window_ms
#          LEAKYBUCKET capacity leak_count leak_ms
#          SLIDING limit window_ms
#          HASHWINDOW limit window_ms bucket_ms
#          POLICY name
#   reply: allowed limit remaining wait_ms reset_ms denied_by
#
# One spec per key, in the same order. Units are taken from every limiter
# only if every one admits; otherwise nothing changes anywhere. The first five
# integers are those of the most restrictive limiter (fewest units left; for
# a denial, the longest wait); denied_by is the position (1-based) of the
# first limiter that said no, 0 when admitted.
#
# In a cluster, all the keys of one call must be in one slot: give them a
# common hash tag, like {signup} here.
source "$(dirname "$0")/lib.bash"

alice='example:{signup}:user:alice'
bob='example:{signup}:user:bob'
carol='example:{signup}:user:carol'
all='example:{signup}:all'
cli DEL "$alice" "$bob" "$carol" "$all" >/dev/null

# Each user may try 5 times an hour (a bucket of 5, one back every 12
# minutes); all users together 3 times a minute (sliding window).
user_rule=(TOKENBUCKET 5 1 720000)
all_rule=(SLIDING 3 60000)

# Alice's first try: both limiters admit. The shared limit (3) has the fewest
# units left (2), so the reply is its: limit 3, remaining 2.
reply=$(cli RL.ALL 2 "$alice" "$all" "${user_rule[@]}" "${all_rule[@]}")
expect "admitted by both; the shared limit is the tighter" "1 3 2 0" "$(fields "$reply" 1-4)"
expect "denied_by 0: admitted" "0" "$(fields "$reply" 6)"
expect "a unit was taken from Alice's bucket too" "1 5 4 0" \
  "$(fields "$(cli RL.TOKENBUCKET "$alice" 5 1 720000 COST 0)" 1-4)"

# Bob takes two more: the shared limit is used up.
cli RL.ALL 2 "$bob" "$all" "${user_rule[@]}" "${all_rule[@]}" >/dev/null
reply=$(cli RL.ALL 2 "$bob" "$all" "${user_rule[@]}" "${all_rule[@]}")
expect "Bob's second try takes the last shared unit" "1 3 0 0" "$(fields "$reply" 1-4)"

# Carol is denied by the shared limit, the 2nd limiter: denied_by 2, and
# wait_ms says when the oldest unit leaves the minute.
reply=$(cli RL.ALL 2 "$carol" "$all" "${user_rule[@]}" "${all_rule[@]}")
expect "Carol is denied by limiter 2" "0 3 0 2" "$(fields "$reply" 1-3,6)"
expect_between "wait_ms: under a minute" 1 60001 "$(fields "$reply" 4)"
# All or nothing: her own bucket was not touched, not even created.
expect "Carol's bucket was not created" "0" "$(cli EXISTS "$carol")"
expect "she still has her 5 tries" "1 5 5 0 0" "$(cli RL.TOKENBUCKET "$carol" 5 1 720000 COST 0)"

# A denial changes nothing anywhere: the shared log is byte for byte what it
# was (DUMP, printed escaped by --no-raw).
dump_all() { redis-cli -p "$PORT" --no-raw DUMP "$all"; }
before=$(dump_all)
cli RL.ALL 2 "$alice" "$all" "${user_rule[@]}" "${all_rule[@]}" >/dev/null
expect "the shared limiter is unchanged by a denied call" "$before" "$(dump_all)"
expect "and Alice keeps her 4" "1 5 4 0" \
  "$(fields "$(cli RL.TOKENBUCKET "$alice" 5 1 720000 COST 0)" 1-4)"

# COST n takes n units from every limiter; COST 0 looks at all of them.
reply=$(cli RL.ALL 2 "$alice" "$all" "${user_rule[@]}" "${all_rule[@]}" COST 0)
expect "COST 0: allowed, takes nothing" "1 3 0 0" "$(fields "$reply" 1-3,6)"

# Any of the five algorithms, in any mix (here with a fresh pair of keys).
mix_a='example:{mix}:a'
mix_b='example:{mix}:b'
cli DEL "$mix_a" "$mix_b" >/dev/null
reply=$(cli RL.ALL 2 "$mix_a" "$mix_b" HASHWINDOW 100 60000 1000 FIXEDWINDOW 10 3600000 COST 4)
expect "4 units from a hash window and a fixed window" "1 10 6 0" "$(fields "$reply" 1-4)"
expect "each key has its own type" "rl-hashwn rl-fixwin" "$(cli TYPE "$mix_a") $(cli TYPE "$mix_b")"

# Mistakes are refused before anything is touched.
expect "an unknown policy" "ERR unknown policy 'checkout'" \
  "$(cli RL.ALL 2 "$alice" "$all" "${user_rule[@]}" POLICY checkout)"
expect "a key given twice" "ERR key '$alice' is given more than once" \
  "$(cli RL.ALL 2 "$alice" "$alice" "${user_rule[@]}" "${user_rule[@]}")"
expect "one spec per key" "ERR 2 keys need 2 specs, got 1" \
  "$(cli RL.ALL 2 "$alice" "$all" "${user_rule[@]}")"
expect "numkeys from 1 to 16" "ERR numkeys must be an integer from 1 to 16" \
  "$(cli RL.ALL 0 "$alice" "${user_rule[@]}")"
expect_match "an unknown algorithm" "ERR spec 2: unknown algorithm 'GCRA'*" \
  "$(cli RL.ALL 2 "$alice" "$all" "${user_rule[@]}" GCRA 5 1000)"
expect "a bad parameter is named" "ERR window_ms must be an integer from 1 to 1099511627776" \
  "$(cli RL.ALL 2 "$alice" "$all" "${user_rule[@]}" SLIDING 3 0)"
cli SET 'example:{signup}:string' hello >/dev/null
expect "WRONGTYPE on any key stops the whole call" \
  "WRONGTYPE Operation against a key holding the wrong kind of value" \
  "$(cli RL.ALL 2 "$carol" 'example:{signup}:string' "${user_rule[@]}" "${all_rule[@]}")"
expect "so Carol's bucket is still not there" "0" "$(cli EXISTS "$carol")"

cli DEL "$alice" "$bob" "$carol" "$all" "$mix_a" "$mix_b" 'example:{signup}:string' >/dev/null
done_testing
