-- Shared helpers, pasted into a script where it says `--!include common.lua`.
--
-- The stored records (entry "d,s,t,x,r,ts|payload", lease, pointer, dead-letter note,
-- publish-id value, mode) are laid out in celery_pq/records.py, the Python twin of the
-- readers and writers here (split_entry/make_entry/join_entry, split_lease/join_lease,
-- make_ptr/parse_ptr, dead_note); tests/test_records.py checks that the two agree.
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
--
-- Every script but extend takes the queue context as its last ARGV (take_context removes it, so
-- a script's own arguments are ARGV[1..] as its header numbers them): "mode|max_dead|dedupe_ms|
-- rate|event_log", where
-- mode is four letters: fair "0"/"1", scope "P"/"T" ("-" when not fair), order "h"/"l",
-- technique "T"/"S", and event_log is the caller's event-log cap (0: the caller has none).
-- On a Redis Cluster the context starts with "~": the slot guard (take_context) runs first.
-- The mode record md holds the four letters and then the queue's switches: "p" when the queue
-- is paused, "e<cap>" when its event log is on, "m" while a migration to its mode runs (every
-- script but migrate and extend then answers MIGRATING and does nothing: see migrate.lua and
-- mode_error; records.py).
-- A few keys of the queue are derived from the name of KEYS[1] (same stem, same hash tag, so
-- the same slot): md (the recorded mode), pd pe pt (publish ids), ct (counters), td (deliveries
-- per tenant), ev (the event log), gc (cursors of the fairness clean-up), and the dead-letter
-- queue's ii pi wk sq (where malformed entries go).
--
-- Nothing here raises a Lua error on stored data: an entry or record that cannot be parsed
-- is set aside (moved to the dead-letter queue as "malformed") or skipped, so a script never
-- stops half way with some of its writes done.

local SEQ_SPAN = 17592186044416 -- 2^44: score = rank * SEQ_SPAN + seq
-- A rank list is compacted (its stale pointers dropped) once it is longer than twice the live
-- entries plus this (stale pointers behind a head that cannot be served: amortised O(1)).
local COMPACT_SLACK = 64
-- Pointers one compaction step looks at, at most (each costs an HGET and an HEXISTS): one step
-- per COMPACT_SLACK pushes outruns the pushes eightfold, and a call stays well under 10 ms.
local COMPACT_STEP = 512

-- ev: the event-log cap in force (0: off), ev_mine: the caller's; paused: the queue is paused;
-- cnt: counters to add at the end of the script (flush_counts); k: the queue's derived keys
-- (key_of).
local CTX = { ev = 0, ev_mine = 0, paused = false, cnt = {} }

-- Parsed contexts and key stems, by their text. A library keeps this between calls (unlike CTX,
-- made anew for each call: scripts._STATE), so a queue's calls parse their context and derive
-- their keys once. Started again when it holds 256 of them. (Run as a script, by EVALSHA, it
-- starts empty on every call: the same work as before, nothing kept.)
local PARSED = { contexts = {}, stems = {}, levels = {}, n = 0 } -- kept between calls

local function remember(kind, text, value)
  if PARSED.n >= 256 then
    PARSED.contexts, PARSED.stems, PARSED.levels, PARSED.n = {}, {}, {}, 0
  end
  PARSED[kind][text] = value
  PARSED.n = PARSED.n + 1
  return value
end

-- Take the queue context off ARGV (see the header above); the stem of KEYS[1] names the
-- derived keys. Then, on a Redis Cluster (a context starting with "~"), the slot guard: one
-- read of two keys of the queue's slot that never exist. On a stable slot that is one EXISTS;
-- while the slot migrates Redis refuses it (ASK at the source, which no longer holds every key;
-- TRYAGAIN at the importing target, for a command of several keys not all there), and the
-- script stops with an error before its first write. The keys a script derives (md, pd, ct,
-- ...) are not in KEYS, so without the guard a call could write some keys and then fail on one
-- that had already moved. The caller waits and calls again (scripts.py).
local function take_context()
  local c = table.remove(ARGV)
  local p = PARSED.contexts[c]
  if not p then
    local guard = string.byte(c, 1) == 126 -- "~"
    local t = guard and string.sub(c, 2) or c
    local mode, max_dead, dedupe, rate, ev = string.match(t, '^([^|]*)|(%d*)|(%d*)|([^|]*)|(%d*)$')
    if not mode then
      mode, max_dead, dedupe, rate = string.match(t, '^([^|]*)|(%d*)|(%d*)|([^|]*)$')
    end
    p = remember('contexts', c, { mode = mode or t, max_dead = tonumber(max_dead) or 0,
      dedupe_ms = tonumber(dedupe) or 0, rate = tonumber(rate) or 0, ev_mine = tonumber(ev) or 0, guard = guard })
  end
  CTX.mode, CTX.max_dead, CTX.dedupe_ms, CTX.rate, CTX.ev_mine = p.mode, p.max_dead, p.dedupe_ms, p.rate, p.ev_mine
  local k = PARSED.stems[KEYS[1]]
  if not k then
    local stem = string.sub(KEYS[1], 1, -3)
    k = remember('stems', KEYS[1], { [''] = stem, is_dead = string.sub(stem, -6) == ':dead:' })
  end
  CTX.k, CTX.stem, CTX.is_dead = k, k[''], k.is_dead
  if p.guard then
    redis.call('EXISTS', CTX.stem .. '~1', CTX.stem .. '~2')
  end
end

-- The queue's derived key with this suffix (CTX.stem .. suffix), made once per queue.
local function key_of(suffix)
  local k = CTX.k[suffix]
  if not k then
    k = CTX.stem .. suffix
    CTX.k[suffix] = k
  end
  return k
end

-- The switches after the four letters of a mode record: "p" paused, "e<cap>" event log on,
-- "m" migrating.
local function read_switches(rest)
  CTX.paused = string.find(rest, 'p', 1, true) ~= nil
  CTX.ev = tonumber(string.match(rest, 'e(%d+)')) or 0
  CTX.migrating = string.find(rest, 'm', 1, true) ~= nil
end

-- Record mode and the switches in CTX as the queue's mode record.
local function write_mode(mode)
  local s = mode
  if CTX.paused then
    s = s .. 'p'
  end
  if CTX.ev > 0 then
    s = s .. 'e' .. string.format('%.0f', CTX.ev)
  end
  if CTX.migrating then
    s = s .. 'm'
  end
  redis.call('SET', key_of('md'), s)
end

-- Is the caller's mode the queue's? A queue records the mode of its first insert; a queue
-- that holds no entry takes the mode of its next insert (adopt), its leftover index and
-- fairness state cleared. Returns nil when the modes agree, else an error reply naming both.
-- The record's switches are read into CTX on the way (nothing more is read for them): a queue
-- that is not paused and has no event log, called by a process without one, matches at once.
-- A caller with an event-log cap records it, so that every process logs the queue's changes.
local function mode_error(adopt, record)
  local md = key_of('md')
  if record == nil then -- (a caller that read it already passes it: false when there is none)
    record = redis.call('GET', md)
  end
  if record == CTX.mode and CTX.ev_mine == 0 then
    return nil
  end
  local stored = record and string.sub(record, 1, 4)
  read_switches(record and string.sub(record, 5) or '')
  if CTX.migrating then -- nothing is done while a migration runs; the caller waits and retries
    return redis.error_reply('MIGRATING ' .. KEYS[1] .. ' ' .. stored)
  end
  local recorded = CTX.ev
  if CTX.ev_mine > 0 then
    CTX.ev = CTX.ev_mine
  end
  if stored == CTX.mode then
    if CTX.ev ~= recorded then
      write_mode(CTX.mode)
    end
    return nil
  end
  if not stored then
    if adopt then
      write_mode(CTX.mode)
    end
    return nil
  end
  if adopt and redis.call('HLEN', key_of('ii')) == 0 then
    local pi = key_of('pi')
    for _, r in ipairs(redis.call('ZRANGE', pi, 0, -1)) do -- (stale pointers only: freed by UNLINK)
      redis.call('UNLINK', pi .. ':' .. r, pi .. ':' .. r .. ':f')
    end
    for _, s in ipairs({ 'pi', 'te', 'ts', 'tb', 'fv', 'fn', 'tw', 'fr' }) do
      redis.call('UNLINK', key_of(s))
    end
    write_mode(CTX.mode)
    return nil
  end
  return redis.error_reply('MODE_MISMATCH ' .. KEYS[1] .. ' ' .. stored .. ' ' .. CTX.mode)
end

local function counter_add(name, n)
  redis.call('HINCRBY', key_of('ct'), name, n or 1)
end

-- Add n (default 1) to counter name, written once per script by flush_counts: a call that
-- delivers ten entries adds 10 with one command.
local function tally(name, n)
  CTX.cnt[name] = (CTX.cnt[name] or 0) + (n or 1)
end

local function flush_counts()
  for name, n in pairs(CTX.cnt) do
    if n ~= 0 then
      redis.call('HINCRBY', key_of('ct'), name, n)
    end
  end
  CTX.cnt = {}
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fmt(n)
  return string.format('%.0f', n)
end

local function split_score(score)
  local s = tonumber(score)
  local rank = math.floor(s / SEQ_SPAN)
  return rank, s - rank * SEQ_SPAN
end

-- The event log (docs/events.md): when it is on (CTX.ev, the stream's approximate cap), the
-- script that makes a change appends one entry to the queue's stream ev, so the log is exact.
-- Fields, all strings, in this order: e q id p k t c task n r ms (empty when not applicable).
local function text_id(eid)
  local b = string.byte(eid, 1)
  if b == 1 and #eid >= 17 then -- a packed UUID (celery_pq/ids.py): its 16 bytes as six numbers
    local u1, u2, u3, u4, u5, u6 = struct.unpack('>I4I2I2I2I2I4', eid, 2)
    return string.format('%08x-%04x-%04x-%04x-%04x%08x%s', u1, u2, u3, u4, u5, u6, string.sub(eid, 18))
  elseif b == 2 then
    return string.sub(eid, 2)
  end
  return eid
end

local function unescape(text)
  if not string.find(text, '%', 1, true) then
    return text
  end
  return (string.gsub(text, '%%(%x%x)', function(h)
    return string.char(tonumber(h, 16))
  end))
end

-- The queue's name, from the hash tag of the stem (keys.py escapes "%", "{" and "}" in it).
local function queue_name()
  if not CTX.qname then
    CTX.qname = unescape(string.match(CTX.stem, '{([^{}]*)}:[^{}]*$') or '')
    if CTX.is_dead then
      CTX.qname = CTX.qname .. '.dead'
    end
  end
  return CTX.qname
end

-- Log event e of entry eid (stored form; nil for a queue event) whose score is score (nil: no
-- priority), tenant t (escaped), consumer c, delivery count n, reason r, task name task.
local function emit(e, eid, score, t, c, n, r, task)
  if CTX.ev == 0 then
    return
  end
  local p, k = '', ''
  if score then
    local rank = split_score(score)
    k = fmt(rank)
    p = string.sub(CTX.mode, 3, 3) == 'h' and fmt(255 - rank) or k
  end
  local id, tt, nn = eid and text_id(eid) or '', t and unescape(t) or '', n and fmt(n) or ''
  if CTX.now_s then
    redis.call('XADD', CTX.ev_key, '*', 'e', e, 'q', CTX.qname, 'id', id, 'p', p, 'k', k, 't', tt,
      'c', c or '', 'task', task or '', 'n', nn, 'r', r or '', 'ms', CTX.now_s)
    return
  end
  -- The first event of a script call: the time, the key and the name made once, and the stream
  -- trimmed to about its cap. Only this XADD trims (MAXLEN costs more than the rest of an XADD),
  -- so the stream holds at most one call's events more than MAXLEN ~ would keep.
  CTX.now_s, CTX.ev_key = fmt(now_ms()), key_of('ev')
  queue_name()
  redis.call('XADD', CTX.ev_key, 'MAXLEN', '~', fmt(CTX.ev), '*', 'e', e, 'q', CTX.qname, 'id', id, 'p', p,
    'k', k, 't', tt, 'c', c or '', 'task', task or '', 'n', nn, 'r', r or '', 'ms', CTX.now_s)
end

local function level_key(pi, rank)
  local known = PARSED.levels[pi] or remember('levels', pi, {}) -- (names made once per rank)
  local key = known[rank]
  if not key then
    key = pi .. ':' .. rank
    known[rank] = key
  end
  return key
end

-- A pointer is the entry's seq in 6 bytes (big-endian) followed by its id.
local function make_ptr(seq, eid)
  return struct.pack('>I6', seq) .. eid
end

local function parse_ptr(p)
  if #p < 7 then
    return nil
  end
  return struct.unpack('>I6', p), string.sub(p, 7)
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
      first = redis.call('ZRANGE', pi, 0, 0, 'WITHSCORES')
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
    local got = redis.call('LPOP', key, n)
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

-- The parsed entry and the position of its "|", or nil when v is not an entry.
local function split_entry(v)
  local bar = string.find(v, '|', 1, true)
  if not bar then
    return nil
  end
  local d, s, t, x, r, ts = string.match(string.sub(v, 1, bar - 1),
    '^(%d*),(%d+),([^,]*),([^,]*),([^,]*),(%d*)$')
  if not s then
    return nil
  end
  return { d = tonumber(d) or 0, s = s, t = t, x = x, r = r, ts = ts }, bar
end

-- The entry pointer p (of rank) names, when p is current: eid, score, value, parsed entry, bar.
-- nil when p is stale; false, eid, value, seq when it names a waiting entry that is malformed.
local function pi_entry(ii, lt, p, rank)
  local seq, eid = parse_ptr(p)
  if not seq then
    return nil
  end
  local v = redis.call('HGET', ii, eid)
  if not v then
    return nil
  end
  local score = fmt(rank * SEQ_SPAN + seq)
  local e, bar = split_entry(v)
  if redis.call('HEXISTS', lt, eid) == 1 then
    return nil
  end
  if not e then
    return false, eid, v, seq
  end
  if e.s ~= score then
    return nil
  end
  return eid, score, v, e, bar
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

-- An entry: its header (deliveries, score, tenant, flags, dead-letter note, ts), then sep and
-- rest ("|" and the payload, or "" and what follows the header of a stored entry), made in one
-- concatenation.
local function make_entry(d, s, t, x, r, ts, sep, rest)
  return (d == 0 and '0' or fmt(d)) .. ',' .. s .. ',' .. t .. ',' .. x .. ',' .. r .. ',' .. ts .. sep .. rest
end

-- Entry e (as split_entry gives it) with the payload of v, whose "|" is at bar.
local function join_entry(e, v, bar)
  return make_entry(e.d, e.s, e.t, e.x, e.r, e.ts, '', string.sub(v, bar))
end

-- A dead-letter note: why, when (ms) and after how many deliveries.
local function dead_note(reason, ms, d)
  return reason .. '@' .. fmt(ms) .. '@' .. fmt(d)
end

-- token, consumer, score, deliveries, flags, tenant; all nil when info is not a lease record.
local function split_lease(info)
  local tok, c, s, d, x, t = string.match(info, '^([^,]*),([^,]*),(%d+),(%d*),([^,]*),([^,]*)$')
  if not tok then
    return nil
  end
  return tok, c, s, tonumber(d) or 0, x, t
end

local function join_lease(token, consumer, score, d, x, t)
  return token .. ',' .. consumer .. ',' .. score .. ',' .. fmt(d) .. ',' .. x .. ',' .. t
end

-- Record one delivery of a pop: its lease fields (written in one HSET/ZADD after the loop) and
-- its reply (eid, token, deliveries, score, value).
local function add_lease(P, eid, token, consumer, score, d, x, t, v)
  P.lease[#P.lease + 1] = eid
  P.lease[#P.lease + 1] = join_lease(token, consumer, score, d, x, t)
  P.deadline[#P.deadline + 1] = P.until_ms
  P.deadline[#P.deadline + 1] = eid
  tally('delivered')
  if d > 1 then
    tally('redelivered')
  end
  emit('deliver', eid, score, t, consumer, d)
  local out = P.out
  out[#out + 1] = eid
  out[#out + 1] = token
  out[#out + 1] = d
  out[#out + 1] = score
  out[#out + 1] = v
end

-- Write the leases a pop recorded.
local function write_leases(P, lt, lz)
  if #P.lease > 0 then
    redis.call('HSET', lt, unpack(P.lease))
    redis.call('ZADD', lz, unpack(P.deadline))
  end
end

-- Leave one wake token for a blocked consumer (at most one waits in the list).
local function wake(wk)
  if redis.call('LLEN', wk) == 0 then
    redis.call('RPUSH', wk, '1')
  end
end

-- The duplicates of a task id (entry ids "<task id>~<seq>") are members of the sorted set dq
-- (derived key; all scores 0, so in byte order): the id's length in 2 bytes, the id, the seq in
-- 6 bytes. One id's duplicates are one range (dup_range), so each is added, found and dropped in
-- O(log n), however often the id was sent. Duplicates recorded before dq are in the hash dp
-- (task id -> "seq1,seq2"), still read and emptied.
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

-- Store the sequence numbers of one task id's duplicates in the hash dp, "seq1,seq2" (none left:
-- the field goes): the layout before dq.
local function dup_store(dp, tid, seqs)
  if #seqs == 0 then
    redis.call('HDEL', dp, tid)
  else
    redis.call('HSET', dp, tid, table.concat(seqs, ','))
  end
end

-- Wake the consumers of every registered priority view whose range holds rank. The registry
-- (hash vw, "lo-hi" -> 1) is read here, so views registered by any process are woken; each
-- view's wake list is "<wk>:lo-hi" under the queue's stem.
local function wake_registered_views(rank)
  for _, name in ipairs(redis.call('HKEYS', key_of('vw'))) do
    local lo, hi = string.match(name, '^(%d+)-(%d+)$')
    if lo and rank >= tonumber(lo) and rank <= tonumber(hi) then
      wake(CTX.stem .. 'wk:' .. name)
    end
  end
end

-- Forget a duplicate entry id "<task id>~<seq>" (in dq; one recorded before dq in dp). An entry
-- whose id has that form and that leaves the table for any reason is forgotten (its flags may
-- be unreadable), so no record of a task id's duplicates names an id a later entry takes.
local function dup_forget(dp, eid)
  local tid, seq = string.match(eid, '^(.*)~(%d+)$')
  if not tid or #tid > 65535 then
    return
  end
  if redis.call('ZREM', key_of('dq'), dup_member(tid, tonumber(seq))) == 1 then
    return
  end
  local list = redis.call('HGET', dp, tid)
  if not list then
    return
  end
  local rest = {}
  for s in string.gmatch(list, '%d+') do
    if s ~= seq then
      rest[#rest + 1] = s
    end
  end
  dup_store(dp, tid, rest)
end

-- End the lease of entry eid if token is its token: the lease fields {c, s, d, x, t} (consumer,
-- score, deliveries, flags, tenant), or nil and the error code (NOT_LEASED or TOKEN_MISMATCH).
-- The token check is what keeps a late consumer from touching a redelivery.
local function end_lease(lt, lz, eid, token)
  local info = redis.call('HGET', lt, eid)
  if not info then
    return nil, NOT_LEASED
  end
  local tok, c, s, d, x, t = split_lease(info)
  if tok ~= token then
    return nil, TOKEN_MISMATCH
  end
  redis.call('HDEL', lt, eid)
  redis.call('ZREM', lz, eid)
  return { c = c, s = s, d = d, x = x, t = t }
end

-- Ack one lease (BQF MarkAsDone): the entry is deleted when the token matches. Returns the
-- code (1 acked, or the error code of end_lease) and the lease's tenant.
local function ack_one(ii, lz, lt, dp, eid, token)
  local lease, err = end_lease(lt, lz, eid, token)
  if not lease then
    return err
  end
  redis.call('HDEL', ii, eid)
  if lease.x == 'd' then
    dup_forget(dp, eid)
  end
  tally('acked')
  emit('ack', eid, lease.s, lease.t, lease.c)
  return 1, lease.t
end

-- Put a returned entry back in the priority index at its old place (InProcess -> Waiting).
local function to_waiting(ii, pi, eid, v, e, bar, score)
  e.s = score
  redis.call('HSET', ii, eid, join_entry(e, v, bar))
  local rank, seq = split_score(score)
  pi_return(pi, rank, seq, eid)
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

-- A dead-letter queue holds at most CTX.max_dead entries: the oldest waiting one (the lowest
-- seq at the head of a rank list) makes room, counted as dead_dropped.
local function dead_make_room(dii, dpi)
  if CTX.max_dead <= 0 or redis.call('HLEN', dii) < CTX.max_dead then
    return
  end
  local dlt = string.sub(dii, 1, -3) .. 'lt'
  local best_seq, best_eid, best_rank
  for _, r in ipairs(redis.call('ZRANGE', dpi, 0, -1)) do
    local rank = tonumber(r)
    local _, h, found, eid = pi_trim(dii, dlt, dpi, rank, 100)
    if h then
      local seq = parse_ptr(h)
      if not best_seq or seq < best_seq then
        best_seq, best_eid, best_rank = seq, found or eid, rank
      end
    end
  end
  if best_seq then
    local _, key = pi_head(dpi, best_rank)
    pi_pop_head(dpi, best_rank, key)
    redis.call('HDEL', dii, best_eid)
    emit('remove', best_eid, best_rank * SEQ_SPAN, nil, nil, nil, 'dead_dropped')
    counter_add('dead_dropped')
    CTX.dropped = (CTX.dropped or 0) + 1
  end
end

-- Move entry eid (value v, parsed e, split at bar) from its queue to the dead-letter queue.
-- It keeps its priority; its dead-letter note says why, when and after how many deliveries.
local function to_dead(ii, dp, dii, dpi, dwk, dsq, eid, v, e, bar, score, reason, now)
  dead_make_room(dii, dpi)
  local seq = redis.call('INCR', dsq)
  local rank = split_score(score)
  local dscore = rank * SEQ_SPAN + seq
  local deid = free_id(dii, eid, dsq, seq)
  emit('dead', eid, score, e.t, nil, e.d, reason)
  e.r = dead_note(reason, now, e.d)
  e.d = 0
  e.s = fmt(dscore)
  e.x = ''
  redis.call('HSET', dii, deid, join_entry(e, v, bar))
  pi_push(dpi, rank, seq, deid)
  wake(dwk)
  redis.call('HDEL', ii, eid)
  dup_forget(dp, eid)
  counter_add('dead_lettered')
  return deid
end

-- Set aside entry eid of queue ii whose stored value v cannot be parsed: it moves to the
-- dead-letter queue (reason "malformed", the whole value kept as its payload) at the given
-- rank; in a dead-letter queue it is rewritten in place, in the same form. Nothing is lost.
local function set_aside(ii, eid, v, rank, now)
  local e = { d = 0, s = fmt(rank * SEQ_SPAN), t = '', x = '', r = '', ts = fmt(now) }
  local wrapped = '|' .. v
  if CTX.is_dead then
    local sq = key_of('sq')
    local seq = redis.call('INCR', sq)
    e.r = dead_note('malformed', now, 0)
    e.s = fmt(rank * SEQ_SPAN + seq)
    redis.call('HSET', ii, eid, join_entry(e, wrapped, 1))
    pi_push(key_of('pi'), rank, seq, eid)
    counter_add('malformed')
    return
  end
  local ds = CTX.stem .. 'dead:'
  to_dead(ii, key_of('dp'), ds .. 'ii', ds .. 'pi', ds .. 'wk', ds .. 'sq', eid, wrapped, e, 1, e.s,
    'malformed', now)
  counter_add('malformed')
end


-- A list of entry ids as one string (each behind its length in 2 bytes), and back: what an
-- insert call's publish id stands for when the client made it for the whole call.
local function pack_ids(ids)
  local parts = {}
  for i, id in ipairs(ids) do
    parts[i] = struct.pack('>I2', #id) .. id
  end
  return table.concat(parts)
end

local function unpack_ids(s)
  local ids, pos = {}, 1
  while pos <= #s do
    local len, at = struct.unpack('>I2', s, pos)
    ids[#ids + 1] = string.sub(s, at, at + len - 1)
    pos = at + len
  end
  return ids
end
