-- pop: RETRIEVE HIGHEST PRIORITY and lease it (BQF GetNextWaiting: Waiting -> InProcess).
-- Takes up to ARGV[4] entries in priority order, FIFO within a priority. A stale pointer of
-- the priority index (its entry removed by id, or moved to another priority) is discarded
-- here: the patent's lazy deletion. An entry past its expiry deadline is never delivered: it
-- is dead-lettered with reason "expired", or dropped (the queue context's expired policy), at
-- most EXPIRE_BUDGET of them per call (includes/dead.lua), and the call goes on. The lease is
-- recorded in this same script, so a popped entry never exists only in a consumer's memory.
-- The first leases of a queue no sweep has run on start its sweep record sw
-- (includes/leases.lua, write_leases); a pop that acked a lease first knows it is there.
-- Delayed entries that are due (key dz) join the back of their priority first, as the sweep
-- does, at most POP_PROMOTE a call (includes/delays.lua): a delayed entry is deliverable when
-- it is due, not at the next sweep; the reply says when the next one is due.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table: ranks with waiting entries (and their lists)
-- KEYS[3] lz  zset    lease deadlines (ms)
-- KEYS[4] lt  hash    leases
-- KEYS[5] wk  list    wake tokens of this consumer (its priority view's, or the plain one)
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] lease_ms     lease length, milliseconds
-- ARGV[2] consumer     consumer id (no ","), for recovery by consumer
-- ARGV[3] token_base   random string; lease tokens are token_base .. "." .. n
-- ARGV[4] count        entries wanted (>= 1)
-- ARGV[5] stale_budget  stale pointers to discard at most before returning
-- ARGV[6] lo           best rank of a priority view (0: the whole queue)
-- ARGV[7] hi           worst rank of a priority view (255: the whole queue)
-- ARGV[8] take_hi      worst rank this call takes (hi, or less: a consumer of a sharded queue
--                      takes from this shard only what beats the next shard it peeked; the
--                      wake-up below still looks at lo..hi)
-- ARGV[9] nacks        leases to ack first (the consumer's last deliveries: one call for both)
-- ARGV[10..9+2*nacks] eid token...  those leases, a pair each: entry id, lease token
-- Returns: {stale_discarded, nacks, due_in, ack codes (as ack.lua), eid1, token1, deliveries1,
--           score1, value1, eid2, ...}, due_in the µs until the queue's next delayed entry is
--           due (0: more are due now, -1: none is delayed, or the queue is paused); the error reply MODE_MISMATCH (nothing done) when the caller's
--           mode is not the queue's. A malformed entry it meets goes to the dead-letter queue.
-- A paused queue delivers nothing (the acks are still applied) and its wake list goes, so its
-- consumers block until the resume wakes them. Counts acked, delivered, redelivered, expired
-- (and dead_lettered); logs ack, deliver, dead or remove (reason "expired").
-- ERR -2 NOT_LEASED
-- ERR -3 TOKEN_MISMATCH
-- ERR -8 MODE_MISMATCH
-- ERR -9 MIGRATING
--!include counters.lua
--!include dead.lua
--!include delays.lua
--!include index.lua
--!include leases.lua
--!include queue.lua
--!include wake.lua
--!keys

--!queue
local lease_ms = tonumber(ARGV[1])
local consumer, token_base = ARGV[2], ARGV[3]
local want = tonumber(ARGV[4])
local stale_budget = tonumber(ARGV[5])
local lo, hi = tonumber(ARGV[6]), tonumber(ARGV[7])
local take_hi = math.min(tonumber(ARGV[8]), hi)
local nacks = tonumber(ARGV[9])

local out = { 0, nacks, -1 }
-- (acked: a lease of this queue was acked here, so its sweep record exists: write_leases)
local acked = ack_pairs(out, ii, lz, lt, 10, nacks)
if CTX.paused then
  redis.call('DEL', wk)
  flush_counts()
  return out
end
local got, stale, more, expiring = 0, 0, false, 0
-- Redis time (ms): read once, when first needed (an empty pop of a queue with nothing delayed
-- never reads it)
local due_in, now, promoted = promote_at_pop(ii, pi, key_of('dz'), nil, nil)
out[3] = due_in
if promoted > 0 and wk ~= key_of('wk') then -- (a view's consumer: the plain ones may want them)
  wake(key_of('wk'))
end
local P = { lease = {}, deadline = {}, out = out, swept_known = acked }
while got < want do
  local asked = want - got
  local popped
  popped, more = pi_take(pi, lo, take_hi, asked)
  for i = 1, #popped, 2 do
    -- (the lease check comes last: with the lease's write for an entry to deliver, claim_lease)
    local eid, score, v, e, bar = pi_entry_of(ii, popped[i], popped[i + 1])
    if eid ~= nil and not now then
      now = now_ms()
    end
    if eid == false then -- malformed (score: its id): set aside unless leased
      if redis.call('HEXISTS', lt, score) == 0 then
        set_aside(ii, score, v, popped[i + 1], now)
      end
      stale = stale + 1
    elseif eid and expired(e, now) then
      if redis.call('HEXISTS', lt, eid) == 0 then
        expire(ii, eid, v, e, bar, score, now)
        expiring = expiring + 1
      else
        stale = stale + 1
      end
    elseif eid then
      if not P.until_ms then
        P.now = now
        P.until_ms = fmt(now + lease_ms)
      end
      if claim_lease(P, lt, eid, token_base .. '.' .. fmt(got + 1), consumer, score, e.d + 1, e.x, e.t, v) then
        got = got + 1
      else
        stale = stale + 1
      end
    else
      stale = stale + 1
    end
  end
  if #popped < 2 * asked or stale >= stale_budget or expiring >= EXPIRE_BUDGET then
    break
  end
end
out[1] = stale
write_leases(P, lt, lz)
wake_if(wk, more or pi_any(pi, lo, hi))
flush_counts()
return out
