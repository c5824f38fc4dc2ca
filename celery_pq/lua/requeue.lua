-- requeue: a leased entry goes back to Waiting at its original place in the order (looked for
-- among the first 32 of its priority)
-- (reject with requeue, or a consumer restoring unstarted messages at shutdown). When it has
-- used up max_deliveries it goes to the dead-letter queue instead.
--
-- KEYS[1]  ii   hash    identifier-indexed table
-- KEYS[2]  pi   zset    priority-indexed table
-- KEYS[3]  lz   zset    lease deadlines
-- KEYS[4]  lt   hash    leases
-- KEYS[5]  wk   list    wake tokens
-- KEYS[6]  dii  hash    dead-letter queue: identifier-indexed table
-- KEYS[7]  dpi  zset    dead-letter queue: priority-indexed table
-- KEYS[8]  dwk  list    dead-letter queue: wake tokens
-- KEYS[9]  dsq  string  dead-letter queue: sequence
-- KEYS[10..17] te ts tb fv fc fn tw fr: fairness state (see includes/fair.lua)
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] eid             entry id
-- ARGV[2] token           lease token
-- ARGV[3] count_delivery  "1": the delivery counts toward max_deliveries; "0": it is undone
-- ARGV[4] max_deliveries  0 for no limit
-- ARGV[5] dead_reason     "" to requeue; otherwise go to the dead-letter queue with this reason
-- Returns: 1 waiting again, 2 moved to the dead-letter queue, 3 moved there and the oldest
--          dead entry dropped to keep max_dead, or an error code. An entry that cannot be
--          parsed goes to the dead-letter queue as "malformed" (2). A dead-letter queue's own
--          entries are never dead-lettered: they go back to waiting.
-- Counts requeued; logs requeue (r "rejected", or "restored" when the delivery is undone) or
-- dead (r the reason).
-- ERR -2 NOT_LEASED
-- ERR -3 TOKEN_MISMATCH
-- ERR -8 MODE_MISMATCH
-- ERR -9 MIGRATING
--!include counters.lua
--!include dead.lua
--!include events.lua
--!include fair.lua
--!include leases.lua
--!include queue.lua
--!include records.lua
--!include wake.lua
--!keys

--!queue
local eid, token = ARGV[1], ARGV[2]
local count_delivery = ARGV[3] == '1'
local max_deliveries = tonumber(ARGV[4])
local dead_reason = ARGV[5]
local fair = CTX.fair

local lease, err = end_lease(lt, lz, eid, token)
if not lease then
  return err
end
local score, d, tenant = lease.s, lease.d, lease.t
local ch = take_charge(eid)
if fair then
  fair_release(tenant)
  -- fair_cost "time": a reject is charged the time held; a delivery undone (restored) nothing
  fair_settle(tenant, score, ch, not count_delivery, now_ms())
  wake(wk) -- the tenant may have been held at its concurrency cap
end
local v, e, bar = read_entry(ii, eid)
if not v then
  return NOT_LEASED
end
if not e then
  set_aside(ii, eid, v, (split_score(score)), now_ms())
  return 2
end
e.d = d
if not count_delivery then
  e.d = math.max(d - 1, 0)
end
if CTX.is_dead then
  dead_reason, max_deliveries = '', 0 -- a dead-letter queue has no dead-letter queue
elseif dead_reason == '' and max_deliveries > 0 and e.d >= max_deliveries then
  dead_reason = 'max_deliveries'
end
if dead_reason ~= '' then
  to_dead(ii, dii, dpi, dwk, dsq, eid, v, e, bar, score, dead_reason, now_ms())
  flush_counts()
  if CTX.dropped then
    return 3
  end
  return 2
end
to_waiting(ii, pi, eid, v, e, bar, score)
tally('requeued')
emit('requeue', eid, score, tenant, lease.c, e.d, count_delivery and 'rejected' or 'restored', nil, ch and ch.held)
if fair then
  fair_add(tenant, score, eid)
end
wake(wk)
wake_registered_views((split_score(score)))
flush_counts()
return 1
