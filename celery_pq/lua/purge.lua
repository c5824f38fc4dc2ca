-- purge: delete up to ARGV[1] waiting entries from the front of the queue, then delayed ones
-- (leased entries stay leased). Called repeatedly by the client until it returns {0, 0}.
-- Counts removed; logs one remove per entry deleted (r "purge"), at most ARGV[1] per call.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table: ranks with waiting entries (and their lists)
-- KEYS[3] wk  list    wake tokens
-- KEYS[4] dz  zset    delayed entries
-- KEYS[5] lt  hash    leases
-- KEYS[6..13] te ts tb fv fc fn tw fr: fairness state (see includes/fair.lua)
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] count  members to take in this call
-- Returns: {entries_deleted, pointers_or_delayed_taken}
--          The error reply MODE_MISMATCH (nothing done) when the caller's mode is not the queue's.
-- ERR -8 MODE_MISMATCH
-- ERR -9 MIGRATING
--!include counters.lua
--!include duplicates.lua
--!include events.lua
--!include fair.lua
--!include index.lua
--!include queue.lua
--!include records.lua
--!include unique.lua
--!keys

--!queue
local fair = CTX.fair
local count = tonumber(ARGV[1])
local taken = pi_take(pi, 0, 255, count)
local found = {} -- {eid, value} of the entries to delete
local seen = {} -- a fair queue's requeued entry may have two current pointers
for i = 1, #taken, 2 do
  local eid, score, v = pi_entry(ii, lt, taken[i], taken[i + 1])
  if eid == false then -- malformed: deleted as asked
    redis.call('HDEL', ii, score)
    dup_forget(score)
    tally('removed')
    emit('remove', score, nil, nil, nil, nil, 'purge')
  elseif eid and not seen[eid] then
    seen[eid] = true
    found[#found + 1] = { eid, v }
  end
end
local n = #taken / 2
if n == 0 then
  local popped = redis.call('ZPOPMIN', dz, count)
  for i = 1, #popped, 2 do
    local v = redis.call('HGET', ii, popped[i])
    if v then
      found[#found + 1] = { popped[i], v }
    end
  end
  n = #popped / 2
end
local tenants = {}
for _, f in ipairs(found) do
  local eid, e = f[1], split_entry(f[2])
  if not e then -- malformed (a delayed one): deleted as asked; its flags unread, it is forgotten
    e = { x = '', s = '0', t = '' } -- as a duplicate id in any case (as a waiting one is above)
    dup_forget(eid)
  end
  redis.call('HDEL', ii, eid)
  emit('remove', eid, e.s, e.t, nil, nil, 'purge')
  entry_gone(eid, e.x)
  if fair then
    local rank, seq = split_score(e.s)
    if redis.call('ZREM', FK.te, te_member(e.t, rank, seq, eid)) == 1 then
      fair_left(e.t, rank)
    end
    tenants[e.t] = true
  end
end
for t in pairs(tenants) do
  fair_refresh(t, false)
end
if redis.call('ZCARD', pi) == 0 then
  redis.call('DEL', wk)
end
tally('removed', #found)
flush_counts()
return { #found, n }
