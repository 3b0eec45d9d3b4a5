#!/usr/bin/env bash
# What bad input gets: an error naming the argument, and nothing written.
source "$(dirname "$0")/lib.bash"

key=example:errors:k
cli DEL "$key" example:errors:string >/dev/null

expect "capacity must be a positive integer" \
  "ERR capacity must be an integer from 1 to 1099511627776" \
  "$(cli RL.TOKENBUCKET "$key" 0 1 1000)"
expect "refill_count is named" \
  "ERR refill_count must be an integer from 1 to 1099511627776" \
  "$(cli RL.TOKENBUCKET "$key" 5 -1 1000)"
expect "refill_ms is named" \
  "ERR refill_ms must be an integer from 1 to 1099511627776" \
  "$(cli RL.TOKENBUCKET "$key" 5 1 1.5)"
expect "limit is named" \
  "ERR limit must be an integer from 1 to 1099511627776" \
  "$(cli RL.FIXEDWINDOW "$key" abc 1000)"
expect "window_ms is named" \
  "ERR window_ms must be an integer from 1 to 1099511627776" \
  "$(cli RL.FIXEDWINDOW "$key" 5 1099511627777)"
expect "COST is named" \
  "ERR COST must be an integer from 0 to 1099511627776" \
  "$(cli RL.TOKENBUCKET "$key" 5 1 1000 COST -2)"

expect_match "an unknown option is named" \
  "ERR*BURST*" \
  "$(cli RL.TOKENBUCKET "$key" 5 1 1000 BURST 10)"
expect_match "too few arguments: the usual arity error" \
  "ERR wrong number of arguments*" \
  "$(cli RL.TOKENBUCKET "$key" 5 1)"
expect "AT is internal" \
  "ERR AT is reserved for replication and AOF loading" \
  "$(cli RL.TOKENBUCKET "$key" 5 1 1000 AT 1700000000000000)"
expect "a fixed offset beyond 18 hours names TZ" \
  "ERR TZ offset must be between -18:00 and +18:00, not '+25:00'" \
  "$(cli RL.QUOTA "$key" 5 DAY TZ +25:00)"
expect "none of that wrote anything" "0" "$(cli EXISTS "$key")"

# A key of another type is refused, and left alone.
cli SET example:errors:string hello >/dev/null
expect_match "a string key: WRONGTYPE" \
  "WRONGTYPE*" \
  "$(cli RL.TOKENBUCKET example:errors:string 5 1 1000)"
expect "the string is untouched" "hello" "$(cli GET example:errors:string)"

cli DEL "$key" example:errors:string >/dev/null
done_testing
