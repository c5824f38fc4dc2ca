-- retrieve_by_priority: RETRIEVE BY PRIORITY: the first waiting entry of one rank, without
-- leasing it. Under technique S a member whose entry is gone is removed here (the deferred
-- part of an earlier REMOVE BY ID) and the next one of that rank is tried.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table
-- ARGV[1] rank         0..255 (0 is served first)
-- ARGV[2] stale_budget stale members to remove at most
-- Returns: {eid, score, value}, or {} when that rank has no waiting entry.
--!include common.lua

local ii, pi = KEYS[1], KEYS[2]
local rank = tonumber(ARGV[1])
local stale_budget = tonumber(ARGV[2])
local lo = fmt(rank * SEQ_SPAN)
local hi = '(' .. fmt((rank + 1) * SEQ_SPAN)
local stale = 0
while true do
  local m = redis.call('ZRANGEBYSCORE', pi, lo, hi, 'WITHSCORES', 'LIMIT', 0, 1)
  if #m == 0 then
    return {}
  end
  local v = redis.call('HGET', ii, m[1])
  if v then
    return { m[1], m[2], v }
  end
  redis.call('ZREM', pi, m[1])
  stale = stale + 1
  if stale >= stale_budget then
    return {}
  end
end
