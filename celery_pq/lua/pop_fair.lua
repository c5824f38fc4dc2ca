-- pop_fair: lease the next entries of a fair queue: the tenant whose start tag is lowest (at
-- the best priority level, under within_priority) gives its best entry; its finish tag moves
-- on by its cost (fair_cost: one delivery, a declared cost, or provisionally the time a lease
-- is held, settled when the lease ends) / weight. Tenants at their concurrency cap or out of rate tokens, and paused tenants,
-- are parked (left out of the schedule) instead of being scanned past. Everything else is as in
-- pop (a paused queue delivers nothing; the first leases start the sweep record sw; due delayed
-- entries join first, includes/delays.lua). Also counts deliveries per tenant (hash td).
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table (its stale front pointers are dropped here)
-- KEYS[3] lz  zset    lease deadlines (ms)
-- KEYS[4] lt  hash    leases
-- KEYS[5] wk  list    wake tokens of this consumer
-- KEYS[6..13] te ts tb fv fc fn tw fr: fairness state (see includes/fair.lua)
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] lease_ms     lease length, milliseconds
-- ARGV[2] consumer     consumer id (no ",")
-- ARGV[3] token_base   random string; lease tokens are token_base .. "." .. n
-- ARGV[4] count        entries wanted (>= 1)
-- ARGV[5] stale_budget  stale entries to discard at most before returning
-- ARGV[6] conc         default concurrency cap per tenant (0: none)
-- ARGV[7] rate         default deliveries per second per tenant (0: none)
-- ARGV[8] lo           best rank of a priority view (within_priority only)
-- ARGV[9] hi           worst rank of a priority view (within_priority only)
-- ARGV[10] take_hi     worst rank this call takes, within_priority only (as in pop); the
--                      wake-up still looks at lo..hi
-- ARGV[11] nacks       leases to ack first
-- ARGV[12..11+2*nacks] eid token...  those leases, a pair each: entry id, lease token
-- Returns: {stale_discarded, nacks, due_in (as pop.lua), ack codes (as ack.lua), eid1, token1,
--           deliveries1, score1, value1, eid2, ...}; the error reply MODE_MISMATCH (nothing done) when the caller's
--           mode is not the queue's. A malformed entry it meets goes to the dead-letter queue.
-- An entry past its expiry deadline is never delivered: dead-lettered or dropped as in pop, at
-- most EXPIRE_BUDGET per call. Counts as pop does. A tenant-order member is served only when it is current, as pop serves a pointer: its entry
-- is there, not leased, and has the member's score; any other member is stale and dropped.
-- ERR -2 NOT_LEASED
-- ERR -3 TOKEN_MISMATCH
-- ERR -8 MODE_MISMATCH
-- ERR -9 MIGRATING
--!include counters.lua
--!include dead.lua
--!include delays.lua
--!include fair.lua
--!include index.lua
--!include leases.lua
--!include queue.lua
--!include records.lua
--!include wake.lua
--!keys

--!queue
local lease_ms = tonumber(ARGV[1])
local consumer, token_base = ARGV[2], ARGV[3]
local want, stale_budget = tonumber(ARGV[4]), tonumber(ARGV[5])
FA = { conc = tonumber(ARGV[6]), rate = tonumber(ARGV[7]) }
local lo, hi = tonumber(ARGV[8]), tonumber(ARGV[9])
local lex_lo, lex_hi = '-', '+'
if CTX.scope == 'P' and not (lo == 0 and hi == 255) then
  lex_lo, lex_hi = '[' .. string.format('%03d', lo), '(' .. string.format('%03d', hi + 1)
end
local take_hi = math.min(tonumber(ARGV[10]), hi)
local take_lo, take_lex_hi = lex_lo, lex_hi
if CTX.scope == 'P' and take_hi < hi then
  take_lo, take_lex_hi = '[' .. string.format('%03d', lo), '(' .. string.format('%03d', take_hi + 1)
end

local nacks = tonumber(ARGV[11])
local out = { 0, nacks, -1 }
for i = 1, nacks do
  local code, t, s, ch = ack_one(ii, lz, lt, ARGV[10 + 2 * i], ARGV[11 + 2 * i])
  if code == 1 then
    fair_release(t)
    fair_settle(t, s, ch, false, now_ms()) -- (fair_cost "time" only: ch is nil otherwise)
  end
  out[#out + 1] = code
end
if CTX.paused then
  redis.call('DEL', wk)
  flush_counts()
  return out
end
local now = now_ms()
local due_in, _, promoted = promote_at_pop(ii, pi, key_of('dz'), now, fair_add)
out[3] = due_in
if promoted > 0 and wk ~= key_of('wk') then
  wake(key_of('wk'))
end
fair_unpark(now)
local got, stale, looked, expiring = 0, 0, 0, 0
local P = { lease = {}, deadline = {}, out = out, now = now, until_ms = fmt(now + lease_ms) }
local served = {}
local per_tenant = {} -- tenant -> deliveries in this call
while got < want and stale < stale_budget and looked < stale_budget + expiring and expiring < EXPIRE_BUDGET do
  looked = looked + 1
  local m = redis.call('ZRANGEBYLEX', FK.ts, take_lo, take_lex_hi, 'LIMIT', 0, 1)[1]
  if not m then
    break
  end
  local t, level, start = ts_tenant(m)
  local weight, conc, rate, paused = settings(t)
  local ok, due = true, 0
  if not (level and start) then -- not a schedule member: dropped
    redis.call('ZREM', FK.ts, m)
    ok = false
  elseif paused then
    fair_park(t, m, 'P', 0)
    ok = false
  elseif conc > 0 and (tonumber(redis.call('HGET', FK.fn, 'c:' .. t)) or 0) >= conc then
    fair_park(t, m, 'C', 0)
    ok = false
  elseif rate > 0 then
    ok, due = fair_token(t, rate, now)
    if not ok then
      fair_park(t, m, 'R', due)
    end
  end
  if ok then
    local head, rank, seq, eid = te_head(t)
    if head and not rank then -- not an entry's member: dropped
      redis.call('ZREM', FK.te, head)
    elseif not head then
      fair_refresh(t, false)
    else
      -- The checks of pop's pi_entry: a member whose entry is gone, is leased (delivered
      -- already), or has another score (moved, or made again under its id) is stale, and goes;
      -- a malformed entry that is not leased is set aside.
      redis.call('ZREM', FK.te, head)
      local score = fmt(rank * SEQ_SPAN + seq)
      local v = redis.call('HGET', ii, eid)
      local leased = v and redis.call('HEXISTS', lt, eid) == 1
      local e, bar
      if v and not leased then
        e, bar = split_entry(v)
      end
      if v and not leased and not e then
        set_aside(ii, eid, v, rank, now)
      end
      if not e or e.s ~= score then
        stale = stale + 1
        fair_left(t, rank)
        fair_refresh(t, false)
      elseif expired(e, now) then
        expire(ii, eid, v, e, bar, score, now)
        expiring = expiring + 1
        served[rank] = true -- its pointer is stale now: trimmed below with the served ranks'
        fair_left(t, rank)
        fair_refresh(t, false)
      else
        served[rank] = true
        got = got + 1
        add_lease(P, eid, token_base .. '.' .. got, consumer, score, e.d + 1, e.x, t, v)
        per_tenant[t] = (per_tenant[t] or 0) + 1
        fair_served(t, rank, start, weight, fair_cost(t, eid, e, now, weight))
        fair_refresh(t, true)
      end
    end
  end
end
out[1] = stale
write_leases(P, lt, lz)
for t, k in pairs(per_tenant) do
  redis.call('HINCRBY', key_of('td'), t, k)
end
-- A fair pop serves from the tenant's order, so the pointers of the served ranks' lists go
-- stale where they are; drop the stale ones at the front, stale_budget + want at most in all
-- (a rank whose head cannot be served keeps its stale pointers for the compaction steps).
local budget = stale_budget + want
for rank in pairs(served) do
  if budget <= 0 then
    break
  end
  budget = budget - pi_trim(ii, lt, pi, rank, budget) - 1
end
if redis.call('ZCARD', FK.te) == 0 then -- nothing waits: every pointer left is stale
  pi_unlink_all(pi)
end
wake_if(wk, #redis.call('ZRANGEBYLEX', FK.ts, lex_lo, lex_hi, 'LIMIT', 0, 1) > 0)
flush_counts()
return out
