-- ack: the leased entries are Done and are deleted (BQF MarkAsDone, with clean-up at once).
-- Each lease token is checked, so a late ack from a consumer whose lease expired cannot
-- delete the copy now delivered to another consumer. On a fair queue the tenant's lease
-- count drops, and a tenant parked at its concurrency cap is scheduled again; by fair_cost "time"
-- the tenant is charged the time the lease was held (includes/fair.lua). Counts acked;
-- logs ack.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] lz  zset    lease deadlines
-- KEYS[3] lt  hash    leases
-- KEYS[4] wk  list    wake tokens of plain consumers
-- KEYS[5..12] te ts tb fv fc fn tw fr: fairness state (see includes/fair.lua), fair only
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1..] eid token...  the leases to ack, a pair each: entry id, lease token
-- Returns: one code per pair: 1 acked, or an error code; the error reply MODE_MISMATCH
--          (nothing done) when the caller's mode is not the queue's.
-- ERR -2 NOT_LEASED
-- ERR -3 TOKEN_MISMATCH
-- ERR -8 MODE_MISMATCH
-- ERR -9 MIGRATING
--!include counters.lua
--!include fair.lua
--!include leases.lua
--!include queue.lua
--!include wake.lua
--!keys

--!queue
local out = {}
for i = 1, #ARGV, 2 do
  local code, t, s, ch = ack_one(ii, lz, lt, ARGV[i], ARGV[i + 1])
  if code == 1 and CTX.fair then
    fair_release(t)
    if ch then -- fair_cost "time": the time held is charged
      fair_settle(t, s, ch, false, now_ms())
    end
    wake(wk)
  end
  out[#out + 1] = code
end
flush_counts()
return out
