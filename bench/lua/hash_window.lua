-- Sliding window in hash buckets (the "Hash 分桶" design): the Lua script a
-- user writes when the server has no rate-limit command, and the design
-- RL.HASHWINDOW replaces. Benchmarked against it (scripts/bench.sh,
-- bench/memory.sh).
--
-- EVALSHA <sha> 1 key limit window_ms bucket_ms [cost]
-- Reply, like RL.HASHWINDOW: {allowed, limit, remaining, wait_ms, reset_ms}
--
-- Time (the server's TIME) is cut into buckets of bucket_ms aligned on the
-- epoch; the window is the current bucket and the n - 1 before it, with
-- n = window_ms / bucket_ms. The hash has one field per bucket, named by the
-- bucket's number, holding its count. A call reads the n buckets one HGET at
-- a time, and on admission adds its cost to the current one (HINCRBY) and
-- sets the key to expire when that bucket leaves the window (PEXPIRE). Fields
-- that have left are deleted when the hash holds more than n of them, so a
-- busy key stays bounded. A denial writes nothing.
--
-- Like most such scripts it sums n buckets, the current one included, so a
-- unit stops counting when its bucket's start leaves the window: up to one
-- bucket early (RL.HASHWINDOW sums the n + 1 buckets the window touches).
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])
local bucket_ms = tonumber(ARGV[3])
local cost = tonumber(ARGV[4]) or 1
local n = window_ms / bucket_ms

local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local current = math.floor(now_ms / bucket_ms)

local counts = {}
local held = 0
for i = 1, n do
  local bucket = current - n + i
  local count = tonumber(redis.call('HGET', key, bucket)) or 0
  counts[i] = count
  held = held + count
end

if held + cost <= limit then
  if cost > 0 then
    redis.call('HINCRBY', key, current, cost)
    redis.call('PEXPIRE', key, (current + n) * bucket_ms - now_ms)
    if redis.call('HLEN', key) > n then
      for _, field in ipairs(redis.call('HKEYS', key)) do
        if tonumber(field) <= current - n then
          redis.call('HDEL', key, field)
        end
      end
    end
  end
  local reset_ms = 0
  if held + cost > 0 then
    local newest = current
    if cost == 0 then
      newest = nil
      for i = n, 1, -1 do
        if counts[i] > 0 then newest = current - n + i; break end
      end
    end
    reset_ms = (newest + n) * bucket_ms - now_ms
  end
  return {1, limit, limit - held - cost, 0, reset_ms}
end

-- Denied: wait until enough of the oldest buckets have left (bucket b leaves
-- at (b + n) * bucket_ms).
local wait_ms = -1
local reset_ms = 0
for i = n, 1, -1 do
  if counts[i] > 0 then reset_ms = (current - n + i + n) * bucket_ms - now_ms; break end
end
if cost <= limit then
  local freed = 0
  for i = 1, n do
    freed = freed + counts[i]
    if held - freed + cost <= limit then
      wait_ms = (current - n + i + n) * bucket_ms - now_ms
      break
    end
  end
end
return {0, limit, math.max(limit - held, 0), wait_ms, reset_ms}
