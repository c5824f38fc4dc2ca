-- remove_highest: REMOVE HIGHEST PRIORITY: take the first waiting entry and delete it at once,
-- with no lease (for callers that do not need at-least-once delivery). Counts removed; logs
-- remove (r "highest").
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table: ranks with waiting entries (and their lists)
-- KEYS[3] wk  list    wake tokens
-- KEYS[4] lt  hash    leases
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] stale_budget  stale pointers to discard at most
-- Returns: {eid, score, value}, or {} when no entry is waiting.
--          The error reply MODE_MISMATCH (nothing done) when the caller's mode is not the queue's.
-- ERR -8 MODE_MISMATCH
-- ERR -9 MIGRATING
--!include counters.lua
--!include dead.lua
--!include duplicates.lua
--!include events.lua
--!include index.lua
--!include queue.lua
--!include unique.lua
--!keys

--!queue
local stale_budget = tonumber(ARGV[1])
local stale = 0
while stale < stale_budget do
  local popped = pi_take(pi, 0, 255, 1)
  if #popped == 0 then
    redis.call('DEL', wk)
    return {}
  end
  local eid, score, v, e = pi_entry(ii, lt, popped[1], popped[2])
  if eid == false then
    set_aside(ii, score, v, popped[2], now_ms())
  elseif eid then
    redis.call('HDEL', ii, eid)
    entry_gone(eid, e.x)
    tally('removed')
    emit('remove', eid, score, e.t, nil, nil, 'highest')
    flush_counts()
    return { eid, score, v }
  end
  stale = stale + 1
end
return {}
