-- change_priority: a waiting entry moves to another priority, behind the entries already
-- waiting there (the patent's REMOVE BY ID followed by INSERT with the same id, in one step).
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table
-- KEYS[3] lt  hash    leases
-- KEYS[4] sq  string  insertion sequence
-- ARGV[1] entry id
-- ARGV[2] rank        new rank, 0..255 (0 is served first)
-- ARGV[3] technique   "T" or "S"
-- Returns: 1 changed, or an error code.
-- ERR -1 NOT_FOUND
-- ERR -4 NOT_WAITING
--!include common.lua

local ii, pi, lt, sq = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local eid, rank, technique = ARGV[1], tonumber(ARGV[2]), ARGV[3]

if redis.call('HEXISTS', lt, eid) == 1 then
  return -4
end
local score = fmt(rank * SEQ_SPAN + redis.call('INCR', sq))
if technique == 'T' then
  local v = redis.call('HGET', ii, eid)
  if not v then
    return -1
  end
  local e, bar = split_entry(v)
  e.s = score
  redis.call('HSET', ii, eid, join_entry(e, v, bar))
elseif redis.call('HEXISTS', ii, eid) == 0 then
  return -1
end
redis.call('ZADD', pi, score, eid)
return 1
