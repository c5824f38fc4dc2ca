-- cleanup: one bounded step of the clean-up sweep of lazy deletion (deferred REMOVE BY ID):
-- up to ARGV[2] pointers of one rank are looked at, from where the rank's compaction pass
-- stopped (see includes/index.lua: the current pointers move to the rank's front list, the
-- stale ones are dropped; when the rank's list runs empty the pass is over). Calls repeated
-- until more is 0 look at each pointer of the rank once.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table: ranks with waiting entries (and their lists)
-- KEYS[3] lt  hash    leases
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] rank   0..255
-- ARGV[2] count  pointers to look at, at most
-- Returns: {removed, looked_at, more (1 while the rank's pass has pointers left to look at:
--          the next call goes on from there; 0 when the pass is over)}
--          The error reply MODE_MISMATCH (nothing done) when the caller's mode is not the queue's.
-- ERR -8 MODE_MISMATCH
-- ERR -9 MIGRATING
--!include index.lua
--!include queue.lua
--!keys

--!queue
local rank, count = tonumber(ARGV[1]), tonumber(ARGV[2])
local gone, looked, over = pi_compact_step(pi, rank, count)
return { gone, looked, over and 0 or 1 }
