-- The dead-letter queue "<queue>.dead" (keys "<stem>dead:...", the same hash tag): entries
-- moved there (to_dead), malformed entries set aside (set_aside), its length kept (max_dead).
--!include counters.lua
--!include duplicates.lua
--!include events.lua
--!include index.lua
--!include queue.lua
--!include records.lua
--!include unique.lua
--!include wake.lua

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
    redis.call('HDEL', string.sub(dii, 1, -3) .. 'ue', best_eid) -- (the key it kept for replay)
    emit('remove', best_eid, best_rank * SEQ_SPAN, nil, nil, nil, 'dead_dropped')
    counter_add('dead_dropped')
    CTX.dropped = (CTX.dropped or 0) + 1
  end
end

-- Move entry eid (value v, parsed e, split at bar) from its queue to the dead-letter queue.
-- It keeps its priority; its dead-letter note says why, when and after how many deliveries.
-- A dead letter has no expiry deadline: it waits in the dead-letter queue until taken. The
-- unique key it held is free in its queue; the dead letter keeps it (flag "u", the dead-letter
-- queue's ue) for a replay to restore (replay.lua).
local function to_dead(ii, dii, dpi, dwk, dsq, eid, v, e, bar, score, reason, now)
  dead_make_room(dii, dpi)
  local seq = redis.call('INCR', dsq)
  local rank = split_score(score)
  local dscore = rank * SEQ_SPAN + seq
  local deid = free_id(dii, eid, dsq, seq)
  emit('dead', eid, score, e.t, nil, e.d, reason)
  local key = unique_release(eid) -- (also of an entry set aside: its flags could not be read)
  e.r = dead_note(reason, now, e.d)
  e.d = 0
  e.s = fmt(dscore)
  e.x = ''
  if key then
    e.x = 'u'
    redis.call('HSET', string.sub(dii, 1, -3) .. 'ue', deid, key)
  end
  e.xp = ''
  redis.call('HSET', dii, deid, join_entry(e, v, bar))
  pi_push(dpi, rank, seq, deid)
  wake(dwk)
  redis.call('HDEL', ii, eid)
  dup_forget(eid)
  counter_add('dead_lettered')
  return deid
end

-- Set aside entry eid of queue ii whose stored value v cannot be parsed: it moves to the
-- dead-letter queue (reason "malformed", the whole value kept as its payload) at the given
-- rank; in a dead-letter queue it is rewritten in place, in the same form. Nothing is lost.
-- It leaves the delayed zset too: a stale pointer whose id a delayed entry has taken since
-- leads a pop here as well as the entry's own due time does.
local function set_aside(ii, eid, v, rank, now)
  redis.call('ZREM', key_of('dz'), eid)
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
  to_dead(ii, ds .. 'ii', ds .. 'pi', ds .. 'wk', ds .. 'sq', eid, wrapped, e, 1, e.s, 'malformed', now)
  counter_add('malformed')
end

-- At most this many expired entries are taken off the queue by one pop call (plus the rest of
-- the batch of pointers it had taken when it reached the bound): a backlog of expired work is
-- cleared over several calls, each short, and a pop that met the bound returns what it has
-- (its consumer is woken again while entries wait).
local EXPIRE_BUDGET = 100

-- Entry eid (value v, parsed e, split at bar, current score), met by a pop past its expiry
-- deadline (the entry's xp): never delivered. By the queue context's expired policy it goes to
-- the dead-letter queue with reason "expired" (CTX.expired_drop false) or is deleted. Counts
-- expired (and dead_lettered); logs dead (or remove), reason "expired". The caller has taken
-- its pointer.
local function expire(ii, eid, v, e, bar, score, now)
  tally('expired')
  if CTX.expired_drop then
    emit('remove', eid, score, e.t, nil, e.d, 'expired')
    redis.call('HDEL', ii, eid)
    dup_forget(eid)
    if holds_key(e.x) then
      unique_release(eid)
    end
    return
  end
  local ds = CTX.stem .. 'dead:'
  to_dead(ii, ds .. 'ii', ds .. 'pi', ds .. 'wk', ds .. 'sq', eid, v, e, bar, score, 'expired', now)
end
