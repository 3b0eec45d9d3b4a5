#!/usr/bin/env bash
# REFUND: give back what a request took when it failed before doing any work.
# FORCE: take units even past the limit, as a penalty (a failed login counted
# twice), leaving the limiter in debt.
source "$(dirname "$0")/lib.bash"

key=example:refund:user:7
cli DEL "$key" >/dev/null

# 5 requests per user, 1 back every 10 minutes (nothing refills meanwhile).
expect "a request is admitted" "1 5 4 0" "$(fields "$(cli RL.TOKENBUCKET "$key" 5 1 600000)" 1-4)"
expect "a second one" "1 5 3 0" "$(fields "$(cli RL.TOKENBUCKET "$key" 5 1 600000)" 1-4)"

# The second request failed upstream before any work: give its unit back.
# The reply is what COST 0 would say after the refund.
expect "refund 1: 4 left again" "1 5 4 0" "$(fields "$(cli RL.TOKENBUCKET "$key" 5 1 600000 REFUND 1)" 1-4)"
# Never more than was taken: the bucket is full, not above it.
expect "refund 10: full, no more" "1 5 5 0 0" "$(cli RL.TOKENBUCKET "$key" 5 1 600000 REFUND 10)"

# A failed login costs 3 on top of the 5 already taken: FORCE takes them
# anyway and answers allowed, with what the call would have said otherwise.
cli RL.TOKENBUCKET "$key" 5 1 600000 COST 5 >/dev/null
reply=$(cli RL.TOKENBUCKET "$key" 5 1 600000 COST 3 FORCE)
expect "the penalty is taken" "1 5 0" "$(fields "$reply" 1-3)"
# In debt: 8 of 5 taken, so the next request waits for 4 units to come back
# (40 minutes), not 1.
reply=$(cli RL.TOKENBUCKET "$key" 5 1 600000)
expect "denied while in debt" "0 5 0" "$(fields "$reply" 1-3)"
expect_between "wait_ms covers the debt" 2399000 2400000 "$(fields "$reply" 4)"
# The debt stops at one limit beyond empty: 10 of 5 at most.
cli RL.TOKENBUCKET "$key" 5 1 600000 COST 1000 FORCE >/dev/null
expect "refund 5: still empty" "1 5 0" "$(fields "$(cli RL.TOKENBUCKET "$key" 5 1 600000 REFUND 5)" 1-3)"
expect "refund 1 more: one left" "1 5 1" "$(fields "$(cli RL.TOKENBUCKET "$key" 5 1 600000 REFUND 1)" 1-3)"

# Errors name the argument and change nothing.
expect "REFUND with COST" "ERR REFUND cannot be given with COST" "$(cli RL.TOKENBUCKET "$key" 5 1 600000 REFUND 1 COST 1)"
expect_match "a negative refund" "ERR REFUND must be an integer from 0 to *" "$(cli RL.TOKENBUCKET "$key" 5 1 600000 REFUND -1)"

# A sliding log gives back its newest units first.
log=example:refund:log
cli DEL "$log" >/dev/null
cli RL.SLIDING "$log" 10 3600000 COST 6 >/dev/null
expect "refund 4 of the log's 6" "1 10 8" "$(fields "$(cli RL.SLIDING "$log" 10 3600000 REFUND 4)" 1-3)"

cli DEL "$key" "$log" >/dev/null
done_testing
