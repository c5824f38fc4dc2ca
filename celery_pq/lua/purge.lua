-- purge: delete up to ARGV[1] waiting entries from the front of the queue (leased entries
-- stay leased). Called repeatedly by the client until it returns {0, 0}.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table
-- KEYS[3] wk  list    wake tokens
-- KEYS[4] dp  hash    task id -> duplicate entry ids
-- ARGV[1] count  members to take from the index in this call
-- Returns: {entries_deleted, members_taken}
--!include common.lua

local ii, pi, wk, dp = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local popped = redis.call('ZPOPMIN', pi, tonumber(ARGV[1]))
local deleted = 0
for i = 1, #popped, 2 do
  local eid = popped[i]
  local v = redis.call('HGET', ii, eid)
  if v then
    redis.call('HDEL', ii, eid)
    if split_entry(v).x == 'd' then
      dup_forget(dp, eid)
    end
    deleted = deleted + 1
  end
end
if redis.call('ZCARD', pi) == 0 then
  redis.call('DEL', wk)
end
return { deleted, #popped / 2 }
