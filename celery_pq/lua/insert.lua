-- insert: INSERT one or more entries, each into both tables or neither (patent INSERT;
-- BQF AddQueueItem). An id already present gets a fresh duplicate id "<id>~<seq>", so a
-- task republished with its own id (Celery retry) never overwrites the copy still leased.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table
-- KEYS[3] lt  hash    leases (only its size is read, for max_length)
-- KEYS[4] wk  list    wake tokens
-- KEYS[5] sq  string  insertion sequence
-- KEYS[6] dp  hash    task id -> duplicate entry ids
-- ARGV[1] technique   "T" (the entry keeps its score) or "S" (it does not)
-- ARGV[2] max_length  waiting entries allowed, 0 for no limit
-- ARGV[3..] groups of 4: id ("" for a generated one), rank (0..255, 0 served first),
--           tenant (escaped, may be ""), payload
-- Returns: the entry ids, one per group, in order;
--          or {ERR, waiting} when max_length would be exceeded (nothing is written).
-- ERR -5 QUEUE_FULL
--!include common.lua

local ii, pi, lt, wk, sq, dp = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local technique = ARGV[1]
local max_length = tonumber(ARGV[2])
local n = (#ARGV - 2) / 4

if max_length > 0 then
  local waiting = redis.call('HLEN', ii) - redis.call('HLEN', lt)
  if waiting + n > max_length then
    return { -5, waiting }
  end
end

local ts = fmt(now_ms())
local out = {}
for i = 0, n - 1 do
  local id, rank, tenant, payload = ARGV[3 + 4 * i], tonumber(ARGV[4 + 4 * i]), ARGV[5 + 4 * i], ARGV[6 + 4 * i]
  local seq = redis.call('INCR', sq)
  local score = fmt(rank * SEQ_SPAN + seq)
  local eid, flags = id, ''
  if eid == '' then
    eid = fmt(seq)
  end
  if redis.call('HEXISTS', ii, eid) == 1 then
    eid = eid .. '~' .. fmt(seq)
    flags = 'd'
    if id ~= '' then
      local list = redis.call('HGET', dp, id)
      redis.call('HSET', dp, id, list and (list .. DUP_SEP .. eid) or eid)
    end
  end
  local s = ''
  if technique == 'T' then
    s = score
  end
  redis.call('HSET', ii, eid, '0,' .. s .. ',' .. tenant .. ',' .. flags .. ',,' .. ts .. '|' .. payload)
  redis.call('ZADD', pi, score, eid)
  out[#out + 1] = eid
end
wake(wk)
return out
