#!/usr/bin/env bash
# COST: a request that takes several units, and COST 0 to look without
# taking anything.
source "$(dirname "$0")/lib.bash"

key=example:cost:upload
cli DEL "$key" >/dev/null

# A bucket of 10 MB, 1 MB back per minute; an upload of 4 MB takes 4.
reply=$(cli RL.TOKENBUCKET "$key" 10 1 60000 COST 4)
expect "a 4 MB upload is admitted, 6 left" "1 10 6 0 240000" "$reply"

# COST 0 peeks: nothing is taken, nothing is written.
reply=$(cli RL.TOKENBUCKET "$key" 10 1 60000 COST 0)
expect "peek: allowed, still 6 left" "1 10 6 0" "$(fields "$reply" 1-4)"
expect "peek on a key that does not exist" "1 10 10 0 0" "$(cli RL.TOKENBUCKET example:cost:nobody 10 1 60000 COST 0)"
expect "and it is not created" "0" "$(cli EXISTS example:cost:nobody)"

# 8 MB does not fit in 6: denied, nothing taken; wait_ms says when it would
# fit (2 MB more, 2 minutes less the time since the upload).
reply=$(cli RL.TOKENBUCKET "$key" 10 1 60000 COST 8)
expect "an 8 MB upload is denied" "0 10 6" "$(fields "$reply" 1-3)"
expect_between "wait_ms until 8 fit" 110000 120000 "$(fields "$reply" 4)"

# 11 MB never fits in a bucket of 10: wait_ms is -1.
reply=$(cli RL.TOKENBUCKET "$key" 10 1 60000 COST 11)
expect "an 11 MB upload never fits" "0 10 -1" "$(fields "$reply" 1,2,4)"

# The same for a fixed window: 100 units per hour. Windows are aligned to
# the hour: the calls below start with at least 10 s of it left.
fw=example:cost:window
cli DEL "$fw" >/dev/null
away_from_window_end 3600000 10000
reply=$(cli RL.FIXEDWINDOW "$fw" 100 3600000 COST 30)
expect "30 of 100 units" "1 100 70 0" "$(fields "$reply" 1-4)"
reply=$(cli RL.FIXEDWINDOW "$fw" 100 3600000 COST 0)
expect "peek: 70 left" "1 100 70 0" "$(fields "$reply" 1-4)"
reply=$(cli RL.FIXEDWINDOW "$fw" 100 3600000 COST 101)
expect "more than the limit never fits" "0 100 -1" "$(fields "$reply" 1,2,4)"

cli DEL "$key" "$fw" >/dev/null
done_testing
