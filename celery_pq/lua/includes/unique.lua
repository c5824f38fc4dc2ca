-- Unique keys (docs/unique.md): which entry stands for a key, per queue. Four keys derived
-- from the stem, so they share the queue's hash tag:
--   uq  hash  key -> record "<kind>|<until ms>|<retries>|<entry id>": kind "e" while the entry
--       stands for the key (modes while_waiting, while_active, replace, debounce; until ""),
--       kind "t" a throttle record: the key stands until "until" (ms, Redis clock), whatever
--       became of the entry stored then (its id is the one a throttled publish is told of);
--       retries: the retry count the stored publish carried (Celery's header "retries").
--   ue  hash  entry id -> key, for each entry that holds a key of kind "e" (flag "u" in the
--       entry): every way an entry leaves frees its key at once (unique_release). A dead letter
--       keeps flag and key, in its dead-letter queue's ue, for a replay to restore.
--   uz  zset  key -> until, of each throttle record: each throttled insert and the sweep drop a
--       few records whose period is over, oldest first (unique_prune_throttle), so the table
--       keeps pace with any rate of new keys at bounded work per call.
--   ub  zset  entry id -> when it was published (ms), of each debounce entry holding its key:
--       one published "after" now means Redis's clock stepped back; the sweep moves its due
--       time back to now + its delay (unique_unstretch).
-- The records are the caller's word, not the truth: a record of kind "e" stands only while
-- its entry is in ii with the flag "u", holding this key (ue), and, for while_waiting, is not
-- leased; the insert checks that (unique_holder), so a path that misses the eager release
-- leaks no key. The sweep prunes records that stand no more, a bounded number per call.
--
-- Redis's clock stepping back (a failover to a replica whose clock is behind, an NTP step)
-- would stretch a deadline taken on the clock before the step by as long as the step. A
-- deadline is never more than its period ahead of now: a throttle record is clamped to now +
-- its period when a publish meets it, a debounce entry's due time by the sweep, so a step back
-- costs at most one period. (A deadline within its period of now is left alone: the step is
-- shorter than the time since the deadline was taken, which is shorter than the period.)
--!include duplicates.lua
--!include events.lua
--!include fair.lua
--!include index.lua
--!include queue.lua
--!include records.lua

-- What a publish of each mode letter of insert.lua's ARGV (while_waiting, while_active,
-- throttle, replace, debounce) comes to when an entry stands for its key (a constant).
local UNIQUE_KINDS = { w = 'merged', a = 'merged', t = 'throttled', r = 'replaced', d = 'debounced' } -- kept between calls

-- Throttle records whose period is over dropped by each insert of a throttled key, at most:
-- more than the one record such an insert may add, so the table keeps pace with the keys'
-- rate, whatever it is, at a few commands per insert.
local UNIQUE_PRUNE_PER_INSERT = 4

-- A replace keeps the waiting one's place when its pointer is among the first or the last
-- this many of its rank's list (LPOS ... MAXLEN: bounded work, whatever the backlog); deeper
-- in, the new entry goes to the back of its priority.
local UNIQUE_PLACE_NEAR = 1000

-- kind, until, retries, entry id of a uq record (nil for one that cannot be read)
local function unique_record(rec)
  return string.match(rec, '^(%a)|(%d*)|(%d*)|(.*)$')
end

-- Does an entry with flags x hold a key (flag "u")?
local function holds_key(x)
  return x ~= '' and string.find(x, 'u', 1, true) ~= nil
end

-- Is entry id eid the one of task id id, or a duplicate "<id>~<seq>" of it?
local function same_task(eid, id)
  return id ~= '' and (eid == id or string.sub(eid, 1, #id + 1) == id .. '~')
end

-- The entry a record of kind `kind` naming eid says holds key: its value, parsed entry and bar
-- when it is in ii, holds a key (flag "u") and holds this one (ue); else nil.
local function unique_holder(ii, kind, eid, key)
  if kind ~= 'e' then
    return nil
  end
  local v, e, bar = read_entry(ii, eid)
  if not e or not holds_key(e.x) or redis.call('HGET', key_of('ue'), eid) ~= key then
    return nil
  end
  return v, e, bar
end

-- The id of the entry that holds key now (uq's record of kind "e", its entry holding it), or nil.
local function unique_held_by(ii, key)
  local rec = redis.call('HGET', key_of('uq'), key)
  if not rec then
    return nil
  end
  local kind, _, _, eid = unique_record(rec)
  if kind and unique_holder(ii, kind, eid, key) then
    return eid
  end
  return nil
end

-- The entry standing for key for a publish of mode m (ms: its delay or period), entry id id and
-- retry count retries at now: nil when none stands, else a table {eid, state ("waiting",
-- "delayed", "leased"; "throttle" for a throttle record), v, e, bar}. A publish of the very task
-- that stands with more retries than it (Celery's retry sends the task's id again, its header
-- "retries" one up) is that task's retry: for it nothing stands, or the retry would be merged
-- into the run that asked for it (or throttled by it) and be lost. A publish of the same id
-- without more retries (a task id chosen by the caller, "report-17") is judged as any other.
-- With clamp, a throttle record more than the publish's period ahead (Redis's clock stepped
-- back) is clamped to now + period (a refused call passes false: it writes nothing).
local function unique_standing(ii, lt, dz, key, m, ms, now, id, retries, clamp)
  local uq = key_of('uq')
  local rec = redis.call('HGET', uq, key)
  if not rec then
    return nil
  end
  local kind, untl, tries, eid = unique_record(rec)
  if not kind then
    return nil
  end
  local retry = retries > (tonumber(tries) or 0) and same_task(eid, id)
  if m == 't' then
    untl = tonumber(untl)
    if kind ~= 't' or retry or untl <= now then
      return nil
    end
    if clamp and untl > now + ms then
      untl = now + ms
      redis.call('HSET', uq, key, 't|' .. fmt(untl) .. '|' .. tries .. '|' .. eid)
      redis.call('ZADD', key_of('uz'), untl, key)
    end
    return { eid = eid, state = 'throttle' }
  end
  local v, e, bar = unique_holder(ii, kind, eid, key)
  if not v then
    return nil
  end
  local state = 'waiting'
  if redis.call('HEXISTS', lt, eid) == 1 then
    if m == 'w' or retry then
      return nil
    end
    state = 'leased'
  elseif redis.call('ZSCORE', dz, eid) then
    state = 'delayed'
  end
  return { eid = eid, state = state, v = v, e = e, bar = bar }
end

-- Record that entry eid, stored now by a publish with retry count retries, stands for key
-- under mode m (throttle: until now + ms; debounce: published now, for unique_unstretch).
local function unique_hold(key, m, ms, eid, now, retries)
  if m == 't' then
    local untl = fmt(now + ms)
    redis.call('HSET', key_of('uq'), key, 't|' .. untl .. '|' .. fmt(retries) .. '|' .. eid)
    redis.call('ZADD', key_of('uz'), untl, key)
  else
    redis.call('HSET', key_of('uq'), key, 'e||' .. fmt(retries) .. '|' .. eid)
    redis.call('HSET', key_of('ue'), eid, key)
    if m == 'd' then
      redis.call('ZADD', key_of('ub'), now, eid)
    end
  end
end

-- Drop up to count throttle records whose period is over (uz, the oldest first); returns how
-- many. A key whose record is of kind "e" by now only leaves uz.
local function unique_prune_throttle(now, count)
  local uz = key_of('uz')
  local over = redis.call('ZRANGEBYSCORE', uz, '-inf', now, 'LIMIT', 0, count)
  if #over == 0 then
    return 0
  end
  redis.call('ZREM', uz, unpack(over))
  local uq = key_of('uq')
  local recs = redis.call('HMGET', uq, unpack(over))
  local gone = {}
  for i, key in ipairs(over) do
    local kind, untl = unique_record(recs[i] or '')
    if kind == 't' and tonumber(untl) <= now then
      gone[#gone + 1] = key
    end
  end
  if #gone > 0 then
    redis.call('HDEL', uq, unpack(gone))
  end
  return #gone
end

-- Where the pointer p of rank is, when it is among the first or last UNIQUE_PLACE_NEAR of the
-- rank's lists: {list, index}; else nil.
local function unique_place(pi, rank, p)
  for _, key in ipairs(pi_lists(pi, rank)) do
    local at = redis.call('LPOS', key, p, 'MAXLEN', UNIQUE_PLACE_NEAR)
      or redis.call('LPOS', key, p, 'RANK', -1, 'MAXLEN', UNIQUE_PLACE_NEAR)
    if at then
      return { key, at }
    end
  end
  return nil
end

-- Take entry s (standing for key, waiting or delayed: unique_standing) out of queue ii, for a
-- replace or a debounce (logged as what); its pointer, if waiting, is left to lazy deletion
-- (or taken over by the new entry: insert.lua).
local function unique_drop(ii, dz, s, what, key)
  redis.call('HDEL', ii, s.eid)
  redis.call('HDEL', key_of('ue'), s.eid)
  if s.state == 'delayed' then
    redis.call('ZREM', dz, s.eid)
    redis.call('ZREM', key_of('ub'), s.eid)
  elseif CTX.fair then
    fair_drop(s.e.t, s.e.s, s.eid)
  end
  dup_forget(s.eid)
  emit(what, s.eid, s.e.s, s.e.t, nil, nil, key)
end

-- Entry eid, which held a key (flag "u"), left the table (acked, dead-lettered, removed,
-- purged, expired): its key is free, unless another entry stands for it by now. Returns the
-- key it held (nil: none recorded).
local function unique_release(eid)
  local ue = key_of('ue')
  local key = redis.call('HGET', ue, eid)
  if not key then
    return nil
  end
  redis.call('HDEL', ue, eid)
  redis.call('ZREM', key_of('ub'), eid)
  local uq = key_of('uq')
  local rec = redis.call('HGET', uq, key)
  if rec then
    local kind, _, _, held = unique_record(rec)
    if kind == 'e' and held == eid then
      redis.call('HDEL', uq, key)
    end
  end
  return key
end

-- Entry eid (flags x) has left the queue for good (acked, removed, purged): its duplicate id
-- is forgotten ("d") and its unique key freed ("u"); an entry without flags costs one comparison.
local function entry_gone(eid, x)
  if x == '' then
    return
  end
  if string.find(x, 'd', 1, true) then
    dup_forget(eid)
  end
  if holds_key(x) then
    unique_release(eid)
  end
end

-- Debounce entries published "after" now (Redis's clock stepped back since): each still
-- delayed is due its delay from now instead (its due time moved back by the step), at most
-- count of them. Returns how many were moved.
local function unique_unstretch(dz, now, count)
  local ub = key_of('ub')
  local later = redis.call('ZRANGEBYSCORE', ub, '(' .. fmt(now), '+inf', 'WITHSCORES', 'LIMIT', 0, count)
  local moved = 0
  for i = 1, #later, 2 do
    local eid, at = later[i], tonumber(later[i + 1])
    local due = redis.call('ZSCORE', dz, eid)
    if due then
      redis.call('ZADD', dz, 'XX', fmt(tonumber(due) - (at - now)), eid)
      redis.call('ZADD', ub, 'XX', fmt(now), eid)
      moved = moved + 1
    else -- (due already: nothing to move any more)
      redis.call('ZREM', ub, eid)
    end
  end
  return moved
end

-- The sweep's share: drop up to count throttle records whose period is over, move back the
-- due times a clock step stretched, and look at about count records of uq and of ue from the
-- cursors kept in hash gc (fields "uq", "ue"), dropping those that stand no more (a throttle
-- record past its time, a record or key of an entry no longer in ii). Returns the records
-- dropped.
local function unique_prune(ii, gc, now, count)
  local uq, ue = key_of('uq'), key_of('ue')
  if redis.call('EXISTS', uq, ue) == 0 then -- (a queue that never saw a key: one command)
    return 0
  end
  local dropped = unique_prune_throttle(now, count)
  unique_unstretch(key_of('dz'), now, count)
  local got = redis.call('HSCAN', uq, redis.call('HGET', gc, 'uq') or '0', 'COUNT', count)
  for i = 1, #got[2], 2 do
    local key, rec = got[2][i], got[2][i + 1]
    local kind, untl, _, eid = unique_record(rec)
    local gone
    if kind == 't' then
      gone = tonumber(untl) <= now
    else
      gone = not kind or redis.call('HEXISTS', ii, eid) == 0
    end
    if gone then
      redis.call('HDEL', uq, key)
      if kind == 'e' then
        redis.call('HDEL', ue, eid)
        redis.call('ZREM', key_of('ub'), eid)
      elseif kind == 't' then
        redis.call('ZREM', key_of('uz'), key)
      end
      dropped = dropped + 1
    end
  end
  redis.call('HSET', gc, 'uq', got[1])
  got = redis.call('HSCAN', ue, redis.call('HGET', gc, 'ue') or '0', 'COUNT', count)
  for i = 1, #got[2], 2 do
    if redis.call('HEXISTS', ii, got[2][i]) == 0 then
      redis.call('HDEL', ue, got[2][i])
      redis.call('ZREM', key_of('ub'), got[2][i])
    end
  end
  redis.call('HSET', gc, 'ue', got[1])
  return dropped
end
