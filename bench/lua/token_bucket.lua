-- Token bucket in a hash: the Lua script a user writes when the server has no
-- rate-limit command. RL.TOKENBUCKET is benchmarked against it (scripts/bench.sh).
--
-- EVALSHA <sha> 1 key capacity refill_count refill_ms [cost]
-- Reply, like RL.TOKENBUCKET: {allowed, limit, remaining, wait_ms, reset_ms}
--
-- State: hash fields `tokens` (a float: refill is continuous) and `ts` (ms of
-- the last refill). Time is the server's TIME, never the client's. A clock
-- step backwards refills nothing (ts never moves back). Only an admitted call
-- writes, and the key expires when the bucket would be full again.
local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local refill_count = tonumber(ARGV[2])
local refill_ms = tonumber(ARGV[3])
local cost = tonumber(ARGV[4]) or 1

local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local state = redis.call('HMGET', key, 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens = capacity
  ts = now_ms
elseif now_ms > ts then
  tokens = math.min(capacity, tokens + (now_ms - ts) * refill_count / refill_ms)
  ts = now_ms
end

local ms_per_token = refill_ms / refill_count
local allowed = 0
local wait_ms = 0
if cost <= tokens then
  allowed = 1
  tokens = tokens - cost
elseif cost > capacity then
  wait_ms = -1
else
  wait_ms = math.ceil((cost - tokens) * ms_per_token)
end
local reset_ms = math.ceil((capacity - tokens) * ms_per_token)

if allowed == 1 and cost > 0 then
  redis.call('HSET', key, 'tokens', tokens, 'ts', ts)
  redis.call('PEXPIRE', key, math.max(reset_ms, 1))
end
return {allowed, capacity, math.floor(tokens), wait_ms, reset_ms}
