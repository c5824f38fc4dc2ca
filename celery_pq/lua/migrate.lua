-- migrate: change a queue's mode on purpose (an admin operation): the priority index and the
-- fairness state are rebuilt from the identifier-indexed table for the caller's mode, and the
-- mode record is rewritten. Waiting entries keep their order within a priority; a change of
-- priority order turns every rank around (entries, leases and delayed entries keep their
-- priority); leased entries stay leased to their holders; malformed entries go to the
-- dead-letter queue. Reads the whole table in one call: O(entries), Redis waits meanwhile.
-- A queue with no mode record is taken to have the caller's priority order.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table: ranks with waiting entries (and their lists)
-- KEYS[3] lt  hash    leases
-- KEYS[4] dz  zset    delayed entries
-- KEYS[5..12] te ts tb fv fc fn tw fr: fairness state (see includes/fair.lua)
-- ARGV[0] the queue context (see includes/common.lua): sent last, taken off ARGV first: the new mode
-- Returns: {waiting entries indexed, leased entries kept, malformed entries set aside}
--!include common.lua
--!include fair.lua
--!keys

take_context()
local new = CTX.mode
local fair, order = string.sub(new, 1, 1) == '1', string.sub(new, 3, 3)
FA = { scope = string.sub(new, 2, 2), conc = 0, rate = 0 }
local md = key_of('md')
local old = redis.call('GET', md) or new
read_switches(string.sub(old, 5)) -- paused and the event log stay as they were
local flip = string.sub(old, 3, 3) ~= order
local now = now_ms()

for _, r in ipairs(redis.call('ZRANGE', pi, 0, -1)) do
  redis.call('DEL', level_key(pi, r))
end
redis.call('DEL', pi, FK.te, FK.ts, FK.tb, FK.fv, FK.fn, FK.tw, FK.fr)

local all = redis.call('HGETALL', ii)
local levels = {}
local waiting, leased, bad = 0, 0, 0
for i = 1, #all, 2 do
  local eid, v = all[i], all[i + 1]
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
      levels[rank] = levels[rank] or {}
      local list = levels[rank]
      list[#list + 1] = { seq, eid }
      if fair then
        fair_add(e.t, e.s, eid)
      end
      waiting = waiting + 1
    end
  end
end
for rank, list in pairs(levels) do
  table.sort(list, function(a, b) return a[1] < b[1] end)
  local key = level_key(pi, rank)
  for i = 1, #list, 1000 do
    local ptrs = {}
    for j = i, math.min(i + 999, #list) do
      ptrs[#ptrs + 1] = make_ptr(list[j][1], list[j][2])
    end
    redis.call('RPUSH', key, unpack(ptrs))
  end
  redis.call('ZADD', pi, rank, rank)
end
write_mode(new)
return { waiting, leased, bad }
