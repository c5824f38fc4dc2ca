-- Shared helpers, pasted into a script where it says `--!include common.lua`.
--
-- An entry in the identifier-indexed table (hash ii) is   header "|" payload
-- with header = "d,s,t,x,r,ts":
--   d   deliveries so far (integer)
--   s   score in the priority index (technique T only; empty under technique S)
--   t   tenant (escaped by the client: no "," or "|")
--   x   flags: "d" when the entry id is a duplicate id "<task id>~<seq>"
--   r   dead-letter note "<reason>@<ms>@<deliveries>" (entries of a .dead queue only)
--   ts  enqueue time, ms on the Redis clock
-- A lease (hash lt) is "token,consumer,score,deliveries,flags,tenant".

local SEQ_SPAN = 17592186044416 -- 2^44: score = rank * SEQ_SPAN + seq
local DUP_SEP = '\31'

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fmt(n)
  return string.format('%.0f', n)
end

local function split_entry(v)
  local bar = string.find(v, '|', 1, true)
  local h = string.sub(v, 1, bar - 1)
  local d, s, t, x, r, ts = string.match(h, '^([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),([^,]*)$')
  return { d = tonumber(d) or 0, s = s or '', t = t or '', x = x or '', r = r or '', ts = ts or '' }, bar
end

local function join_entry(e, v, bar)
  return fmt(e.d) .. ',' .. e.s .. ',' .. e.t .. ',' .. e.x .. ',' .. e.r .. ',' .. e.ts .. string.sub(v, bar)
end

local function split_lease(info)
  local tok, c, s, d, x, t = string.match(info, '^([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),([^,]*)$')
  return tok, c, s, tonumber(d) or 0, x, t
end

-- Record one delivery of a pop: its lease fields (written in one HSET/ZADD after the loop) and
-- its reply (eid, token, deliveries, score, value).
local function add_lease(P, eid, token, consumer, score, d, x, t, v)
  P.lease[#P.lease + 1] = eid
  P.lease[#P.lease + 1] = token .. ',' .. consumer .. ',' .. score .. ',' .. fmt(d) .. ',' .. x .. ',' .. t
  P.deadline[#P.deadline + 1] = P.until_ms
  P.deadline[#P.deadline + 1] = eid
  local out = P.out
  out[#out + 1] = eid
  out[#out + 1] = token
  out[#out + 1] = d
  out[#out + 1] = score
  out[#out + 1] = v
end

-- Write the leases a pop recorded.
local function write_leases(P, lt, lz)
  if #P.lease > 0 then
    redis.call('HSET', lt, unpack(P.lease))
    redis.call('ZADD', lz, unpack(P.deadline))
  end
end

-- Leave one wake token for a blocked consumer (at most one waits in the list).
local function wake(wk)
  if redis.call('LLEN', wk) == 0 then
    redis.call('RPUSH', wk, '1')
  end
end

-- Store the duplicate entry ids of one task id (none left: the field goes).
local function dup_store(dp, tid, ids)
  if #ids == 0 then
    redis.call('HDEL', dp, tid)
  else
    redis.call('HSET', dp, tid, table.concat(ids, DUP_SEP))
  end
end

-- Wake the priority views (wake list KEYS[kbase + v], rank range ARGV[abase + v] "lo,hi")
-- whose range holds rank; n views.
local function wake_views(kbase, abase, n, rank)
  for v = 1, n do
    local lo, hi = string.match(ARGV[abase + v], '^(%d+),(%d+)$')
    if rank >= tonumber(lo) and rank <= tonumber(hi) then
      wake(KEYS[kbase + v])
    end
  end
end

-- Forget a duplicate entry id "<task id>~<seq>" in the duplicates hash.
local function dup_forget(dp, eid)
  local tid = string.match(eid, '^(.*)~%d+$')
  if not tid then
    return
  end
  local list = redis.call('HGET', dp, tid)
  if not list then
    return
  end
  local rest = {}
  for e in string.gmatch(list, '[^' .. DUP_SEP .. ']+') do
    if e ~= eid then
      rest[#rest + 1] = e
    end
  end
  dup_store(dp, tid, rest)
end

-- Put a returned entry back in the priority index at its old score (InProcess -> Waiting).
local function to_waiting(ii, pi, eid, v, e, bar, score, technique)
  if technique == 'T' then
    e.s = score
  else
    e.s = ''
  end
  redis.call('HSET', ii, eid, join_entry(e, v, bar))
  redis.call('ZADD', pi, score, eid)
end

-- Move entry eid (value v, parsed e, split at bar) from its queue to the dead-letter queue.
-- It keeps its priority; its dead-letter note says why, when and after how many deliveries.
local function to_dead(ii, dp, dii, dpi, dwk, dsq, eid, v, e, bar, score, reason, now)
  local seq = redis.call('INCR', dsq)
  local rank = math.floor(tonumber(score) / SEQ_SPAN)
  local dscore = rank * SEQ_SPAN + seq
  local deid = eid
  if redis.call('HEXISTS', dii, deid) == 1 then
    deid = eid .. '~' .. seq
  end
  local was_dup = e.x == 'd'
  e.r = reason .. '@' .. fmt(now) .. '@' .. fmt(e.d)
  e.d = 0
  e.s = fmt(dscore)
  e.x = ''
  redis.call('HSET', dii, deid, join_entry(e, v, bar))
  redis.call('ZADD', dpi, fmt(dscore), deid)
  wake(dwk)
  redis.call('HDEL', ii, eid)
  if was_dup then
    dup_forget(dp, eid)
  end
  return deid
end
