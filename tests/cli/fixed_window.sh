#!/usr/bin/env bash
# Fixed window basics.
#
#   RL.FIXEDWINDOW key limit window_ms [COST n]
#   reply: allowed limit remaining wait_ms reset_ms
#
# 3 requests per window of one hour. Windows are aligned to multiples of
# window_ms since the Unix epoch, so every node agrees where they start.
source "$(dirname "$0")/lib.bash"

key=example:fw:api:login
window_ms=3600000
cli DEL "$key" >/dev/null

# Where are we in the current window? (TIME: seconds, microseconds)
time=$(cli TIME)
now_ms=$(( $(fields "$time" 1) * 1000 + $(fields "$time" 2) / 1000 ))
to_end_ms=$(( window_ms - now_ms % window_ms ))
if ((to_end_ms < 5000)); then
  # Too close to the end of the hour: let this window pass first.
  sleep $(( to_end_ms / 1000 + 1 ))
  time=$(cli TIME)
  now_ms=$(( $(fields "$time" 1) * 1000 + $(fields "$time" 2) / 1000 ))
  to_end_ms=$(( window_ms - now_ms % window_ms ))
fi

for remaining in 2 1 0; do
  reply=$(cli RL.FIXEDWINDOW "$key" 3 $window_ms)
  expect "admitted, $remaining left" "1 3 $remaining 0" "$(fields "$reply" 1-4)"
  # reset_ms: until the end of the aligned window.
  expect_between "resets at the end of the hour" $((to_end_ms - 5000)) $((to_end_ms + 1)) "$(fields "$reply" 5)"
done
expect "the key is a fixed window" "rl-fixwin" "$(cli TYPE "$key")"

# The fourth is denied until the window ends.
reply=$(cli RL.FIXEDWINDOW "$key" 3 $window_ms)
expect "the fourth call is denied" "0 3 0" "$(fields "$reply" 1-3)"
expect "wait_ms is the time to the window's end" "$(fields "$reply" 5)" "$(fields "$reply" 4)"

# A short window: 1 request per 300 ms. Once it is used, wait_ms says when
# the next window opens.
short=example:fw:short
cli DEL "$short" >/dev/null
for try in 1 2 3; do
  reply=$(cli RL.FIXEDWINDOW "$short" 1 300)
  # Two calls in one window: the second is denied (unless a window edge
  # passed between them; then try again).
  ((try > 1)) && [[ $(fields "$reply" 1) == 0 ]] && break
done
expect "denied once the window is used" "0 1 0" "$(fields "$reply" 1-3)"
wait_ms=$(fields "$reply" 4)
expect_between "wait_ms" 1 300 "$wait_ms"
sleep "$(printf '0.%03d' "$wait_ms")"
reply=$(cli RL.FIXEDWINDOW "$short" 1 300)
expect "admitted in the next window" "1 1 0 0" "$(fields "$reply" 1-4)"

cli DEL "$key" "$short" >/dev/null
done_testing
