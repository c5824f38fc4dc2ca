-- Unique keys (docs/unique.md): which entry stands for a key, per queue. Two hashes derived
-- from the stem, so they share the queue's hash tag:
--   uq  key -> record "<kind>|<until ms>|<entry id>": kind "e" while the entry stands for the
--       key (modes while_waiting, while_active, replace, debounce; until unused, ""), kind "t"
--       a throttle record: the key stands until "until" (ms, Redis clock), whatever became of
--       the entry stored then (its id is the one a throttled publish is told of).
--   ue  entry id -> key, for each entry that holds a key of kind "e" (flag "u" in the entry):
--       an ack, dead letter or removal of such an entry frees its key at once (unique_release).
-- The records are the caller's word, not the truth: a record of kind "e" stands only while
-- its entry is in ii with the flag "u" (and, for while_waiting, is not leased); the insert
-- checks that (unique_standing), so a path that misses the eager release leaks no key. The
-- sweep prunes records that stand no more, a bounded number per call (unique_prune).
--!include duplicates.lua
--!include events.lua
--!include fair.lua
--!include queue.lua
--!include records.lua

-- What a publish of each mode letter of insert.lua's ARGV (while_waiting, while_active,
-- throttle, replace, debounce) comes to when an entry stands for its key (a constant).
local UNIQUE_KINDS = { w = 'merged', a = 'merged', t = 'throttled', r = 'replaced', d = 'debounced' } -- kept between calls

local function unique_record(rec)
  return string.match(rec, '^(%a)|(%d*)|(.*)$')
end

-- Does entry eid hold a key (flag "u")? Its flags are the fourth field of its header.
local function holds_key(x)
  return x ~= '' and string.find(x, 'u', 1, true) ~= nil
end

-- Is entry id eid the one of task id id, or a duplicate "<id>~<seq>" of it?
local function same_task(eid, id)
  return id ~= '' and (eid == id or string.sub(eid, 1, #id + 1) == id .. '~')
end

-- The entry standing for key for a publish of mode m and entry id id at now: nil when none
-- stands, else a table {eid, state ("waiting", "delayed", "leased"; "throttle" for a throttle
-- record), v, e, bar}. A publish of the very task that stands and runs (or was stored within
-- the throttle period) is its retry (Celery's retry sends the task's id and headers again): for
-- it nothing stands, or the retry would be merged into the run that asked for it and be lost.
local function unique_standing(ii, lt, dz, key, m, now, id)
  local rec = redis.call('HGET', key_of('uq'), key)
  if not rec then
    return nil
  end
  local kind, untl, eid = unique_record(rec)
  if m == 't' then
    if kind == 't' and tonumber(untl) > now and not same_task(eid, id) then
      return { eid = eid, state = 'throttle' }
    end
    return nil
  end
  if kind ~= 'e' then
    return nil
  end
  local v = redis.call('HGET', ii, eid)
  if not v then
    return nil
  end
  local e, bar = split_entry(v)
  if not e or not holds_key(e.x) then -- (an id taken again by an entry without the key)
    return nil
  end
  local state = 'waiting'
  if redis.call('HEXISTS', lt, eid) == 1 then
    if m == 'w' or same_task(eid, id) then
      return nil
    end
    state = 'leased'
  elseif redis.call('ZSCORE', dz, eid) then
    state = 'delayed'
  end
  return { eid = eid, state = state, v = v, e = e, bar = bar }
end

-- Record that entry eid (stored now) stands for key under mode m (throttle: until now + ms).
local function unique_hold(key, m, ms, eid, now)
  if m == 't' then
    redis.call('HSET', key_of('uq'), key, 't|' .. fmt(now + ms) .. '|' .. eid)
  else
    redis.call('HSET', key_of('uq'), key, 'e||' .. eid)
    redis.call('HSET', key_of('ue'), eid, key)
  end
end

-- Take entry s (standing for key, waiting or delayed: unique_standing) out of queue ii, for a
-- replace or a debounce (logged as what); its pointer, if waiting, is left to lazy deletion
-- (or taken over by the new entry: insert.lua).
local function unique_drop(ii, dz, dp, s, what, key)
  redis.call('HDEL', ii, s.eid)
  redis.call('HDEL', key_of('ue'), s.eid)
  if s.state == 'delayed' then
    redis.call('ZREM', dz, s.eid)
  elseif CTX.fair then
    fair_drop(s.e.t, s.e.s, s.eid)
  end
  dup_forget(dp, s.eid)
  emit(what, s.eid, s.e.s, s.e.t, nil, nil, key)
end

-- Entry eid, which held a key (flag "u"), left the table (acked, dead-lettered, removed,
-- purged): its key is free, unless another entry stands for it by now.
local function unique_release(eid)
  local ue = key_of('ue')
  local key = redis.call('HGET', ue, eid)
  if not key then
    return
  end
  redis.call('HDEL', ue, eid)
  local uq = key_of('uq')
  local rec = redis.call('HGET', uq, key)
  if rec then
    local kind, _, held = unique_record(rec)
    if kind == 'e' and held == eid then
      redis.call('HDEL', uq, key)
    end
  end
end

-- Entry eid (flags x) has left the queue for good (acked, removed, purged): its duplicate id
-- is forgotten ("d") and its unique key freed ("u"); an entry without flags costs one comparison.
local function entry_gone(dp, eid, x)
  if x == '' then
    return
  end
  if string.find(x, 'd', 1, true) then
    dup_forget(dp, eid)
  end
  if holds_key(x) then
    unique_release(eid)
  end
end

-- The sweep's share: look at about count records of uq and of ue from the cursors kept in hash
-- gc (fields "uq", "ue"), and drop those that stand no more (a throttle record past its time,
-- a record or key of an entry no longer in ii). Returns the records dropped.
local function unique_prune(ii, gc, now, count)
  local dropped = 0
  local uq, ue = key_of('uq'), key_of('ue')
  if redis.call('EXISTS', uq, ue) == 0 then -- (a queue that never saw a key: one command)
    return 0
  end
  local got = redis.call('HSCAN', uq, redis.call('HGET', gc, 'uq') or '0', 'COUNT', count)
  for i = 1, #got[2], 2 do
    local key, rec = got[2][i], got[2][i + 1]
    local kind, untl, eid = unique_record(rec)
    local gone
    if kind == 't' then
      gone = (tonumber(untl) or 0) <= now
    else
      gone = not kind or redis.call('HEXISTS', ii, eid) == 0
    end
    if gone then
      redis.call('HDEL', uq, key)
      if kind == 'e' then
        redis.call('HDEL', ue, eid)
      end
      dropped = dropped + 1
    end
  end
  redis.call('HSET', gc, 'uq', got[1])
  got = redis.call('HSCAN', ue, redis.call('HGET', gc, 'ue') or '0', 'COUNT', count)
  for i = 1, #got[2], 2 do
    if redis.call('HEXISTS', ii, got[2][i]) == 0 then
      redis.call('HDEL', ue, got[2][i])
    end
  end
  redis.call('HSET', gc, 'ue', got[1])
  return dropped
end
