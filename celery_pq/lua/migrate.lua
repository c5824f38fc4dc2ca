-- migrate: change a queue's mode on purpose (an admin operation), in bounded steps: the priority
-- index and the fairness state are rebuilt from the identifier-indexed table for the caller's
-- mode, and the mode record is rewritten. Waiting entries keep their order within a priority; a
-- change of priority order turns every rank around (entries, leases and delayed entries keep
-- their priority); leased entries stay leased to their holders; malformed entries go to the
-- dead-letter queue. A queue with no mode record is taken to have the caller's priority order.
--
-- The caller repeats the call until it answers done. The first call drops the old index and
-- writes the new mode with the switch "m" (migrating): until the last call every other script
-- (but extend: leases are renewed meanwhile) answers MIGRATING and does nothing, so the table
-- holds still while it is read. Each call then looks at about ARGV[1] entries (HSCAN, from the
-- cursor kept in gc field "migrate"; each entry is handled once, those HSCAN gives twice are
-- known by the set of ids seen), gathering the waiting ones per rank in a sorted set by seq;
-- then moves up to ARGV[1] of them, in seq order, into the rank lists; the last call clears "m".
-- A migration that stopped half way (a lost connection) is taken up where it stopped by a
-- call with the same mode; one with another mode answers MIGRATING until it is finished.
-- Temporary keys (in the slot of pi, derived from its name): "<pi>:<rank>:m" the gathered
-- pointers of a rank (score seq), "<pi>:mv" the ids seen.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table: ranks with waiting entries (and their lists)
-- KEYS[3] lt  hash    leases
-- KEYS[4] dz  zset    delayed entries
-- KEYS[5..12] te ts tb fv fc fn tw fr: fairness state (see includes/fair.lua)
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first: the new mode
-- ARGV[1] step  entries to look at (and pointers to move) at most in this call
-- Returns: {waiting entries indexed, leased entries kept, malformed entries set aside (all three
--          by this call), done (1 when the migration is over)}; the error reply MIGRATING when a
--          migration to another mode is under way.
-- ERR -9 MIGRATING
--!include dead.lua
--!include fair.lua
--!include index.lua
--!include queue.lua
--!include records.lua
--!include wake.lua
--!keys

take_context()
local new = CTX.mode
local step = tonumber(ARGV[1])
local fair = CTX.fair
local md, gc = key_of('md'), key_of('gc')
local seen_ids = pi .. ':mv'
local now = now_ms()

local record = redis.call('GET', md) or new
read_switches(string.sub(record, 5)) -- paused and the event log stay as they were
local state = redis.call('HGET', gc, 'migrate') -- "<flip>|s<cursor>" scanning, "<flip>|d<rank>" moving
if CTX.migrating and string.sub(record, 1, 4) ~= new then
  return redis.error_reply('PQ -9 ' .. KEYS[1] .. ' ' .. string.sub(record, 1, 4)) -- ErrorCode.MIGRATING
end
if not (CTX.migrating and state) then -- the first call: the old index goes
  local turn = string.sub(record, 3, 3) ~= string.sub(new, 3, 3)
  pi_unlink_all(pi)
  for r = 0, 255 do -- (left by a migration whose state was lost: nothing, as a rule)
    redis.call('UNLINK', level_key(pi, r) .. ':m')
  end
  redis.call('UNLINK', FK.te, FK.ts, FK.tb, FK.fv, FK.fn, FK.tw, FK.fr, seen_ids, key_of('lc'))
  state = (turn and '1' or '0') .. '|s0'
  CTX.migrating = true
  write_mode(new)
end
local flip = string.sub(state, 1, 1) == '1'
local phase, at = string.sub(state, 3, 3), string.sub(state, 4)

local waiting, leased, bad = 0, 0, 0
local budget = step
if phase == 's' then
  local scan = redis.call('HSCAN', ii, at, 'COUNT', step)
  local all = scan[2]
  budget = budget - #all / 2
  for i = 1, #all, 2 do
    local eid, v = all[i], all[i + 1]
    if redis.call('SADD', seen_ids, eid) == 1 then
      local e, bar = split_entry(v)
      local info = redis.call('HGET', lt, eid)
      if not e then
        if not info then
          set_aside(ii, eid, v, 0, now)
          bad = bad + 1
        end
      else
        local rank, seq = split_score(e.s)
        if flip then
          rank = 255 - rank
          e.s = fmt(rank * SEQ_SPAN + seq)
          redis.call('HSET', ii, eid, join_entry(e, v, bar))
        end
        if info then
          local tok, c, _, d, x, t = split_lease(info)
          if flip and tok then
            redis.call('HSET', lt, eid, join_lease(tok, c, e.s, d, x, t))
          end
          if fair then
            redis.call('HINCRBY', FK.fn, 'c:' .. e.t, 1)
          end
          leased = leased + 1
        elseif not redis.call('ZSCORE', dz, eid) then
          redis.call('ZADD', level_key(pi, rank) .. ':m', seq, make_ptr(seq, eid))
          if fair then
            fair_add(e.t, e.s, eid)
          end
          waiting = waiting + 1
        end
      end
    end
  end
  if scan[1] == '0' then
    phase, at = 'd', '0'
  else
    at = scan[1]
  end
end
if phase == 'd' then
  local r = tonumber(at)
  while r <= 255 and budget > 0 do
    local gathered = level_key(pi, r) .. ':m'
    local got = redis.call('ZPOPMIN', gathered, budget)
    if #got == 0 then
      r = r + 1
    else
      local ptrs = {}
      for i = 1, #got, 2 do
        ptrs[#ptrs + 1] = got[i]
      end
      if redis.call('RPUSH', level_key(pi, r), unpack(ptrs)) == #ptrs then
        redis.call('ZADD', pi, r, r)
      end
      budget = budget - #ptrs
    end
  end
  at = tostring(r)
  if r > 255 then -- done: the queue is open again in its new mode
    redis.call('UNLINK', seen_ids)
    redis.call('HDEL', gc, 'migrate')
    CTX.migrating = false
    write_mode(new)
    wake(key_of('wk'))
    return { waiting, leased, bad, 1 }
  end
end
redis.call('HSET', gc, 'migrate', (flip and '1' or '0') .. '|' .. phase .. at)
return { waiting, leased, bad, 0 }
