-- remove: REMOVE BY ID of waiting entries, before delivery. The id is the caller's (a Celery
-- task id): the entry with that id and every duplicate "<id>~<seq>" of it are removed.
-- Technique T deletes from both tables at once; technique S deletes from the
-- identifier-indexed table only and leaves the priority-index member to lazy deletion.
-- Leased entries are not touched (they are counted in the reply).
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table
-- KEYS[3] lt  hash    leases
-- KEYS[4] dp  hash    task id -> duplicate entry ids
-- ARGV[1] id
-- ARGV[2] technique   "T" or "S"
-- Returns: {removed, leased_left_alone}
--!include common.lua

local ii, pi, lt, dp = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, technique = ARGV[1], ARGV[2]

local ids = { id }
local list = redis.call('HGET', dp, id)
if list then
  for e in string.gmatch(list, '[^' .. DUP_SEP .. ']+') do
    ids[#ids + 1] = e
  end
end
local removed, leased = 0, 0
local kept = {}
for i, eid in ipairs(ids) do
  if redis.call('HEXISTS', lt, eid) == 1 then
    leased = leased + 1
    if i > 1 then
      kept[#kept + 1] = eid
    end
  elseif redis.call('HDEL', ii, eid) == 1 then
    removed = removed + 1
    if technique == 'T' then
      redis.call('ZREM', pi, eid)
    end
  end
end
if list then
  dup_store(dp, id, kept)
end
return { removed, leased }
