-- The priority-indexed table: the rank lists of pointers, their compaction, and the moves of
-- a pointer (push, take, return, drop).
--
-- The priority-indexed table of a queue with key pi is one list per rank, "<pi>:<rank>", of
-- pointers (seq, eid) in FIFO order, and the zset pi of the ranks whose list is not empty
-- (member and score = rank). A pointer is current while its entry exists, is not leased and
-- still has the score rank * SEQ_SPAN + seq; any other pointer is stale and is dropped when a
-- pop or a sweep reaches it (the patent's lazy deletion). The level lists are not named in
-- KEYS: their names are derived from pi and share its hash tag, so they live in its slot.
-- Stale pointers are dropped in bounded steps (pi_compact_step, at most COMPACT_STEP a call):
-- a step takes pointers from the front of the rank's list "<pi>:<rank>" and appends the current
-- ones to its front list "<pi>:<rank>:f"; while that list holds pointers (a compaction pass is
-- under way) the rank's pointers in order are the front list then the list, and the rank's score
-- in pi is rank + 0.5 (read with the rank, so a pop needs no command more to know). When the
-- list runs empty the front list is renamed to it and the score is the rank again. The boundary
-- between the two lists is the pass's cursor: concurrent pops, pushes and returns move neither.
--!include queue.lua
--!include records.lua

-- A rank list is compacted (its stale pointers dropped) once it is longer than twice the live
-- entries plus this (stale pointers behind a head that cannot be served: amortised O(1)).
local COMPACT_SLACK = 64

-- Pointers one compaction step looks at, at most (each costs an HGET and an HEXISTS): one step
-- per COMPACT_SLACK pushes outruns the pushes eightfold, and a call stays well under 10 ms.
local COMPACT_STEP = 512

local function level_key(pi, rank)
  local known = PARSED.levels[pi] or remember('levels', pi, {}) -- (names made once per rank)
  local key = known[rank]
  if not key then
    key = pi .. ':' .. rank
    known[rank] = key
  end
  return key
end

-- The front list of rank's compaction pass (see the header): its pointers come before the list's.
local function front_key(pi, rank)
  return level_key(pi, rank) .. ':f'
end

-- Is a compaction pass of rank under way (its score in pi is rank + 0.5)?
local function pi_passing(pi, rank)
  local s = redis.call('ZSCORE', pi, rank)
  return s ~= false and tonumber(s) ~= tonumber(rank)
end

-- The front list ran empty: the rank's pointers are all in its list again (its score: the rank).
local function pi_front_done(pi, rank)
  redis.call('ZADD', pi, 'XX', rank, rank)
end

-- Rank's list ran empty: the front list of a pass becomes the list, or the rank leaves pi.
local function pi_list_empty(pi, rank, passing)
  local f = front_key(pi, rank)
  if passing and redis.call('EXISTS', f) == 1 then
    redis.call('RENAME', f, level_key(pi, rank))
    pi_front_done(pi, rank)
  else
    redis.call('ZREM', pi, rank)
  end
end

-- The lists holding rank's pointers, in order: {front list, list} during a pass, else {list}.
local function pi_lists(pi, rank)
  if pi_passing(pi, rank) then
    return { front_key(pi, rank), level_key(pi, rank) }
  end
  return { level_key(pi, rank) }
end

-- Put a pointer back at its place in seq order, looked for among the first 32 of its rank
-- (an entry given back after a lease: it was taken from the front, so its place is there).
-- During a compaction pass the front list is topped up to 32 from the list first, so the first
-- 32 are in one list.
local function pi_return(pi, rank, seq, eid)
  local key = level_key(pi, rank)
  if pi_passing(pi, rank) then
    local f = front_key(pi, rank)
    local short = 32 - redis.call('LLEN', f)
    if short > 0 then
      local moved = redis.call('LPOP', key, short)
      if moved then
        redis.call('RPUSH', f, unpack(moved))
      end
    end
    if redis.call('EXISTS', key) == 0 then
      pi_list_empty(pi, rank, true)
    else
      key = f
    end
  end
  local p = make_ptr(seq, eid)
  local head = redis.call('LRANGE', key, 0, 31)
  for _, h in ipairs(head) do
    if parse_ptr(h) > seq then
      redis.call('LINSERT', key, 'BEFORE', h, p)
      return
    end
  end
  if #head < 32 then
    if redis.call('RPUSH', key, p) == 1 then
      redis.call('ZADD', pi, rank, rank)
    end
  else
    redis.call('LINSERT', key, 'AFTER', head[32], p)
  end
end

-- Take up to n pointers from the front of ranks lo..hi, best rank first (a rank's front list
-- first during a compaction pass: its score, read with the rank, says so).
-- Returns a flat list {pointer, rank, ...}, and true when the last rank taken from still has
-- pointers (so ranks lo..hi are not empty: pi_any need not ask).
local function pi_take(pi, lo, hi, n)
  local out, more = {}, false
  local whole = lo == 0 and hi == 255
  while n > 0 do
    local first
    if whole then
      first = redis.call('ZRANGE', pi, '0', '0', 'WITHSCORES') -- (text: a number would be printed)
    else
      first = redis.call('ZRANGEBYSCORE', pi, lo, '(' .. (hi + 1), 'WITHSCORES', 'LIMIT', 0, 1)
    end
    local r = first[1]
    if not r then
      break
    end
    local rank = tonumber(r)
    local passing = tonumber(first[2]) ~= rank
    local key = passing and front_key(pi, rank) or level_key(pi, r)
    local got = redis.call('LPOP', key, fmt(n))
    if got then
      for _, p in ipairs(got) do
        out[#out + 1] = p
        out[#out + 1] = rank
      end
      n = n - #got
    end
    if n > 0 or redis.call('EXISTS', key) == 0 then
      if passing then
        pi_front_done(pi, rank) -- the next round takes from the rank's list
      else
        redis.call('ZREM', pi, r)
      end
    else
      more = true
    end
  end
  return out, more
end

-- Is there a pointer in ranks lo..hi (current or stale)?
local function pi_any(pi, lo, hi)
  if lo == 0 and hi == 255 then
    return redis.call('ZCARD', pi) > 0
  end
  return #redis.call('ZRANGEBYSCORE', pi, lo, '(' .. (hi + 1), 'LIMIT', 0, 1) > 0
end

-- Drop pointer p from its rank's lists (technique T's eager removal: O(its position), a scan
-- in Redis's C code, no Lua per pointer).
local function pi_drop(pi, rank, p)
  local key = level_key(pi, rank)
  local passing = pi_passing(pi, rank)
  if passing then
    local f = front_key(pi, rank)
    if redis.call('LREM', f, 1, p) == 1 then
      if redis.call('EXISTS', f) == 0 then
        pi_front_done(pi, rank)
      end
      return
    end
  end
  if redis.call('LREM', key, 1, p) == 1 and redis.call('EXISTS', key) == 0 then
    pi_list_empty(pi, rank, passing)
  end
end

-- Drop pointer p when it is among the first `near` of its rank (LPOS ... MAXLEN: bounded work);
-- further back it is left stale, for the pops and compaction steps that reach it.
local function pi_drop_near(pi, rank, p, near)
  for _, key in ipairs(pi_lists(pi, rank)) do
    if redis.call('LPOS', key, p, 'MAXLEN', near) then
      pi_drop(pi, rank, p)
      return
    end
  end
end

-- Unlink every rank list of pi and pi itself (Redis frees them in the background).
local function pi_unlink_all(pi)
  for _, r in ipairs(redis.call('ZRANGE', pi, 0, -1)) do
    redis.call('UNLINK', level_key(pi, r), front_key(pi, r))
  end
  redis.call('UNLINK', pi)
end

-- The entry pointer p (of rank) names, when p is current but for the lease check: eid, score,
-- value, parsed entry, bar. nil when p is stale otherwise; false, eid, value, seq when it names
-- an entry that is malformed. A leased entry's pointer is stale too: the caller checks that
-- (pi_entry; a pop checks it with the lease's own write, HSETNX).
local function pi_entry_of(ii, p, rank)
  local seq, eid = parse_ptr(p)
  if not seq then
    return nil
  end
  local v, e, bar = read_entry(ii, eid)
  if not e then
    return v and false, eid, v, seq -- nil when eid is gone, false when its entry is malformed
  end
  if not same_score(e.s, rank * SEQ_SPAN + seq) then
    return nil
  end
  return eid, e.s, v, e, bar
end

-- The entry pointer p (of rank) names, when p is current: eid, score, value, parsed entry, bar.
-- nil when p is stale; false, eid, value, seq when it names a waiting entry that is malformed.
local function pi_entry(ii, lt, p, rank)
  local a, b, c, d, e = pi_entry_of(ii, p, rank)
  if a ~= nil and redis.call('HEXISTS', lt, a or b) == 1 then
    return nil
  end
  return a, b, c, d, e
end

-- One compaction step of rank (see the header): up to budget pointers from the front of its
-- list are looked at; the current ones (each once) go to the back of its front list, the stale
-- ones are dropped. When the list runs empty the pass is over. Returns dropped, looked at, and
-- whether the pass is over.
local function pi_compact_step(pi, rank, budget)
  local key, f = level_key(pi, rank), front_key(pi, rank)
  local taken = redis.call('LPOP', key, budget)
  if not taken then
    return 0, 0, true
  end
  local stem = string.sub(pi, 1, -3)
  local ii, lt = stem .. 'ii', stem .. 'lt'
  local keep, seen = {}, {}
  for _, p in ipairs(taken) do
    if not seen[p] and pi_entry(ii, lt, p, rank) ~= nil then
      seen[p] = true
      keep[#keep + 1] = p
    end
  end
  local started = false
  if #keep > 0 then
    started = redis.call('RPUSH', f, unpack(keep)) == #keep
  end
  local over = redis.call('EXISTS', key) == 0
  if over then
    pi_list_empty(pi, rank, true)
  elseif started then
    redis.call('ZADD', pi, 'XX', rank + 0.5, rank)
  end
  return #taken - #keep, #taken, over
end

-- Looked at when a push makes the list's length n a multiple of COMPACT_SLACK (pi_push): a list
-- over twice the entries of the queue plus COMPACT_SLACK gets one compaction step, so stale
-- pointers behind a head that is not served (a paused or capped tenant's, technique S
-- removals) stay bounded, at amortised O(1) per pointer and at most COMPACT_STEP per call.
local function pi_compact(pi, rank, n)
  local stem = string.sub(pi, 1, -3)
  if n > 2 * (redis.call('HLEN', stem .. 'ii') - redis.call('HLEN', stem .. 'lt')) + COMPACT_SLACK then
    pi_compact_step(pi, rank, COMPACT_STEP)
  end
end

-- Drop the stale pointers at the front of rank's lists (at most budget); the rank leaves pi
-- when they run empty. Returns how many it dropped, then the head pointer left and what
-- pi_entry says of it (its entry is waiting, or malformed), or only the count.
local function pi_trim(ii, lt, pi, rank, budget)
  local key = level_key(pi, rank)
  local head = pi_passing(pi, rank) and front_key(pi, rank) or key
  local dropped = 0
  while dropped < budget do
    local h = redis.call('LINDEX', head, 0)
    if not h and head ~= key then -- the front list ran empty: on with the list
      pi_front_done(pi, rank)
      head = key
      h = redis.call('LINDEX', head, 0)
    end
    if not h then
      break
    end
    local eid, a, b, c = pi_entry(ii, lt, h, rank)
    if eid ~= nil then
      return dropped, h, eid, a, b, c
    end
    redis.call('LPOP', head)
    dropped = dropped + 1
  end
  if head == key and redis.call('EXISTS', key) == 0 then
    redis.call('ZREM', pi, rank)
  end
  return dropped
end

-- The first pointer of rank (nil: none), and the list it is in.
local function pi_head(pi, rank)
  local key = level_key(pi, rank)
  if pi_passing(pi, rank) then
    local f = front_key(pi, rank)
    local h = redis.call('LINDEX', f, 0)
    if h then
      return h, f
    end
    pi_front_done(pi, rank)
  end
  return redis.call('LINDEX', key, 0), key
end

-- Drop the first pointer of rank, in list key (as pi_head gave it).
local function pi_pop_head(pi, rank, key)
  redis.call('LPOP', key)
  if redis.call('EXISTS', key) == 1 then
    return
  end
  if key == level_key(pi, rank) then
    redis.call('ZREM', pi, rank)
  else
    pi_front_done(pi, rank)
  end
end

-- Append a pointer to the back of its rank's list (a new entry, a due delayed one).
local function pi_push(pi, rank, seq, eid)
  local n = redis.call('RPUSH', level_key(pi, rank), make_ptr(seq, eid))
  if n == 1 then
    redis.call('ZADD', pi, rank, rank)
  elseif n % COMPACT_SLACK == 0 then
    pi_compact(pi, rank, n)
  end
end
