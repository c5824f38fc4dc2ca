-- peek_head: the rank and the enqueue time of the entry a pop would take first (read-only),
-- which a consumer of a sharded queue compares across the shards it peeks (shards.py): the
-- best rank wins, and between equal ranks the older head, so FIFO within a priority roughly
-- holds across shards too. Stale pointers at the front are skipped, not deleted. A delayed
-- entry that is due counts as waiting (the pop promotes it: includes/delays.lua): the first due
-- one stands for them when it beats the head, and the reply says when the next is due.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table: ranks with waiting entries (and their lists)
-- KEYS[3] lt  hash    leases
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] lo           best rank of a priority view (0: the whole queue)
-- ARGV[2] hi           worst rank of a priority view (255: the whole queue)
-- ARGV[3] stale_budget  stale pointers to skip at most
-- Returns: {rank, enqueued_ms, due_in} of the first waiting entry of ranks lo..hi; {rank, 0,
--          due_in} when only stale pointers came within stale_budget (the pop clears them);
--          {-1, 0, due_in} when the queue has no pointer there; {} when it is paused (a pop
--          would deliver nothing). due_in: µs until its first delayed entry is due (0: due now,
--          -1: none delayed).
--          The error reply MODE_MISMATCH (nothing done) when the caller's mode is not the queue's.
-- ERR -8 MODE_MISMATCH
-- ERR -9 MIGRATING
--!include index.lua
--!include records.lua
--!include queue.lua
--!keys

--!queue
local lo, hi = tonumber(ARGV[1]), tonumber(ARGV[2])
local stale_budget = tonumber(ARGV[3])
if CTX.paused then
  return {}
end
local function head()
  local stale = 0
  for _, r in ipairs(redis.call('ZRANGEBYSCORE', pi, lo, '(' .. (hi + 1))) do
    local rank = tonumber(r)
    for _, key in ipairs(pi_lists(pi, rank)) do -- (a compaction pass's front list first)
      for _, p in ipairs(redis.call('LRANGE', key, 0, stale_budget - stale)) do
        local eid, _, _, e = pi_entry(ii, lt, p, rank)
        if eid then
          return rank, tonumber(e.ts) or 0
        end
        stale = stale + 1
        if stale >= stale_budget then
          return rank, 0
        end
      end
    end
  end
  return -1, 0
end
local rank, ts = head()
local due_in = -1
local first = redis.call('ZRANGE', key_of('dz'), 0, 0, 'WITHSCORES')
if first[1] then
  due_in = us_until(tonumber(first[2]))
  if due_in == 0 then -- (its rank, kept within lo..hi: the pop promotes every due one anyway)
    local _, e = read_entry(ii, first[1])
    local r, t = hi, 0
    if e then
      r, t = math.min(math.max(split_score(e.s), lo), hi), tonumber(e.ts) or 0
    end
    if rank < 0 or r < rank or (r == rank and t < ts) then
      rank, ts = r, t
    end
  end
end
return { rank, ts, due_in }
