-- Duplicate entry ids: an id sent while an entry holds it gets "<id>~<seq>" (free_id), and the
-- duplicates of a task id are recorded (dq) so a remove by id finds them all.
--!include queue.lua

-- The duplicates of a task id (entry ids "<task id>~<seq>") are members of the sorted set dq
-- (derived key; all scores 0, so in byte order): the id's length in 2 bytes, the id, the seq in
-- 6 bytes. One id's duplicates are one range (dup_range), so each is added, found and dropped in
-- O(log n), however often the id was sent.
local function dup_member(tid, seq)
  return struct.pack('>I2', #tid) .. tid .. struct.pack('>I6', seq)
end

-- The ZRANGEBYLEX bounds of task id tid's members in dq (after member `after`, when given).
local function dup_range(tid, after)
  local prefix = struct.pack('>I2', #tid) .. tid
  return after and ('(' .. after) or ('[' .. prefix), '(' .. prefix .. '\255' -- (a seq's first byte is < 16)
end

local function dup_add(tid, seq)
  redis.call('ZADD', key_of('dq'), 0, dup_member(tid, seq))
end

-- Forget a duplicate entry id "<task id>~<seq>" (its member of dq). An entry whose id has that
-- form and that leaves the table for any reason is forgotten (its flags may be unreadable), so
-- no record of a task id's duplicates names an id a later entry takes.
local function dup_forget(eid)
  local tid, seq = string.match(eid, '^(.*)~(%d+)$')
  if not tid or #tid > 65535 then
    return
  end
  redis.call('ZREM', key_of('dq'), dup_member(tid, tonumber(seq)))
end

-- An id for eid in hash h that no entry there has: eid itself, else eid "~" seq, with a new
-- seq from sq for as long as the id is taken (a user may have given an id of that form).
local function free_id(h, eid, sq, seq)
  if redis.call('HEXISTS', h, eid) == 0 then
    return eid, nil
  end
  local id = eid .. '~' .. fmt(seq)
  while redis.call('HEXISTS', h, id) == 1 do
    seq = redis.call('INCR', sq)
    id = eid .. '~' .. fmt(seq)
  end
  return id, seq
end
