-- cleanup: the bounded clean-up sweep of technique S: look at the first members of the
-- priority index and remove those whose entry is gone (deferred REMOVE BY ID).
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table
-- ARGV[1] start  rank in the index to start at
-- ARGV[2] count  members to look at
-- Returns: {removed, looked_at}
--!include common.lua

local ii, pi = KEYS[1], KEYS[2]
local start, count = tonumber(ARGV[1]), tonumber(ARGV[2])
local members = redis.call('ZRANGE', pi, start, start + count - 1)
local gone = {}
for _, eid in ipairs(members) do
  if redis.call('HEXISTS', ii, eid) == 0 then
    gone[#gone + 1] = eid
  end
end
if #gone > 0 then
  redis.call('ZREM', pi, unpack(gone))
end
return { #gone, #members }
