-- cleanup: the bounded clean-up sweep of lazy deletion: look at up to ARGV[3] pointers of one
-- rank's list from position ARGV[2] and remove the stale ones (deferred REMOVE BY ID).
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table: ranks with waiting entries (and their lists)
-- KEYS[3] lt  hash    leases
-- ARGV[0] the queue context (see includes/common.lua): sent last, taken off ARGV first
-- ARGV[1] rank   0..255
-- ARGV[2] start  position in that rank's list to start at
-- ARGV[3] count  pointers to look at
-- Returns: {removed, looked_at}
--          The error reply MODE_MISMATCH (nothing done) when the caller's mode is not the queue's.
-- ERR -8 MODE_MISMATCH
--!include common.lua
--!keys

--!queue
local rank, start, count = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local key = level_key(pi, rank)
local ptrs = redis.call('LRANGE', key, start, start + count - 1)
local gone = 0
for _, p in ipairs(ptrs) do
  if pi_entry(ii, lt, p, rank) == nil then
    redis.call('LREM', key, 1, p)
    gone = gone + 1
  end
end
if redis.call('EXISTS', key) == 0 then
  redis.call('ZREM', pi, rank)
end
return { gone, #ptrs }
