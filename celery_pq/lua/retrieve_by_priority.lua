-- retrieve_by_priority: RETRIEVE BY PRIORITY: the first waiting entry of one rank, without
-- leasing it. A stale pointer at the front of that rank is removed here (the deferred part of
-- an earlier REMOVE BY ID) and the next one is tried.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table: ranks with waiting entries (and their lists)
-- KEYS[3] lt  hash    leases
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] rank         0..255 (0 is served first)
-- ARGV[2] stale_budget  stale pointers to remove at most
-- Returns: {eid, score, value}, or {} when that rank has no waiting entry.
--          The error reply MODE_MISMATCH (nothing done) when the caller's mode is not the queue's.
-- ERR -8 MODE_MISMATCH
-- ERR -9 MIGRATING
--!include dead.lua
--!include index.lua
--!include queue.lua
--!keys

--!queue
local rank = tonumber(ARGV[1])
local stale_budget = tonumber(ARGV[2])
local stale = 0
while stale < stale_budget do
  local p, key = pi_head(pi, rank)
  if not p then
    redis.call('ZREM', pi, rank)
    return {}
  end
  local eid, score, v = pi_entry(ii, lt, p, rank)
  if eid then
    return { eid, score, v }
  end
  if eid == false then
    set_aside(ii, score, v, rank, now_ms())
  end
  pi_pop_head(pi, rank, key)
  stale = stale + 1
end
return {}
