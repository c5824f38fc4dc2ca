-- Fair delivery by tenant (queue-by, generalised to weights and priorities): start-time fair
-- queueing over the tenants that have waiting work, all state under the queue's hash tag.
-- Pasted into a script where it says `--!include fair.lua`. The script's key bindings fill FK;
-- the scope is the queue's (CTX.scope, from its context: includes/queue.lua); a script that
-- schedules by the tenants' caps sets FA before calling these functions.
--
-- FK.te  zset (lex)  every waiting entry as  tenant "\0" rank(3) seq(14) eid: a tenant's best
--                    entry is the first member of its prefix (ZRANGEBYLEX, O(log n))
-- FK.ts  zset (lex)  one member per schedulable tenant: [rank(3)] start(17) tenant; the first
--                    member is served next. rank only under within_priority.
-- FK.tb  hash        tenant -> state letter .. its ts member. A active (in ts), C parked at its
--                    concurrency cap, R parked by its rate limit (also in tw), P paused.
-- FK.fv  hash        "V:<level>" system virtual time of a level; "F:<level>:<tenant>" finish tag;
--                    "L:<level>" waiting entries at the level; "M:<level>" largest finish tag
--                    given at the level. When a level runs empty its V moves to its M (start-time
--                    fair queueing's rule at the end of a busy period), so every finish tag there
--                    is <= V and the tags of tenants that left can go (fair_gc). "T" the Redis
--                    time (ms) of the latest rate park: a later time below it is Redis's clock
--                    stepped back (fair_unpark). "A:<t>" tenant t's running average cost
--                    (fair_cost "time"), "A" the queue's (no colon: "A:" is the average of the
--                    tasks without a tenant, tenant "")
-- FK.fc  hash        tenant settings: "w:<t>" weight, "c:<t>" concurrency cap, "r:<t>" rate/s,
--                    "p:<t>" present while the tenant is paused
-- FK.fn  hash        counts: "n:<t>" waiting entries, "c:<t>" leased entries
-- FK.tw  zset        rate-parked tenants, score = ms when a token is there again
-- FK.fr  hash        token buckets: tenant -> "tokens,last_ms"
-- CTX.scope  "P" within_priority or "T" tenant_first
-- FA.conc, FA.rate  defaults for tenants without their own setting (0 = none)
-- Virtual time is in units of 1/1,000,000 of a delivery at weight 1.
--
-- What a delivery costs its tenant (CTX.cost, the queue's fair_cost; docs/fairness.md): "1"
-- tasks, VT_UNIT each; "3" declared, COST_UNIT times the cost flag "c<n>" its entry was stored
-- with (insert.lua; none: 1); "2" time, TIME_UNIT per ms its lease is held (delivery to its end,
-- Redis clock). Time is known only when the lease ends, so the pop charges a provisional cost
-- (the tenant's running average "A:<t>" in fv, else the queue's "A", else COST_UNIT) and records
-- it with the delivery's time in lc (eid -> "<ms>,<virtual time charged>": take_charge,
-- includes/leases.lua); the lease's end (ack, requeue, expiry at its deadline) moves the tenant's
-- finish tag at the lease's level by actual - provisional (fair_settle, fair_charge): O(1) more
-- commands, the schedule still O(log n). A charge that comes when its level has no waiting entry
-- (its busy period is over) moves V up to the corrected tag as well, so every tag there stays
-- <= V (the invariant fair_gc relies on); a tag fair_gc dropped counts as V. lc records whose
-- lease is gone are dropped by fair_gc_charges; "A:" fields of tenants that left by fair_gc.
-- Held ms per tenant are added up in th ("<t>" all time, "<minute>|<t>" per minute; fields of
-- minutes more than 10 old dropped by fair_gc_charges) for the operators' worker-time share.
--!include queue.lua

local FK = {}
local FA = { conc = 0, rate = 0 }
local VT_UNIT = 1000000
local COST_UNIT = 100000 -- a declared cost of 1; a second of lease held
local TIME_UNIT = 100 -- a ms of lease held
local MAX_HELD_MS = 86400000 -- a lease is charged a day at most

local function lvl(rank)
  if CTX.scope == 'P' then
    return rank
  end
  return 0
end

-- A tenant-order member (layout: celery_pq/records.py).
local function te_member(t, rank, seq, eid)
  return t .. '\0' .. string.format('%03d%014.0f', rank, seq) .. eid
end

-- rank, seq, eid of member m of tenant t's order; nil when m is not an entry's member.
local function split_te_member(t, m)
  local p = #t + 2
  local rank, seq = tonumber(string.sub(m, p, p + 2)), tonumber(string.sub(m, p + 3, p + 16))
  if not (rank and seq) then
    return nil
  end
  return rank, seq, string.sub(m, p + 17)
end

-- Tenant t's best member and its rank, seq and eid (no rank: not an entry's member, the caller
-- drops it), or nil when t has no waiting entry.
local function te_head(t)
  local m = redis.call('ZRANGEBYLEX', FK.te, '[' .. t .. '\0', '(' .. t .. '\1', 'LIMIT', 0, 1)[1]
  if not m then
    return nil
  end
  return m, split_te_member(t, m)
end

local function ts_tenant(m)
  if CTX.scope == 'P' then
    return string.sub(m, 21), tonumber(string.sub(m, 1, 3)), tonumber(string.sub(m, 4, 20))
  end
  return string.sub(m, 18), 0, tonumber(string.sub(m, 1, 17))
end

-- weight, concurrency cap, rate and whether tenant t is paused (one HMGET).
local function settings(t)
  local s = redis.call('HMGET', FK.fc, 'w:' .. t, 'c:' .. t, 'r:' .. t, 'p:' .. t)
  return tonumber(s[1]) or 1, tonumber(s[2]) or FA.conc, tonumber(s[3]) or FA.rate, s[4] ~= false
end

-- Put tenant t where it belongs in the schedule after its entries changed. With force, its
-- start tag is recomputed even at the same level (after it was served).
local function fair_refresh(t, force)
  local old = redis.call('HGET', FK.tb, t)
  local state, oldm = 'A', nil
  if old then
    state, oldm = string.sub(old, 1, 1), string.sub(old, 2)
  end
  local head, rank = te_head(t)
  if not head then
    if oldm then
      redis.call('ZREM', FK.ts, oldm)
      redis.call('ZREM', FK.tw, t)
      redis.call('HDEL', FK.tb, t)
    end
    return
  end
  local level = lvl(rank)
  if oldm and not force then
    local _, oldlevel = ts_tenant(oldm)
    if oldlevel == level then
      return
    end
  end
  local v = redis.call('HMGET', FK.fv, 'V:' .. level, 'F:' .. level .. ':' .. t)
  local start = math.max(tonumber(v[1]) or 0, tonumber(v[2]) or 0)
  local m = string.format('%017.0f', start) .. t
  if CTX.scope == 'P' then
    m = string.format('%03d', level) .. m
  end
  if oldm and state == 'A' then
    redis.call('ZREM', FK.ts, oldm)
  end
  redis.call('HSET', FK.tb, t, state .. m)
  if state == 'A' then
    redis.call('ZADD', FK.ts, 0, m)
  end
end

-- Waiting entries at a level change by d; a level that runs empty ends its busy period: its
-- virtual time moves up to the largest finish tag given there.
local function fair_level_count(level, d)
  if redis.call('HINCRBY', FK.fv, 'L:' .. level, d) > 0 then
    return
  end
  redis.call('HDEL', FK.fv, 'L:' .. level)
  local m = redis.call('HGET', FK.fv, 'M:' .. level)
  if m then
    redis.call('HSET', FK.fv, 'V:' .. level, m)
  end
end

-- One waiting entry of tenant t at rank leaves its tenant's order (served, removed, purged,
-- found gone): the tenant's and the level's counts drop.
local function fair_left(t, rank)
  if redis.call('HINCRBY', FK.fn, 'n:' .. t, -1) <= 0 then
    redis.call('HDEL', FK.fn, 'n:' .. t)
  end
  fair_level_count(lvl(rank), -1)
end

-- Entry (tenant t, score, eid) becomes Waiting. counted: the level counted it already.
local function fair_add(t, score, eid, counted)
  local rank, seq = split_score(score)
  redis.call('ZADD', FK.te, 0, te_member(t, rank, seq, eid))
  redis.call('HINCRBY', FK.fn, 'n:' .. t, 1)
  if not counted then
    fair_level_count(lvl(rank), 1)
  end
  fair_refresh(t, false)
end

-- Entry (tenant t, score, eid) stops Waiting without being delivered (removed, purged).
local function fair_drop(t, score, eid)
  local rank, seq = split_score(score)
  if redis.call('ZREM', FK.te, te_member(t, rank, seq, eid)) == 1 then
    fair_left(t, rank)
  end
  fair_refresh(t, false)
end

-- Tenant t, parked with state ('C' cap, 'R' rate or 'P' paused), goes back into the schedule.
local function fair_resume(t, state)
  local old = redis.call('HGET', FK.tb, t)
  if old and string.sub(old, 1, 1) == state then
    local m = string.sub(old, 2)
    redis.call('HSET', FK.tb, t, 'A' .. m)
    redis.call('ZADD', FK.ts, 0, m)
  end
end

-- A lease of tenant t ended (ack, requeue, expiry, dead-letter): one more may be taken.
local function fair_release(t)
  if redis.call('HINCRBY', FK.fn, 'c:' .. t, -1) <= 0 then
    redis.call('HDEL', FK.fn, 'c:' .. t)
  end
  fair_resume(t, 'C')
end

-- Rate-parked tenants whose token is due go back into the schedule. A time before the latest
-- rate park (fv "T") is Redis's clock stepped back (a failover to a replica whose clock is
-- behind, an NTP step): every parked tenant goes back, 100 a call, instead of waiting out the
-- step; its next pop finds its bucket as it was and parks it again for one period at most.
local function fair_unpark(now)
  local due = redis.call('ZRANGEBYSCORE', FK.tw, '-inf', fmt(now), 'LIMIT', 0, 100)
  local parked = tonumber(redis.call('HGET', FK.fv, 'T'))
  if parked and now < parked then
    due = redis.call('ZRANGE', FK.tw, 0, 99)
    if #due < 100 then
      redis.call('HDEL', FK.fv, 'T')
    end
  end
  for _, t in ipairs(due) do
    redis.call('ZREM', FK.tw, t)
    fair_resume(t, 'R')
  end
end

-- The tokens of bucket record b ("tokens,last_ms") of a tenant with rate (per second) at now;
-- nil when b is not a bucket's. The time since the last refill counts from 0 up: a refill time
-- ahead of now (the clock stepped back) refills nothing and takes nothing, and the bucket is
-- written with now as its refill time, so a step back costs at most the period the bucket waits
-- for its next token. Never fewer than 0 tokens, nor more than max(rate, 1).
local function bucket_tokens(b, rate, now)
  local a, l = string.match(b or '', '^([^,]*),(.*)$')
  a, l = tonumber(a), tonumber(l)
  if not (a and l) then
    return nil
  end
  return math.min(math.max(rate, 1), math.max(a, 0) + math.max(now - l, 0) * rate / 1000)
end

-- Take a token from tenant t's bucket (rate per second); false and the ms it is due if none.
local function fair_token(t, rate, now)
  local tokens = bucket_tokens(redis.call('HGET', FK.fr, t), rate, now) or rate -- unreadable: starts again
  if tokens < 1 then
    redis.call('HSET', FK.fr, t, tokens .. ',' .. fmt(now))
    redis.call('HSET', FK.fv, 'T', fmt(now))
    return false, now + math.ceil((1 - tokens) * 1000 / rate)
  end
  redis.call('HSET', FK.fr, t, (tokens - 1) .. ',' .. fmt(now))
  return true
end

-- Park tenant t (schedule member m) with state 'C', 'R' or 'P'.
local function fair_park(t, m, state, due)
  redis.call('ZREM', FK.ts, m)
  redis.call('HSET', FK.tb, t, state .. m)
  if state == 'R' then
    redis.call('ZADD', FK.tw, due, t)
  end
end

-- The tenant served (its entry at rank): advance its finish tag by cost (at weight 1; nil:
-- VT_UNIT) / weight and the level's virtual time.
local function fair_served(t, rank, start, weight, cost)
  local level = lvl(rank)
  local finish = start + math.floor((cost or VT_UNIT) / weight + 0.5)
  -- V never moves down: a capped tenant served late with an older start leaves it where it is,
  -- so a finish tag the clean-up dropped as <= V can never matter again.
  local v = math.max(tonumber(redis.call('HGET', FK.fv, 'V:' .. level)) or 0, start)
  redis.call('HSET', FK.fv, 'V:' .. level, fmt(v), 'F:' .. level .. ':' .. t, fmt(finish))
  if finish > (tonumber(redis.call('HGET', FK.fv, 'M:' .. level)) or 0) then
    redis.call('HSET', FK.fv, 'M:' .. level, fmt(finish))
  end
  redis.call('HINCRBY', FK.fn, 'c:' .. t, 1)
  fair_left(t, rank)
end

-- What serving entry eid (parsed entry e) of tenant t at weight costs, at weight 1: VT_UNIT by
-- tasks (no command); by declared cost its cost flag; by time the provisional cost, recorded in lc.
local function fair_cost(t, eid, e, now, weight)
  if CTX.cost == '3' then
    local c = tonumber(string.match(e.x, 'c([%d.]+)'))
    return math.floor(math.min(math.max(c or 1, 0.001), 10000) * COST_UNIT + 0.5)
  elseif CTX.cost ~= '2' then
    return VT_UNIT
  end
  local a = redis.call('HMGET', FK.fv, 'A:' .. t, 'A')
  local cost = tonumber(a[1]) or tonumber(a[2]) or COST_UNIT
  redis.call('HSET', key_of('lc'), eid, fmt(now) .. ',' .. fmt(math.floor(cost / weight + 0.5)))
  return cost
end

-- Move tenant t's finish tag at level by d (virtual time, after its weight), as if its past
-- deliveries had been charged that much more; the tenant's start tag follows when it waits at
-- that level. See the header: an idle level's V follows the tag up.
local function fair_charge(t, level, d)
  if d == 0 then
    return
  end
  local f = 'F:' .. level .. ':' .. t
  local got = redis.call('HMGET', FK.fv, 'V:' .. level, f, 'M:' .. level, 'L:' .. level)
  local v = tonumber(got[1]) or 0
  local tag = math.max((tonumber(got[2]) or v) + d, 0)
  if not got[2] and tag <= v then
    return -- (no tag, or one dropped as <= V: one <= V changes nothing)
  end
  redis.call('HSET', FK.fv, f, fmt(tag))
  if tag > (tonumber(got[3]) or 0) then
    redis.call('HSET', FK.fv, 'M:' .. level, fmt(tag))
  end
  if not got[4] and tag > v then
    redis.call('HSET', FK.fv, 'V:' .. level, fmt(tag))
  end
  local old = redis.call('HGET', FK.tb, t)
  if old then
    local _, oldlevel = ts_tenant(string.sub(old, 2))
    if oldlevel == level then
      fair_refresh(t, true)
    end
  end
end

-- Settle the charge ch (take_charge's) of a lease of tenant t at score that has ended: the
-- finish tag moves by what its time held costs less what the pop charged; with refund, the
-- delivery is undone and costs nothing. The held time goes into the tenant's running average
-- and into th.
local function fair_settle(t, score, ch, refund, now)
  if not ch then
    return
  end
  local weight = settings(t)
  local actual = 0
  if not refund then
    local held = math.min(ch.held, MAX_HELD_MS)
    actual = held * TIME_UNIT
    local a = redis.call('HMGET', FK.fv, 'A:' .. t, 'A')
    local mine, all = tonumber(a[1]), tonumber(a[2])
    redis.call('HSET', FK.fv, 'A:' .. t, fmt(mine and mine + (actual - mine) / 8 or actual),
      'A', fmt(all and all + (actual - all) / 16 or actual))
    local th = key_of('th')
    redis.call('HINCRBY', th, t, held)
    redis.call('HINCRBY', th, fmt(math.floor(now / 60000)) .. '|' .. t, held)
  end
  fair_charge(t, lvl((split_score(score))), math.floor(actual / weight + 0.5) - ch.charged)
end

-- The clean-up of a fair_cost="time" queue (run by the sweep, about budget fields per call):
-- charge records of leases that are gone (lt: the leases), minutes of th older than 10.
local function fair_gc_charges(gc, lt, now, budget)
  local cur = redis.call('HMGET', gc, 'lc', 'th')
  local scan = redis.call('HSCAN', key_of('lc'), cur[1] or '0', 'COUNT', budget)
  for i = 1, #scan[2], 2 do
    if redis.call('HEXISTS', lt, scan[2][i]) == 0 then
      redis.call('HDEL', key_of('lc'), scan[2][i])
    end
  end
  local scan2 = redis.call('HSCAN', key_of('th'), cur[2] or '0', 'COUNT', budget)
  local old = math.floor(now / 60000) - 10
  for i = 1, #scan2[2], 2 do
    local minute = tonumber(string.match(scan2[2][i], '^(%d+)|'))
    if minute and minute < old then
      redis.call('HDEL', key_of('th'), scan2[2][i])
    end
  end
  redis.call('HSET', gc, 'lc', scan[1], 'th', scan2[1])
end

-- The clean-up of tenants that left (run by the sweep, about `budget` fields per call): a
-- finish tag "F:<level>:<t>" of a tenant with no waiting entry that is <= the level's virtual
-- time changes nothing (a returning tenant starts at max(V, F) = V), and a full token bucket of
-- such a tenant is the same as none; both go. Every tag of a level is <= V once the level has
-- run empty (fair_level_count), so tenants that left do not pile up. Cursors in key gc.
local function fair_gc(gc, now, budget)
  local cur = redis.call('HMGET', gc, 'fv', 'fr')
  local scan = redis.call('HSCAN', FK.fv, cur[1] or '0', 'COUNT', budget)
  for i = 1, #scan[2], 2 do
    local field, tag = scan[2][i], tonumber(scan[2][i + 1])
    local level, t = string.match(field, '^F:(%d+):(.*)$')
    local avg = string.match(field, '^A:(.*)$') -- a running average (fair_settle) of one that left
    if avg and redis.call('HEXISTS', FK.tb, avg) == 0 and redis.call('HEXISTS', FK.fn, 'c:' .. avg) == 0 then
      redis.call('HDEL', FK.fv, field)
    end
    if level and redis.call('HEXISTS', FK.tb, t) == 0 then
      local v = tonumber(redis.call('HGET', FK.fv, 'V:' .. level)) or 0
      if not tag or tag <= v then
        redis.call('HDEL', FK.fv, field)
      end
    end
  end
  local scan2 = redis.call('HSCAN', FK.fr, cur[2] or '0', 'COUNT', budget)
  for i = 1, #scan2[2], 2 do
    local t = scan2[2][i]
    if redis.call('HEXISTS', FK.tb, t) == 0 then
      local _, _, rate = settings(t)
      local tokens = rate > 0 and bucket_tokens(scan2[2][i + 1], rate, now)
      if not tokens or tokens >= math.max(rate, 1) then
        redis.call('HDEL', FK.fr, t)
      end
    end
  end
  redis.call('HSET', gc, 'fv', scan[1], 'fr', scan2[1])
end
