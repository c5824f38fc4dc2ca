-- reclaim: the sweep. Returns expired leases to Waiting (BQF recovery: InProcess -> Waiting),
-- or to the dead-letter queue once max_deliveries is used up; promotes delayed entries that
-- are due (BQF "Date/Time Scheduled"); schedules rate-limited tenants whose token is due.
-- Throttled by a guard key so that one consumer per interval sweeps, not all of them.
--
-- KEYS[1]  ii   hash    identifier-indexed table
-- KEYS[2]  pi   zset    priority-indexed table
-- KEYS[3]  lz   zset    lease deadlines
-- KEYS[4]  lt   hash    leases
-- KEYS[5]  wk   list    wake tokens
-- KEYS[6]  gd   string  sweep guard
-- KEYS[7]  dii  hash    dead-letter queue: identifier-indexed table
-- KEYS[8]  dpi  zset    dead-letter queue: priority-indexed table
-- KEYS[9]  dwk  list    dead-letter queue: wake tokens
-- KEYS[10] dsq  string  dead-letter queue: sequence
-- KEYS[11] dz   zset    delayed entries, score = due time (ms)
-- KEYS[12..19] te ts tb fv fc fn tw fr: fairness state (see includes/fair.lua)
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] limit           expired leases handled at most in this call
-- ARGV[2] max_deliveries  0 for no limit
-- ARGV[3] guard_ms        skip unless no sweep ran in the last guard_ms (0: always run)
-- ARGV[4] consumer        "" for expired leases; a consumer id to return all of its leases now
-- ARGV[5] gap_ms          0, or: when the last sweep (key sw, derived from the stem) is more than
--                         gap_ms ago, nobody could sweep or renew in between (Redis was paused,
--                         down, or unreachable): each lease whose deadline fell in that gap gets
--                         back the time it had left when the gap began, counted from now
--                         (before the first sweep, sw is the time of the queue's first leases:
--                         includes/leases.lua write_leases)
-- ARGV[6] restore_ms      0, or the least time (ms) from now such a lease gets: the holder's lease
--                         length, so that its deadline counts from now, the first moment its
--                         holder can reach Redis again (its keeper may be slow to get through)
-- ARGV[7] start           a consumer's leases: where in lz (by rank, 0 first) this call looks at
--                         limit leases (so one call's work is bounded; the caller goes on from
--                         start + kept)
-- Returns: {returned, dead_lettered, skipped (1 when the guard held), more (1 if limit hit, by
--           the expired leases or by the due delayed entries: the caller sweeps again),
--           promoted delayed entries, dead entries dropped to keep max_dead, leases given
--           their time back after a gap, kept (leases looked at and left in lz)}; the error reply
--           MODE_MISMATCH (nothing done) when the caller's mode is not the queue's.
-- A lease record or entry that cannot be parsed does not stop the sweep: the entry goes back
-- with what can be read, or to the dead-letter queue as "malformed". On a fair queue it also
-- cleans up the fairness state of tenants that left (fair_gc).
-- Counts lease_expired (every expired lease taken, also those that go to the dead-letter queue)
-- and requeued (leases of a named consumer returned); logs expire, requeue (r "recovered"),
-- dead and due.
-- ERR -8 MODE_MISMATCH
-- ERR -9 MIGRATING

--!include counters.lua
--!include dead.lua
--!include delays.lua
--!include events.lua
--!include fair.lua
--!include index.lua
--!include leases.lua
--!include queue.lua
--!include records.lua
--!include unique.lua
--!include wake.lua
--!keys

--!queue
local limit = tonumber(ARGV[1])
local max_deliveries = tonumber(ARGV[2])
local guard_ms = tonumber(ARGV[3])
local consumer = ARGV[4]
local fair = CTX.fair
FA.rate = CTX.rate

if guard_ms > 0 and not redis.call('SET', gd, '1', 'NX', 'PX', guard_ms) then
  return { 0, 0, 1, 0, 0, 0, 0, 0 }
end
local now = now_ms()
local gap_ms = tonumber(ARGV[5]) or 0
local restored = 0
if consumer == '' then
  -- A lease expires only if its holder could have renewed it: after a gap in which no sweep
  -- ran (so no renewal could reach Redis either, when the gap is Redis's own pause or outage),
  -- a lease that expired during the gap gets the time it had left, and its holder a chance to
  -- renew it, instead of every task being delivered again the instant Redis answers.
  local sw = key_of('sw')
  local last = tonumber(redis.call('GET', sw) or '')
  local restore_ms = tonumber(ARGV[6]) or 0
  if gap_ms > 0 and last and now - last > gap_ms then
    local hit = redis.call('ZRANGEBYSCORE', lz, '(' .. fmt(last), fmt(now), 'WITHSCORES')
    for i = 1, #hit, 2 do
      local left = math.max(tonumber(hit[i + 1]) - last, restore_ms)
      redis.call('ZADD', lz, 'XX', fmt(now + left), hit[i])
    end
    restored = #hit / 2
  end
  redis.call('SET', sw, fmt(now))
end
local expired
if consumer == '' then
  expired = redis.call('ZRANGEBYSCORE', lz, '-inf', fmt(now), 'LIMIT', 0, limit)
else
  local start = tonumber(ARGV[7]) or 0
  expired = redis.call('ZRANGE', lz, start, start + limit - 1)
end
local returned, dead, taken = 0, 0, 0
for _, eid in ipairs(expired) do
  local info = redis.call('HGET', lt, eid)
  local take = true
  local tok, c, score, d, t
  if info then
    tok, c, score, d, _, t = split_lease(info)
    take = consumer == '' or c == consumer
  end
  local ch = nil
  if take then
    taken = taken + 1
    if CTX.cost == '2' then -- fair_cost "time": an expired lease is charged until its deadline
      ch = take_charge(eid, consumer == '' and tonumber(redis.call('ZSCORE', lz, eid)) or now)
    end
    redis.call('ZREM', lz, eid)
    redis.call('HDEL', lt, eid)
    local v, e, bar = read_entry(ii, eid)
    if v then
      if e and not tok then -- an unreadable lease record: the entry's own fields stand in
        score, d, t = e.s, e.d, e.t
      end
      if fair then
        fair_release(t or '')
        if score then
          fair_settle(t or '', score, ch, false, now)
        end
      end
    end
    if consumer == '' then
      tally('lease_expired')
    end
    if v and not e then
      set_aside(ii, eid, v, score and (split_score(score)) or 0, now)
      dead = dead + 1
    elseif v then
      e.d = d
      if max_deliveries > 0 and d >= max_deliveries and not CTX.is_dead then
        to_dead(ii, dii, dpi, dwk, dsq, eid, v, e, bar, score, 'max_deliveries', now)
        dead = dead + 1
      else
        to_waiting(ii, pi, eid, v, e, bar, score)
        if consumer == '' then
          emit('expire', eid, score, t, c, d, nil, nil, ch and ch.held)
        else
          tally('requeued')
          emit('requeue', eid, score, t, c, d, 'recovered', nil, ch and ch.held)
        end
        if fair then
          fair_add(t, score, eid)
        end
        wake_registered_views((split_score(score)))
        returned = returned + 1
      end
    end
  end
end
-- delayed entries that are due join the back of their priority (keeping their score); pops
-- promote them too (includes/delays.lua), so this catches what no pop reached
local promoted, due_more = 0, false
if consumer == '' then
  promoted, due_more = promote_due(ii, pi, dz, now, fair and math.min(limit, FAIR_PROMOTE) or limit, fair and fair_add or nil)
  if fair then
    fair_unpark(now)
    fair_gc(key_of('gc'), now, 100)
    if CTX.cost == '2' then
      fair_gc_charges(key_of('gc'), lt, now, 100)
    end
  end
  unique_prune(ii, key_of('gc'), now, 50)
end
if returned > 0 or promoted > 0 or (fair and redis.call('ZCARD', FK.ts) > 0) then
  wake(wk)
end
local more = 0
if #expired == limit or due_more then
  more = 1
end
flush_counts()
return { returned, dead, 0, more, promoted, CTX.dropped or 0, restored, #expired - taken }
