-- change_priority: a waiting entry moves to another priority, behind the entries already
-- waiting there (the patent's REMOVE BY ID followed by INSERT with the same id, in one step).
-- Its old pointer goes stale (technique T drops it at once). Logs reprioritize.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table: ranks with waiting entries (and their lists)
-- KEYS[3] lt  hash    leases
-- KEYS[4] sq  string  insertion sequence
-- KEYS[5] dz  zset    delayed entries (a delayed entry keeps its new score until due)
-- KEYS[6..13] te ts tb fv fc fn tw fr: fairness state (see includes/fair.lua)
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] eid         entry id
-- ARGV[2] rank        new rank, 0..255 (0 is served first)
-- Returns: 1 changed, or an error code.
--          The error reply MODE_MISMATCH (nothing done) when the caller's mode is not the queue's.
-- ERR -1 NOT_FOUND
-- ERR -4 NOT_WAITING
-- ERR -8 MODE_MISMATCH
-- ERR -9 MIGRATING
--!include events.lua
--!include fair.lua
--!include index.lua
--!include queue.lua
--!include records.lua
--!include wake.lua
--!keys

--!queue
local eid, rank = ARGV[1], tonumber(ARGV[2])

if redis.call('HEXISTS', lt, eid) == 1 then
  return NOT_WAITING
end
local v, e, bar = read_entry(ii, eid)
if not v then
  return NOT_FOUND
end
if not e then -- malformed: left for the pop that reaches it (which sets it aside)
  return NOT_FOUND
end
local seq = redis.call('INCR', sq)
local score = fmt(rank * SEQ_SPAN + seq)
local old = e.s
e.s = score
redis.call('HSET', ii, eid, join_entry(e, v, bar))
emit('reprioritize', eid, score, e.t)
if redis.call('ZSCORE', dz, eid) then
  return 1 -- it enters the queue with its new score when due
end
pi_push(pi, rank, seq, eid)
wake_registered_views(rank) -- the entry may have moved into a view's range
if CTX.fair then
  fair_level_count(lvl(rank), 1) -- counted at its new level first: a move within a level never empties it
  fair_drop(e.t, old, eid)
  fair_add(e.t, score, eid, true)
  wake(key_of('wk')) -- its tenant is scheduled again (a parked one is parked again by the pop)
elseif CTX.technique == 'T' then
  local orank, oseq = split_score(old)
  pi_drop(pi, orank, make_ptr(oseq, eid))
end
return 1
