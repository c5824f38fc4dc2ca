-- Leases: recorded by a pop (add_lease, write_leases), ended by an ack or a requeue checked
-- against their token (end_lease, ack_one), the entry given back to Waiting (to_waiting).
--!include counters.lua
--!include duplicates.lua
--!include events.lua
--!include index.lua
--!include queue.lua
--!include records.lua
--!include unique.lua

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

-- Write the leases a pop recorded (P.now: the pop's time). The first leases of a queue that no
-- sweep has run on yet also start the sweep record sw (reclaim.lua): a sweep that comes after a
-- pause measures its gap from them, as if one had run then. Without a record it would see no
-- gap and take the leases that ran out in the pause as expired: with Redis paused right after a
-- consumer's first pop, before its lease keeper's first sweep, its tasks under way ran twice.
local function write_leases(P, lt, lz)
  if #P.lease > 0 then
    redis.call('HSET', lt, unpack(P.lease))
    redis.call('ZADD', lz, unpack(P.deadline))
    redis.call('SET', key_of('sw'), fmt(P.now), 'NX')
  end
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
  if lease.x ~= '' then -- flags: "d" a duplicate id, "u" it holds a unique key
    if string.find(lease.x, 'd', 1, true) then
      dup_forget(dp, eid)
    end
    if holds_key(lease.x) then
      unique_release(eid)
    end
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
