-- remove: REMOVE BY ID of waiting entries, before delivery. The id is the caller's (a Celery
-- task id): the entry with that id and every duplicate "<id>~<seq>" of it are removed.
-- Technique T deletes from both tables at once (the pointer is found by its value in its
-- rank's list: O(its position)); technique S deletes from the identifier-indexed table only and
-- leaves the pointer to lazy deletion, as does a fair queue. Either frees the unique key an
-- entry held (includes/unique.lua).
-- Leased entries are not touched (they are counted in the reply). Delayed entries are removed
-- too; on a fair queue the tenant's order and schedule follow. Counts removed; logs remove.
-- An id sent many times has many duplicates: one call handles at most ARGV[3] of them (in the
-- order of dq, see includes/duplicates.lua) and answers where it stopped; the caller calls again
-- from there until the cursor it gets is "". Each entry is removed atomically, the id's as a
-- whole in steps.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table: ranks with waiting entries (and their lists)
-- KEYS[3] lt  hash    leases
-- KEYS[4] dz  zset    delayed entries
-- KEYS[5..12] te ts tb fv fc fn tw fr: fairness state (see includes/fair.lua)
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] id          the caller's id (a task id): its entry and every duplicate of it
-- ARGV[2] cursor      "" on the first call; then the cursor the last call answered
-- ARGV[3] step        duplicates handled at most in this call
-- Returns: {removed, leased_left_alone, cursor ("" when the id is done)}
--          The error reply MODE_MISMATCH (nothing done) when the caller's mode is not the queue's.
-- ERR -8 MODE_MISMATCH
-- ERR -9 MIGRATING
--!include counters.lua
--!include duplicates.lua
--!include events.lua
--!include fair.lua
--!include index.lua
--!include queue.lua
--!include records.lua
--!include unique.lua
--!keys

--!queue
local id = ARGV[1]
local fair = CTX.fair

local cursor, step = ARGV[2], tonumber(ARGV[3])
local ids, members = {}, {} -- entry ids; their dq member (nil: none)
if cursor == '' then
  ids[1] = id
end
local next_cursor = ''
if #id <= 65535 then
  local lo, hi = dup_range(id, cursor ~= '' and cursor or nil)
  local found = redis.call('ZRANGEBYLEX', key_of('dq'), lo, hi, 'LIMIT', 0, step)
  for _, m in ipairs(found) do
    ids[#ids + 1] = id .. '~' .. fmt(struct.unpack('>I6', m, #m - 5))
    members[#ids] = m
  end
  if #found == step then
    next_cursor = found[#found]
  end
end
local removed, leased = 0, 0
for i, eid in ipairs(ids) do
  if redis.call('HEXISTS', lt, eid) == 1 then
    leased = leased + 1
  elseif CTX.technique == 'S' and not fair then
    if members[i] then
      redis.call('ZREM', key_of('dq'), members[i])
    end
    local v = CTX.ev > 0 and redis.call('HGET', ii, eid) -- read only for the log
    if redis.call('ZSCORE', dz, eid) then
      redis.call('ZREM', dz, eid)
    end
    if redis.call('HDEL', ii, eid) == 1 then
      removed = removed + 1
      unique_release(eid) -- (its value is not read: one look-up in the entries holding a key)
      local e = v and split_entry(v)
      emit('remove', eid, e and e.s, e and e.t)
      if not members[i] then -- (the id itself may be "<task id>~<seq>")
        dup_forget(eid)
      end
    end
  else
    if members[i] then
      redis.call('ZREM', key_of('dq'), members[i])
    end
    local v = redis.call('HGET', ii, eid)
    if v then
      redis.call('HDEL', ii, eid)
      if not members[i] then -- (the id itself may be "<task id>~<seq>")
        dup_forget(eid)
      end
      removed = removed + 1
      local e = split_entry(v) -- a malformed one is removed as asked; its pointer goes lazily
      if e and holds_key(e.x) then
        unique_release(eid)
      end
      emit('remove', eid, e and e.s, e and e.t)
      if redis.call('ZREM', dz, eid) == 0 and e then
        local rank, seq = split_score(e.s)
        if fair then
          fair_drop(e.t, e.s, eid)
        else
          pi_drop(pi, rank, make_ptr(seq, eid))
        end
      end
    end
  end
end
tally('removed', removed)
flush_counts()
return { removed, leased, next_cursor }
