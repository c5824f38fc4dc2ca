-- replay: dead letters back to the live queue, each atomically: the entry leaves <queue>.dead
-- and joins the back of its priority in <queue>, with its tenant, payload and priority kept,
-- its delivery count reset to 0 and its dead-letter note cleared. It gets the id it had before
-- it was dead-lettered (a "~<seq>" the dead-letter queue added is dropped), or a duplicate id
-- "<id>~<seq>" when the live queue holds that id again, as an insert would. Its enqueue time
-- is now (it waits from now on; the note with the old times goes). A leased dead letter (a
-- consumer of <queue>.dead holds it) or an id not in the dead-letter queue is left alone.
-- Each replayed entry counts as enqueued and is logged as an ordinary "enqueue" event (reason
-- "replay"): to every reader it is a new publish of the same message. A dead letter that held a
-- unique key (includes/unique.lua; it kept the key in <queue>.dead's ue) holds it again; when
-- another entry holds that key by now, the dead letter is merged into it instead, as a publish
-- of the key would be: it leaves the dead-letter queue, nothing is stored, the reply is the id
-- of the entry holding the key (counted unique_merged, logged merged with the key as its r).
--
-- KEYS[1]  ii   hash    identifier-indexed table
-- KEYS[2]  pi   zset    priority-indexed table: ranks with waiting entries (and their lists)
-- KEYS[3]  lt   hash    leases (only its size is read, for max_length)
-- KEYS[4]  wk   list    wake tokens of plain consumers
-- KEYS[5]  sq   string  insertion sequence
-- KEYS[6]  dii  hash    dead-letter queue: identifier-indexed table
-- KEYS[7]  dpi  zset    dead-letter queue: priority-indexed table
-- KEYS[8..15] te ts tb fv fc fn tw fr: fairness state (see includes/fair.lua), fair only
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] max_length  entries waiting allowed in the live queue, 0 for no limit
-- ARGV[2..] id...  stored ids of dead letters to replay
-- Returns: one reply per id, in order: the entry id it got in the live queue (or, merged, the
--          id of the entry holding its unique key), or NOT_FOUND (no
--          such dead letter), NOT_WAITING (it is leased), QUEUE_FULL (max_length reached:
--          this and every later id are left in the dead-letter queue). A dead letter that
--          cannot be parsed stays where it is (NOT_FOUND). The error reply MODE_MISMATCH
--          (nothing done) when the caller's mode is not the live queue's.
-- ERR -1 NOT_FOUND
-- ERR -4 NOT_WAITING
-- ERR -5 QUEUE_FULL
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
--!include wake.lua
--!keys

--!queue
local max_length = tonumber(ARGV[1])
local fair = CTX.fair
local dlt = string.sub(dii, 1, -3) .. 'lt'
local dead_ue = string.sub(dii, 1, -3) .. 'ue' -- (the keys dead letters kept: includes/unique.lua)

local now_n = now_ms()
local now = fmt(now_n)
local out = {}
local full = false
local woken = false
for i = 2, #ARGV do
  local deid = ARGV[i]
  local v = redis.call('HGET', dii, deid)
  local e, bar
  if v then
    e, bar = split_entry(v)
  end
  local key, held = false, nil
  if e and holds_key(e.x) then
    key = redis.call('HGET', dead_ue, deid)
    held = key and unique_held_by(ii, key)
  end
  if full then
    out[#out + 1] = QUEUE_FULL
  elseif not e then
    out[#out + 1] = NOT_FOUND
  elseif redis.call('HEXISTS', dlt, deid) == 1 then
    out[#out + 1] = NOT_WAITING
  elseif held then -- its key is held again: merged into the entry that holds it
    redis.call('HDEL', dii, deid)
    redis.call('HDEL', dead_ue, deid)
    local rank, dseq = split_score(e.s)
    pi_drop_near(dpi, rank, make_ptr(dseq, deid), 64)
    tally('unique_merged')
    emit('merged', held, nil, nil, nil, nil, key)
    out[#out + 1] = held
  elseif max_length > 0 and redis.call('HLEN', ii) - redis.call('HLEN', lt) >= max_length then
    full = true
    out[#out + 1] = QUEUE_FULL
  else
    local rank, dseq = split_score(e.s)
    redis.call('HDEL', dii, deid)
    pi_drop_near(dpi, rank, make_ptr(dseq, deid), 64) -- (further back: dropped lazily)
    local base = string.match(deid, '^(.+)~%d+$') or deid
    local seq = redis.call('INCR', sq)
    local eid, dup = free_id(ii, base, sq, seq)
    e.x = ''
    if dup then
      e.x = 'd'
      dup_add(base, dup)
      seq = dup
    end
    if key then
      e.x = e.x .. 'u'
      redis.call('HDEL', dead_ue, deid)
    end
    e.d, e.r, e.ts = 0, '', now
    e.s = fmt(rank * SEQ_SPAN + seq)
    redis.call('HSET', ii, eid, join_entry(e, v, bar))
    pi_push(pi, rank, seq, eid)
    if key then
      unique_hold(key, 'w', 0, eid, now_n, 0)
    end
    if fair then
      fair_add(e.t, e.s, eid)
    end
    wake_registered_views(rank)
    woken = true
    tally('enqueued')
    emit('enqueue', eid, e.s, e.t, nil, nil, 'replay')
    out[#out + 1] = eid
  end
end
if woken then
  wake(wk)
end
flush_counts()
return out
