-- Delayed entries (BQF "Date/Time Scheduled"): the zset dz of the entries due later, score =
-- due time (ms, Redis clock), member = entry id; the entry keeps its score (rank, seq) in ii.
-- An entry that is due joins the back of its priority, keeping its score, the moment a pop or
-- the sweep of its queue looks (promote_due): a pop promotes at most POP_PROMOTE a call before
-- it takes (promote_at_pop), and tells its consumer when the next one is due, which bounds the
-- consumer's wait (docs/views-and-delays.md, "When a delayed task starts").
--!include dead.lua
--!include events.lua
--!include index.lua
--!include queue.lua
--!include records.lua
--!include wake.lua

-- Due entries one pop promotes at most (about 3 commands each on a plain queue: well under the
-- 10 ms no script call may take); the pop says when more are due now (0). A fair queue's entry
-- costs a dozen (fair_add): FAIR_PROMOTE a call, a pop's or a sweep's.
local POP_PROMOTE = 100
local FAIR_PROMOTE = 50

-- Delayed entries due by now, at most limit, join the back of their priority (their score
-- kept), in due order (ties by id), each logged 'due'; the priority views of their ranks are
-- woken (once per rank). A malformed one is set aside. on_waiting(tenant, score, eid), when
-- given, runs for each (a fair queue: fair_add; a rate-parked tenant stays parked).
-- Returns the entries promoted, and true when limit were due (more may be).
local function promote_due(ii, pi, dz, now, limit, on_waiting)
  local due = redis.call('ZRANGEBYSCORE', dz, '-inf', fmt(now), 'LIMIT', 0, limit)
  if #due == 0 then
    return 0, false
  end
  redis.call('ZREM', dz, unpack(due))
  local promoted, ranks = 0, {}
  for _, eid in ipairs(due) do
    local v, e = read_entry(ii, eid)
    if v and not e then
      set_aside(ii, eid, v, 0, now)
    elseif v then
      local rank, seq = split_score(e.s)
      pi_push(pi, rank, seq, eid)
      emit('due', eid, e.s, e.t)
      ranks[rank] = true
      if on_waiting then
        on_waiting(e.t, e.s, eid)
      end
      promoted = promoted + 1
    end
  end
  for rank in pairs(ranks) do
    wake_registered_views(rank)
  end
  return promoted, #due >= limit
end

-- A pop's promotion: the due delayed entries of the queue (dz: its delayed key) join their
-- priorities before it takes (at most POP_PROMOTE). now: the Redis time if read already.
-- Returns the microseconds until the next delayed entry is due (0: more are due now, -1: none delayed),
-- now (read only when something is delayed: an empty dz costs one ZRANGE), and the promoted.
local function promote_at_pop(ii, pi, dz, now, on_waiting)
  local first = redis.call('ZRANGE', dz, 0, 0, 'WITHSCORES')
  if not first[1] then
    return -1, now, 0
  end
  now = now or now_ms()
  local at = tonumber(first[2])
  if at > now then
    return us_until(at), now, 0
  end
  local n, more = promote_due(ii, pi, dz, now, on_waiting and FAIR_PROMOTE or POP_PROMOTE, on_waiting)
  if more then
    return 0, now, n
  end
  first = redis.call('ZRANGE', dz, 0, 0, 'WITHSCORES')
  if not first[1] then
    return -1, now, n
  end
  return us_until(tonumber(first[2])), now, n
end
