-- remove_highest: REMOVE HIGHEST PRIORITY: take the first waiting entry and delete it at once,
-- with no lease (for callers that do not need at-least-once delivery).
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table
-- KEYS[3] wk  list    wake tokens
-- KEYS[4] dp  hash    task id -> duplicate entry ids
-- ARGV[1] stale_budget stale members to discard at most
-- Returns: {eid, score, value}, or {} when no entry is waiting.
--!include common.lua

local ii, pi, wk, dp = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local stale_budget = tonumber(ARGV[1])
local stale = 0
while stale < stale_budget do
  local popped = redis.call('ZPOPMIN', pi)
  if #popped == 0 then
    redis.call('DEL', wk)
    return {}
  end
  local eid = popped[1]
  local v = redis.call('HGET', ii, eid)
  if v then
    redis.call('HDEL', ii, eid)
    local e = split_entry(v)
    if e.x == 'd' then
      dup_forget(dp, eid)
    end
    return { eid, popped[2], v }
  end
  stale = stale + 1
end
return {}
