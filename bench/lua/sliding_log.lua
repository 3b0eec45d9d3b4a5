-- Sliding log in a sorted set: the Lua script a user writes when the server
-- has no rate-limit command. RL.SLIDING is benchmarked against it
-- (scripts/bench.sh, bench/memory.sh).
--
-- EVALSHA <sha> 1 key limit window_ms [cost]
-- Reply, like RL.SLIDING: {allowed, limit, remaining, wait_ms, reset_ms}
--
-- One member per admitted unit, scored with the server's millisecond (TIME,
-- never the client's clock). A call drops the members that have left the
-- window (ZREMRANGEBYSCORE), counts the rest (ZCARD), and on admission adds
-- its units (ZADD) and sets the key to expire when the newest has left
-- (PEXPIRE). A denial writes nothing but the trim. Members must be unique or
-- ZADD would overwrite instead of adding: "<seconds>.<micros>-<n>", where n
-- is the count held before the unit plus its rank, distinct for two calls in
-- the same microsecond since the first one's members are still held.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3]) or 1

local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- The window is (now - window_ms, now]: a member stamped s is held while
-- s + window_ms > now.
redis.call('ZREMRANGEBYSCORE', key, '-inf', now_ms - window_ms)
local held = redis.call('ZCARD', key)

if held + cost <= limit then
  if cost > 0 then
    local prefix = time[1] .. '.' .. time[2] .. '-'
    for i = 1, cost do
      redis.call('ZADD', key, now_ms, prefix .. (held + i))
    end
    redis.call('PEXPIRE', key, window_ms)
  end
  local reset_ms = 0
  if held + cost > 0 then
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    reset_ms = tonumber(newest[2]) + window_ms - now_ms
  end
  return {1, limit, limit - held - cost, 0, reset_ms}
end

local wait_ms = -1
if cost <= limit then
  -- The oldest held + cost - limit members must leave first.
  local last = redis.call('ZRANGE', key, held + cost - limit - 1, held + cost - limit - 1, 'WITHSCORES')
  wait_ms = tonumber(last[2]) + window_ms - now_ms
end
local reset_ms = 0
if held > 0 then
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  reset_ms = tonumber(newest[2]) + window_ms - now_ms
end
return {0, limit, math.max(limit - held, 0), wait_ms, reset_ms}
