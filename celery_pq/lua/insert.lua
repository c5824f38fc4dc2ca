-- insert: INSERT one or more entries, each into both tables or neither (patent INSERT;
-- BQF AddQueueItem). An id already present gets a fresh duplicate id "<id>~<seq>", so a
-- task republished with its own id (Celery retry) never overwrites the copy still leased.
-- An entry due later (BQF "Date/Time Scheduled") waits in the delayed index instead, with
-- its score kept in the entry, until a pop or the sweep promotes it when due
-- (includes/delays.lua). With fairness on, the entry also joins its tenant's order and the
-- tenant joins the schedule. Wakes the plain consumers and only those priority views (collated
-- keyed queue) the new entries satisfy; a delayed entry due before every other delayed one of
-- the queue wakes them too, so that a waiting consumer learns the sooner due time from its pop.
--
-- KEYS[1]  ii    hash    identifier-indexed table
-- KEYS[2]  pi    zset    priority-indexed table: ranks with waiting entries (and their lists)
-- KEYS[3]  lt    hash    leases (only its size is read, for max_length)
-- KEYS[4]  wk    list    wake tokens of plain consumers
-- KEYS[5]  sq    string  insertion sequence
-- KEYS[6]  dz    zset    delayed entries, score = due time (ms)
-- KEYS[7]  vr    string  version of the registry of priority views
-- KEYS[8..15]  te ts tb fv fc fn tw fr: fairness state (see includes/fair.lua), fair only
-- KEYS[16..] views  list  wake lists of the priority views named in ARGV, one per view: the
--              last nviews keys (from KEYS[8] when the fairness keys are left out)
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] max_length      entries waiting or delayed allowed, 0 for no limit
-- ARGV[2] max_per_tenant  waiting entries allowed per tenant, 0 for no limit (fairness only)
-- ARGV[3] views_version   the registry version the caller knows ("" if none)
-- ARGV[4] nviews          number of views
-- ARGV[5..4+nviews] views...  one "lo,hi" (rank range, inclusive) per view, in the order of their
--                   wake lists in KEYS
-- ARGV[5+nviews] nforget  number of publish ids to forget
-- ARGV[6+nviews..5+nviews+nforget] forget...  publish ids to forget now (the caller has the
--                   replies of their inserts, so no retry of them can come: their memory is
--                   freed at once)
-- ARGV[6+nviews+nforget] made  "1" when the caller made the call's publish id itself: it is the
--                   first group's, and stands for the whole call (a call is atomic): a repeat of
--                   it returns every entry id the call stored then; "F" for such an id on its
--                   first send (a call the client never sent before cannot have been stored: the
--                   window is not looked at, only written); "0" when the groups carry publish ids
--                   of their own; "R" as "0", and the reply tells repeats (see Returns)
-- ARGV[7+nviews+nforget] nunique  number of entries that carry a unique key ("0": none, the usual)
-- ARGV[8+nviews+nforget..7+nviews+nforget+nunique] unique...  one per entry with a unique key, in
--                   the order of the entries: "<entry index from 0>,<mode>,<ms>,<retries>,<key>",
--                   mode one letter: w while_waiting, a while_active, r replace, d debounce (ms:
--                   the delay), t throttle (ms: the period); retries: the publish's retry count
--                   (Celery's header "retries", 0 for none): a publish of the standing entry's own
--                   task id with more retries than it is its retry, stored; see
--                   includes/unique.lua and docs/unique.md
-- ARGV[8+nviews+nforget+nunique..] id rank tenant payload due publish_id task expires cost...  the
--                   entries, nine arguments each: id ("" for a generated one), rank (0..255, 0 served first),
--                   tenant (escaped, may be ""), payload,
--                   due: "0" now, "+<ms>" that long from now (Redis clock), or absolute Unix ms,
--                   publish id ("" for none): a publish id seen in the last window (at most
--                   twice that) stores nothing and gives the entry id stored then; the window
--                   is the longest dedupe_ms any producer of the queue asked for lately (pt),
--                   task name ("" for none; only the event log keeps it),
--                   expires: the entry's expiry deadline, "" for none, "+<ms>" that long from
--                   now (Redis clock), absolute Unix ms, or "<abs ms>+<ms>" (the earlier of the
--                   two); stored in the entry (its xp), a pop never delivers it once passed,
--                   cost: "" or "c<number>", the declared cost (fair_cost "declared"), kept in
--                   the entry's flags
-- An entry with a unique key (its mode: docs/unique.md) whose key has an entry standing is
-- merged into it or throttled (nothing stored), or takes its place (replace: at the same place
-- in line when its rank is the old one's and that place is among the first or last 1,000 of the
-- rank, else at the back; debounce: due at now + delay), all in this call. Each entry with a
-- throttle key drops up to 4 throttle records whose period is over.
-- Counts enqueued (entries stored), refused_full (entries of a refused call; the refused
-- call writes nothing else) and unique_merged, unique_throttled, unique_replaced,
-- unique_debounced. Logs enqueue per entry stored; merged, throttled (the standing entry's id),
-- replaced, debounced (the id of the entry taken out), each with the key as its r.
-- A paused queue wakes nobody.
-- Returns: the entry ids, one per group, in order (with made "R", the id of a group that
--          stored nothing, its publish id seen before or earlier in this call, comes as a
--          one-element array {entry id}; a group with a unique key, not a repeat, comes as
--          {entry id, outcome}: outcome "stored", "merged", "throttled", "replaced" or
--          "debounced", the entry id the one that stands for the key); or, with nothing written:
--          {ERR -5, waiting}, {ERR -6, registry version}, {ERR -7, tenant waiting, group index},
--          or the error reply "MODE_MISMATCH <key> <stored mode> <caller's mode>" (ERR -8)
-- ERR -5 QUEUE_FULL
-- ERR -6 STALE_VIEWS
-- ERR -7 TENANT_FULL
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
--!include wake.lua
--!keys

take_context()
local max_length, max_per_tenant = tonumber(ARGV[1]), tonumber(ARGV[2])
local fair = CTX.fair
local nviews = tonumber(ARGV[4])
local nforget = tonumber(ARGV[5 + nviews])
local sent = ARGV[6 + nviews + nforget]
local tell = sent == 'R' -- the reply marks each repeat
local made = sent ~= '0' and not tell
local nunique = tonumber(ARGV[7 + nviews + nforget])
local first = 8 + nviews + nforget + nunique
local n = (#ARGV - first + 1) / 9
local U = false -- entry index -> {m = mode, ms, key}, for the entries with a unique key
if nunique > 0 then
  U = {}
  for j = 8 + nviews + nforget, first - 1 do
    local at, m, ms, retries, key = string.match(ARGV[j], '^(%d+),(%a),(%d+),(%d+),(.*)$')
    U[tonumber(at)] = { m = m, ms = tonumber(ms), retries = tonumber(retries), key = key }
  end
end

-- publish ids: two hashes (this window's and the last one's), rotated every dedupe_ms
local pd, pe, pt = key_of('pd'), key_of('pe'), key_of('pt')
-- the mode record, the views registry's version and the window's start, in one read (three
-- for a Redis user not allowed MGET: an ACL written before it was needed)
local got = redis.pcall('MGET', key_of('md'), vr, pt)
if got.err then
  got = { redis.call('GET', key_of('md')), redis.call('GET', vr), redis.call('GET', pt) }
end
local bad = mode_error(true, got[1])
if bad then
  return bad
end
if nviews > 0 or got[2] then
  local known = got[2] or ''
  if known ~= ARGV[3] then
    return { STALE_VIEWS, known }
  end
end
local now = now_ms()

local seen = {} -- group index -> entry id stored by the first publish
local fresh = n
local claim = false -- the publish id was recorded as it was looked up (HSETNX)
if CTX.dedupe_ms > 0 then
  -- pt: "<window start>|<window ms>|<held until>": the longest window any producer asked for
  -- holds while a producer asking for it has published within twice its length (a producer with
  -- a shorter window never shortens it; each producer records its own at most once per window)
  local t0, kept, held = string.match(got[3] or '', '^(%d+)|(%d+)|(%d+)$')
  t0, kept, held = tonumber(t0 or got[3]), tonumber(kept), tonumber(held)
  local window = CTX.dedupe_ms
  if kept and held > now and kept > window then
    window = kept
  elseif not kept or held <= now or kept < window or held - now < window then
    kept, held = window, now + 2 * window
    if t0 and now - t0 < window then -- no rotation below to write it
      redis.call('SET', pt, fmt(t0) .. '|' .. fmt(kept) .. '|' .. fmt(held))
    end
  end
  if not t0 or now - t0 >= 2 * window then
    redis.call('UNLINK', pd, pe)
    redis.call('SET', pt, fmt(now) .. '|' .. fmt(kept) .. '|' .. fmt(held))
  elseif now - t0 >= window then
    redis.call('UNLINK', pe)
    if redis.call('EXISTS', pd) == 1 then
      redis.call('RENAME', pd, pe)
    end
    redis.call('SET', pt, fmt(now) .. '|' .. fmt(kept) .. '|' .. fmt(held))
  end
  if nforget > 0 then
    redis.call('HDEL', pd, unpack(ARGV, 6 + nviews, 5 + nviews + nforget))
    redis.call('HDEL', pe, unpack(ARGV, 6 + nviews, 5 + nviews + nforget))
  end
  -- one group: its HGET of pe answers as cheaply as an EXISTS would (a missing hash is nil)
  local has_pe = n == 1 or redis.call('EXISTS', pe) == 1
  if sent == '1' then -- a made publish id sent again: stored already when it is found
    local was = redis.call('HGET', pd, ARGV[first + 5]) or (has_pe and redis.call('HGET', pe, ARGV[first + 5]))
    if was then
      return was == '' and { ARGV[first] } or unpack_ids(was)
    end
  end
  local look = not made
  -- A single group that nothing can refuse (no length limits) records its publish id as it
  -- looks: HSETNX answers "seen before" and records "stored as its own id" in one command (a
  -- generated or duplicate entry id is written over it below, in this same call).
  claim = look and n == 1 and max_length == 0 and not (fair and max_per_tenant > 0)
  local mine = {}
  for i = 0, n - 1 do
    local g = first + 9 * i
    local pid = ARGV[g + 5]
    if pid ~= '' then
      if mine[pid] then -- a later group with the same publish id is the same publish
        fresh = fresh - 1
      else
        mine[pid] = true
        local was
        if claim then
          was = (has_pe and redis.call('HGET', pe, pid))
            or (redis.call('HSETNX', pd, pid, '') == 0 and redis.call('HGET', pd, pid))
        elseif look then
          was = redis.call('HGET', pd, pid) or (has_pe and redis.call('HGET', pe, pid))
        end
        if was then
          seen[i] = was == '' and ARGV[g] or was
          fresh = fresh - 1
        end
      end
    end
  end
end

-- Entries with a unique key that will store nothing (merged, throttled) or take a standing
-- one's place do not count against the limits: worked out before them, as the loop below will
-- find it (an earlier entry of this call with the same key stands by then).
local skip = {}
if U and fresh > 0 and (max_length > 0 or (fair and max_per_tenant > 0)) then
  local mine = {} -- key -> "e" or "t": an entry of this call stands for it
  for i = 0, n - 1 do
    local u = U[i]
    if u and not seen[i] then
      local st = mine[u.key]
      if st then
        st = (st == 't') == (u.m == 't') and st or nil
      else
        local s = unique_standing(ii, lt, dz, u.key, u.m, u.ms, now, ARGV[first + 9 * i], u.retries, false)
        st = s and s.state
      end
      if st and (u.m == 'w' or u.m == 'a' or u.m == 't') then
        skip[i] = true
        fresh = fresh - 1
      else
        if st and st ~= 'leased' then
          fresh = fresh - 1 -- one leaves as one comes
        end
        mine[u.key] = u.m == 't' and 't' or 'e'
      end
    end
  end
end

if max_length > 0 and fresh > 0 then
  local waiting = redis.call('HLEN', ii) - redis.call('HLEN', lt)
  if waiting + fresh > max_length then
    counter_add('refused_full', fresh)
    return { QUEUE_FULL, waiting }
  end
end
if fair and max_per_tenant > 0 then
  local adding = {}
  for i = 0, n - 1 do
    if not seen[i] and not skip[i] then
      local t = ARGV[first + 2 + 9 * i]
      adding[t] = (adding[t] or 0) + 1
      local have = tonumber(redis.call('HGET', FK.fn, 'n:' .. t)) or 0
      if have + adding[t] > max_per_tenant then
        counter_add('refused_full', fresh)
        return { TENANT_FULL, have, i }
      end
    end
  end
end

local ts = fmt(now)
local out = {}
local woken = {}
local ready = false
local stored = {} -- publish id -> entry id, for a repeat within this call
local ids = made and {} -- the entry ids alone, for the call's publish id

for i = 0, n - 1 do
  local g = first + 9 * i
  local id, rank, tenant, payload, due, pid = ARGV[g], tonumber(ARGV[g + 1]), ARGV[g + 2], ARGV[g + 3], ARGV[g + 4],
    ARGV[g + 5]
  if seen[i] then
    out[#out + 1] = tell and { seen[i] } or seen[i]
    stored[pid] = seen[i]
  elseif stored[pid] then
    out[#out + 1] = tell and { stored[pid] } or stored[pid]
  else
    local u = U and U[i]
    local s, kind, uflag = nil, nil, ''
    if u then
      if u.m == 't' then
        unique_prune_throttle(now, UNIQUE_PRUNE_PER_INSERT)
      end
      s = unique_standing(ii, lt, dz, u.key, u.m, u.ms, now, id, u.retries, true)
      kind = s and UNIQUE_KINDS[u.m] or 'stored'
      if s and s.state == 'leased' and kind ~= 'merged' then -- a replace or debounce of one running
        s, kind = nil, 'stored'
      end
      uflag = u.m ~= 't' and 'u' or ''
    end
    if kind == 'merged' or kind == 'throttled' then
      tally('unique_' .. kind)
      emit(kind, s.eid, nil, nil, nil, nil, u.key, ARGV[g + 6])
      if pid ~= '' and CTX.dedupe_ms > 0 and not made then -- a repeat of it is told the same
        stored[pid] = s.eid
        redis.call('HSET', pd, pid, s.eid)
      end
      out[#out + 1] = { s.eid, kind }
    else
      if string.sub(due, 1, 1) == '+' then
        due = now + tonumber(string.sub(due, 2))
      else
        due = tonumber(due)
      end
      local stamp, xp = ts, ARGV[g + 7]
      if xp ~= '' then -- the deadline, absolute ms on the Redis clock, kept after ts
        local abs, rel = string.match(xp, '^(%d*)%+?(%d*)$')
        local at = tonumber(abs)
        if rel ~= '' then
          at = math.min(at or math.huge, now + tonumber(rel))
        end
        stamp = ts .. ',' .. fmt(at)
      end
      if u and u.m == 'd' then
        due = now + u.ms
      end
      local seq = redis.call('INCR', sq)
      local score = fmt(rank * SEQ_SPAN + seq)
      local keep = nil -- {list, index, seq} of the pointer of the waiting one whose place it takes
      if s then
        local orank, oseq = split_score(s.e.s)
        if kind == 'replaced' and s.state == 'waiting' and orank == rank and due <= now then
          keep = unique_place(pi, orank, make_ptr(oseq, s.eid))
          if keep then
            keep[3], score = oseq, s.e.s
          end
        end
        unique_drop(ii, dz, s, kind, u.key)
        tally('unique_' .. kind)
      end
      local base = id
      if base == '' then
        base = fmt(seq)
      end
      -- HSETNX: a free id is stored at once (free_id's HEXISTS and the HSET in one command)
      local eid, dup = base, nil
      uflag = uflag .. ARGV[g + 8] -- (the declared cost's flag, "" for none)
      if redis.call('HSETNX', ii, base, make_entry(0, score, tenant, uflag, '', stamp, '|', payload)) == 0 then
        eid, dup = free_id(ii, base, sq, seq)
        local flags = uflag
        if dup and id ~= '' then
          flags = 'd' .. uflag
          dup_add(id, dup)
        end
        redis.call('HSET', ii, eid, make_entry(0, score, tenant, flags, '', stamp, '|', payload))
      end
      tally('enqueued')
      emit('enqueue', eid, score, tenant, nil, nil, nil, ARGV[g + 6])
      local sooner = false -- a delayed entry due before every other: its consumers' waits shorten
      if due > now then
        local first = redis.call('ZRANGE', dz, 0, 0, 'WITHSCORES')
        sooner = not first[1] or due < tonumber(first[2])
        redis.call('ZADD', dz, due, eid)
      else
        if keep then -- the old pointer's place, pointing to the new entry
          redis.call('LSET', keep[1], keep[2], make_ptr(keep[3], eid))
        else
          pi_push(pi, rank, seq, eid)
        end
        if fair then
          fair_add(tenant, score, eid)
        end
      end
      if sooner or due <= now then
        ready = true
        for v = 1, nviews do
          local lo, hi = string.match(ARGV[4 + v], '^(%d+),(%d+)$')
          if not woken[v] and not CTX.paused and rank >= tonumber(lo) and rank <= tonumber(hi) then
            woken[v] = true
            wake(KEYS[#KEYS - nviews + v])
          end
        end
      end
      if pid ~= '' and CTX.dedupe_ms > 0 and not made then
        stored[pid] = eid
        if eid == id then
          if not claim then
            redis.call('HSET', pd, pid, '')
          end
        else
          redis.call('HSET', pd, pid, eid)
        end
      end
      if u then
        unique_hold(u.key, u.m, u.ms, eid, now, u.retries)
        out[#out + 1] = { eid, kind }
      else
        out[#out + 1] = eid
      end
    end
  end
  if ids then
    local o = out[#out]
    ids[#ids + 1] = type(o) == 'table' and o[1] or o
  end
end
if made and CTX.dedupe_ms > 0 and ARGV[first + 5] ~= '' then
  -- "" for a single entry stored as the id it was given (the common case: no ids to pack)
  redis.call('HSET', pd, ARGV[first + 5], (n == 1 and ids[1] == ARGV[first]) and '' or pack_ids(ids))
end
if ready and not CTX.paused then
  wake(wk)
end
flush_counts()
return out
