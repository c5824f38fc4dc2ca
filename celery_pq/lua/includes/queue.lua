-- The queue a script runs on: its context (taken off ARGV), its keys (KEYS[1] and the keys
-- derived from its stem), its mode record, and the numbers every include uses (fmt, now_ms,
-- SEQ_SPAN).
--
-- Every script but extend takes the queue context as its last ARGV (its header's "ARGV[0]
-- context"; take_context removes it, so a script's own arguments are ARGV[1..] as its header
-- numbers them): "mode|max_dead|dedupe_ms|rate|event_log|expired", where mode is four letters:
-- fair "0" plain, or fair with its cost "1" tasks / "2" time / "3" declared, scope "P"/"T" ("-" when not fair), order "h"/"l", technique "T"/"S", event_log
-- is the caller's event-log cap (0: the caller has none), and expired what a pop does with an
-- entry past its expiry deadline: "d" dead-letter it, "x" drop it (CTX.expired_drop). On a Redis Cluster the context starts
-- with "~": the slot guard (take_context) runs first. The letters a script acts on are read
-- from the mode once, into CTX.fair (true when fair), CTX.cost ("1" tasks, "2" time, "3"
-- declared: what a delivery costs its tenant, includes/fair.lua), CTX.scope ("P" within_priority, "T"
-- tenant_first, "-" when not fair) and CTX.technique ("T" or "S"): no script takes them as
-- arguments of its own (the mode is the queue's, checked by mode_error, so they are too).
-- The mode record md holds the four letters and then the queue's switches: "p" when the queue
-- is paused, "e<cap>" when its event log is on, "m" while a migration to its mode runs (every
-- script but migrate and extend then answers MIGRATING and does nothing: see migrate.lua and
-- mode_error; records.py).
-- A few keys of the queue are derived from the name of KEYS[1] (key_of: the same stem, so the
-- same hash tag and the same slot); docs/key-layout.md lists them and says why.
--
-- Nothing here raises a Lua error on stored data: an entry or record that cannot be parsed
-- is set aside (moved to the dead-letter queue as "malformed") or skipped, so a script never
-- stops half way with some of its writes done.

local SEQ_SPAN = 17592186044416 -- 2^44: score = rank * SEQ_SPAN + seq

-- fair, scope, technique: the letters of the caller's mode (take_context);
-- ev: the event-log cap in force (0: off), ev_mine: the caller's; paused: the queue is paused;
-- cnt: counters to add at the end of the script (flush_counts); k: the queue's derived keys
-- (key_of).
local CTX = { ev = 0, ev_mine = 0, paused = false, cnt = {} }

-- Parsed contexts and key stems, by their text. A library keeps this between calls (unlike CTX,
-- made anew for each call: _STATE in scripts/assembly.py), so a queue's calls parse their context
-- and derive their keys once. Started again when it holds 256 of them. (Run as a script, by EVALSHA, it
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
-- that had already moved. The caller waits and calls again (scripts/runner.py).
local function take_context()
  local c = table.remove(ARGV)
  local p = PARSED.contexts[c]
  if not p then
    local guard = string.byte(c, 1) == 126 -- "~"
    local t = guard and string.sub(c, 2) or c
    local mode, max_dead, dedupe, rate, ev, xd = string.match(t, '^(%S%S%S%S)|(%d*)|(%d*)|([^|]*)|(%d*)|(%a)$')
    if not mode then -- (a caller's mistake, before any write)
      error('the queue context is not mode|max_dead|dedupe_ms|rate|event_log|expired: ' .. t)
    end
    local f = string.sub(mode, 1, 1)
    p = remember('contexts', c, { mode = mode, fair = f == '1' or f == '2' or f == '3', cost = f, scope = string.sub(mode, 2, 2),
      technique = string.sub(mode, 4, 4), max_dead = tonumber(max_dead) or 0, dedupe_ms = tonumber(dedupe) or 0,
      rate = tonumber(rate) or 0, ev_mine = tonumber(ev) or 0, guard = guard, expired_drop = xd == 'x' })
  end
  CTX.expired_drop = p.expired_drop
  CTX.mode, CTX.max_dead, CTX.dedupe_ms, CTX.rate, CTX.ev_mine = p.mode, p.max_dead, p.dedupe_ms, p.rate, p.ev_mine
  CTX.fair, CTX.cost, CTX.scope, CTX.technique = p.fair, p.cost, p.scope, p.technique
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

-- Is the caller's mode the queue's? A queue records the mode of its first insert (adopt: the
-- caller's mode is written when there is no record). A recorded mode is changed only by
-- migrate (on purpose): an insert from a process with other options, even into an empty queue,
-- never turns a fair queue plain under its consumers. Returns nil when the modes agree, else an
-- error reply naming both.
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
    return redis.error_reply('PQ -9 ' .. KEYS[1] .. ' ' .. stored) -- ErrorCode.MIGRATING
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
  return redis.error_reply('PQ -8 ' .. KEYS[1] .. ' ' .. stored .. ' ' .. CTX.mode) -- ErrorCode.MODE_MISMATCH
end

-- Redis's clock in ms (the microseconds it read kept in CTX.now_us, for us_until).
local function now_ms()
  local t = redis.call('TIME')
  CTX.now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return math.floor(CTX.now_us / 1000)
end

-- The microseconds until Redis time at_ms (ms), at least 0, from the call's latest reading of
-- the clock (read now if none): a consumer's wait for a delayed entry ends within microseconds
-- of its due time, not within the millisecond now_ms rounds down to.
local function us_until(at_ms)
  if not CTX.now_us then
    now_ms()
  end
  return math.max(at_ms * 1000 - CTX.now_us, 0)
end

-- The text of the whole numbers 0..1023, made once: a number's text costs a sprintf (a few
-- thousand instructions, about as much as a Redis command), and a pop writes several small ones
-- (counts, delivery counts, token numbers).
local SMALL_TEXT = {} -- kept between calls

-- A number as Redis takes it: decimal, no exponent, rounded to a whole number.
local function fmt(n)
  local s = SMALL_TEXT[n]
  if s then
    return s
  end
  s = string.format('%.0f', n)
  if type(n) == 'number' and n >= 0 and n < 1024 and n % 1 == 0 then
    SMALL_TEXT[n] = s
  end
  return s
end

local function split_score(score)
  local s = tonumber(score)
  local rank = math.floor(s / SEQ_SPAN)
  return rank, s - rank * SEQ_SPAN
end
