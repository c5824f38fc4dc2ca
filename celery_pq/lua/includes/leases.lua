-- Leases: recorded by a pop (add_lease or claim_lease, write_leases), ended by an ack or a requeue checked
-- against their token (end_lease, ack_one, ack_pairs), the entry given back to Waiting (to_waiting).
--!include counters.lua
--!include duplicates.lua
--!include events.lua
--!include index.lua
--!include queue.lua
--!include records.lua
--!include unique.lua

-- Values one unpack hands to a command at most: Lua's unpack takes no more than its C stack
-- holds (LUAI_MAXCSTACK, 8000 in Redis's Lua; past it: "too many results to unpack"). Even, so
-- that a chunk of field-value or score-member pairs never splits a pair.
local UNPACK_CHUNK = 4000

-- Run command cmd on key over the values of list, UNPACK_CHUNK at a time (one call for a list
-- as long as that or shorter): a pop's leases, the acks it carries, however many.
local function call_chunked(cmd, key, list)
  local n = #list
  for i = 1, n, UNPACK_CHUNK do
    redis.call(cmd, key, unpack(list, i, math.min(i + UNPACK_CHUNK - 1, n)))
  end
end

-- HMGET of key's fields, UNPACK_CHUNK at a time: the values, in the order of fields.
local function hmget_chunked(key, fields)
  local n = #fields
  if n <= UNPACK_CHUNK then
    return redis.call('HMGET', key, unpack(fields))
  end
  local values = {}
  for i = 1, n, UNPACK_CHUNK do
    local got = redis.call('HMGET', key, unpack(fields, i, math.min(i + UNPACK_CHUNK - 1, n)))
    for j = 1, #got do
      values[i + j - 1] = got[j]
    end
  end
  return values
end

-- Record one delivery of a pop whose lease is written (or recorded in P.lease): its deadline
-- (written in one ZADD after the loop) and its reply (eid, token, deliveries, score, value).
local function record_delivery(P, eid, token, consumer, score, d, t, v)
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

-- Record one delivery of a pop: its lease fields (written in one HSET/ZADD after the loop) and
-- its reply (eid, token, deliveries, score, value).
local function add_lease(P, eid, token, consumer, score, d, x, t, v)
  P.lease[#P.lease + 1] = eid
  P.lease[#P.lease + 1] = join_lease(token, consumer, score, d, x, t)
  record_delivery(P, eid, token, consumer, score, d, t, v)
end

-- Lease entry eid to this pop unless it is leased already (its pointer was stale then): the
-- lease check and the lease's write in one command, HSETNX. Whether it leased it; its deadline
-- and reply are recorded as add_lease's.
local function claim_lease(P, lt, eid, token, consumer, score, d, x, t, v)
  if redis.call('HSETNX', lt, eid, join_lease(token, consumer, score, d, x, t)) == 0 then
    return false
  end
  record_delivery(P, eid, token, consumer, score, d, t, v)
  return true
end

-- Write the leases a pop recorded (P.now: the pop's time). The first leases of a queue that no
-- sweep has run on yet also start the sweep record sw (reclaim.lua): a sweep that comes after a
-- pause measures its gap from them, as if one had run then. Without a record it would see no
-- gap and take the leases that ran out in the pause as expired: with Redis paused right after a
-- consumer's first pop, before its lease keeper's first sweep, its tasks under way ran twice.
-- A pop that has just acked a lease of the queue (P.swept_known) skips that write: the pop that
-- made that lease made sure of the record, and nothing deletes the record but a delete of the
-- whole queue (one DEL of all its keys: that lease's record with it) or of the database. So a
-- consumer's pops in a steady stream, each acking the last ones, make no such write.
local function write_leases(P, lt, lz)
  if #P.deadline > 0 then
    if #P.lease > 0 then
      call_chunked('HSET', lt, P.lease)
    end
    call_chunked('ZADD', lz, P.deadline)
    if not P.swept_known then
      redis.call('SET', key_of('sw'), fmt(P.now), 'NX')
    end
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

-- Under fair_cost "time" (CTX.cost "2"): the charge record of entry eid's ended lease, taken
-- out of lc (includes/fair.lua): {held = ms from its delivery to ended (ms; nil: now),
-- charged = the virtual time its pop charged}; nil when there is none (no command by tasks).
local function take_charge(eid, ended)
  if CTX.cost ~= '2' then
    return nil
  end
  local lc = key_of('lc')
  local rec = redis.call('HGET', lc, eid)
  if not rec then
    return nil
  end
  redis.call('HDEL', lc, eid)
  local at, charged = string.match(rec, '^(%d+),(%d+)$')
  if not at then
    return nil
  end
  return { held = math.max((ended or now_ms()) - tonumber(at), 0), charged = tonumber(charged) }
end

-- Ack one lease (BQF MarkAsDone): the entry is deleted when the token matches. Returns the
-- code (1 acked, or the error code of end_lease), the lease's tenant and score, and its charge
-- record (take_charge: fair_cost "time" only).
local function ack_one(ii, lz, lt, eid, token)
  local lease, err = end_lease(lt, lz, eid, token)
  if not lease then
    return err
  end
  redis.call('HDEL', ii, eid)
  entry_gone(eid, lease.x)
  tally('acked')
  local ch = take_charge(eid)
  emit('ack', eid, lease.s, lease.t, lease.c, nil, nil, nil, ch and ch.held)
  return 1, lease.t, lease.s, ch
end

-- Ack the n leases given in ARGV from index first on as pairs (entry id, token): ack_one's
-- codes (appended to out, in order), counts and events, with one HMGET of their lease records
-- and, for those acked, one HDEL of their leases, one ZREM of their deadlines and one HDEL of
-- their entries (ack_one runs four commands per lease); each of these one per UNPACK_CHUNK
-- values, so that any number of acks can ride with a pop. A pair that repeats an entry acked
-- before it in the call finds it NOT_LEASED, as it would one after the other. Returns whether
-- any was acked.
local function ack_pairs(out, ii, lz, lt, first, n)
  if n == 0 then
    return false
  end
  local eids = {}
  for i = 1, n do
    eids[i] = ARGV[first + 2 * i - 2]
  end
  local infos = hmget_chunked(lt, eids)
  local done, ended = {}, n > 1 and {} -- (ended: the entries acked so far, when one may repeat)
  for i = 1, n do
    local eid, info = eids[i], infos[i]
    if ended and ended[eid] then
      info = false
    end
    if not info then
      out[#out + 1] = NOT_LEASED
    else
      local tok, c, s, _, x, t = split_lease(info)
      if tok ~= ARGV[first + 2 * i - 1] then
        out[#out + 1] = TOKEN_MISMATCH
      else
        if ended then
          ended[eid] = true
        end
        done[#done + 1] = eid
        entry_gone(eid, x)
        tally('acked')
        emit('ack', eid, s, t, c)
        out[#out + 1] = 1
      end
    end
  end
  if #done > 0 then
    call_chunked('HDEL', lt, done)
    call_chunked('ZREM', lz, done)
    call_chunked('HDEL', ii, done)
  end
  return #done > 0
end

-- Put a returned entry back in the priority index at its old place (InProcess -> Waiting).
local function to_waiting(ii, pi, eid, v, e, bar, score)
  e.s = score
  redis.call('HSET', ii, eid, join_entry(e, v, bar))
  local rank, seq = split_score(score)
  pi_return(pi, rank, seq, eid)
end
