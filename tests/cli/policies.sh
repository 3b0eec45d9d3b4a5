#!/usr/bin/env bash
# Policies: a rule kept in the server, tried in shadow, enforced in stages
# with ROLLOUT, and switched off in one command (the runbook is
# docs/operations.md).
source "$(dirname "$0")/lib.bash"

# A policy name is 1 to 256 bytes of printable ASCII without spaces.
policy=POST:/example/checkout
users=$(seq 1 20)
keys() { for u in $users; do echo "rl:checkout:user:$u"; done; }
cleanup() {
  cli RL.POLICY DEL "$policy" >/dev/null
  # shellcheck disable=SC2046 # one word per key
  cli DEL $(keys) rl:checkout:user:99 >/dev/null
}
# One INFO line per policy, its name percent-escaped:
# ratelimit_policy_POST%3A%2Fexample%2Fcheckout:calls=N,admitted=N,denied=N,shadow_denied=N,peeks=N
counter() {
  redis-cli -p "$PORT" INFO ratelimit | tr -d '\r' |
    sed -n "s/^ratelimit_policy_POST%3A%2Fexample%2Fcheckout:\(.*,\)\{0,1\}$1=\([0-9]*\).*/\2/p"
}
cleanup

# 1. The rule, in shadow: 2 checkouts, then one more per minute, per user.
expect "create the rule in shadow" "OK" \
  "$(cli RL.POLICY SET "$policy" TOKENBUCKET 2 1 60000 MODE SHADOW)"
expect_match "it is listed" "*$policy*" "$(cli RL.POLICY LIST)"
# A new policy's counters start at 0.
expect "no calls yet" "0" "$(counter calls)"
expect "first checkout" "1 2 1 0 60000" "$(cli RL.HIT "$policy" rl:checkout:user:1)"
expect "second checkout" "1 2 0 0" "$(fields "$(cli RL.HIT "$policy" rl:checkout:user:1)" 1-4)"
# The third would be denied: in shadow it is answered allowed, waits for
# nothing, takes nothing, and is counted apart.
expect "a would-be denial is allowed" "1 2 0 0" \
  "$(fields "$(cli RL.HIT "$policy" rl:checkout:user:1)" 1-4)"
expect "counted as shadow_denied" "1" "$(counter shadow_denied)"
expect "and as denied" "1" "$(counter denied)"
expect "out of 3 calls" "3" "$(counter calls)"

# Every user spends both checkouts (still in shadow).
for u in $users; do
  cli RL.HIT "$policy" "rl:checkout:user:$u" >/dev/null
  cli RL.HIT "$policy" "rl:checkout:user:$u" >/dev/null
done

# 2. Enforce in stages. Which users are enforced depends only on the key
# (FNV-1a of the key, mod 100, below ROLLOUT), so each stage keeps the users
# of the one before. Every bucket is empty: an enforced user is denied.
denied_users() {
  for u in $users; do
    reply=$(cli RL.HIT "$policy" "rl:checkout:user:$u")
    [[ $reply == 0* ]] && printf 'user:%s ' "$u"
  done
}
cli RL.POLICY SET "$policy" TOKENBUCKET 2 1 60000 MODE ENFORCE ROLLOUT 10 >/dev/null
expect "ROLLOUT 10" "user:15" "$(denied_users | xargs)"
cli RL.POLICY SET "$policy" TOKENBUCKET 2 1 60000 MODE ENFORCE ROLLOUT 30 >/dev/null
expect "ROLLOUT 30" "user:2 user:14 user:15" "$(denied_users | xargs)"
cli RL.POLICY SET "$policy" TOKENBUCKET 2 1 60000 MODE ENFORCE ROLLOUT 50 >/dev/null
expect "ROLLOUT 50" "user:2 user:3 user:8 user:9 user:14 user:15 user:16 user:17" \
  "$(denied_users | xargs)"
cli RL.POLICY SET "$policy" TOKENBUCKET 2 1 60000 >/dev/null
expect "ROLLOUT 100 (the default): everyone" "20" "$(denied_users | wc -w)"

# An enforced denial says how long to wait, and lands in the deny log.
reply=$(cli RL.HIT "$policy" rl:checkout:user:20)
expect "denied" "0 2 0" "$(fields "$reply" 1-3)"
expect_between "wait_ms: under a minute for one token" 1 60000 "$(fields "$reply" 4)"
entry=$(cli RL.LOG GET 1)
expect "newest deny-log entry: key, source, cost" "rl:checkout:user:20 policy:$policy 1" \
  "$(fields "$entry" 3-5)"

# 3. The kill switch: allowed at once, nothing read or written.
expect "switch it off" "OK" "$(cli RL.POLICY SET "$policy" TOKENBUCKET 2 1 60000 MODE OFF)"
expect "OFF answers allowed with the full limit" "1 2 2 0 0" \
  "$(cli RL.HIT "$policy" rl:checkout:user:99)"
expect "and creates no key" "0" "$(cli EXISTS rl:checkout:user:99)"
expect "the rule as stored" "name $policy algorithm TOKENBUCKET params 2 1 60000 mode OFF rollout 100" \
  "$(fields "$(cli RL.POLICY GET "$policy")" 1-12)"

# Back on: the buckets kept their state.
cli RL.POLICY SET "$policy" TOKENBUCKET 2 1 60000 >/dev/null
expect "back on, user:1 is still out of checkouts" "0" \
  "$(fields "$(cli RL.HIT "$policy" rl:checkout:user:1)" 1)"

expect "DEL answers 1" "1" "$(cli RL.POLICY DEL "$policy")"
expect "then the policy is unknown" "ERR unknown policy '$policy'" \
  "$(cli RL.HIT "$policy" rl:checkout:user:1)"
cleanup
done_testing
