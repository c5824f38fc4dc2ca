-- peek: the first entries in delivery order, without leasing them (read-only). Priority-index
-- members whose entry is gone (technique S) are skipped, not deleted.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table
-- ARGV[1] count        entries wanted
-- ARGV[2] stale_budget stale members to skip at most
-- Returns: {eid1, score1, value1, eid2, ...}
--!include common.lua

local ii, pi = KEYS[1], KEYS[2]
local want = tonumber(ARGV[1])
local stale_budget = tonumber(ARGV[2])
local out = {}
local got, stale, start = 0, 0, 0
while got < want do
  local batch = want - got
  local members = redis.call('ZRANGE', pi, start, start + batch - 1, 'WITHSCORES')
  for i = 1, #members, 2 do
    local v = redis.call('HGET', ii, members[i])
    if v then
      got = got + 1
      out[#out + 1] = members[i]
      out[#out + 1] = members[i + 1]
      out[#out + 1] = v
    else
      stale = stale + 1
    end
  end
  start = start + batch
  if #members < 2 * batch or stale >= stale_budget then
    break
  end
end
return out
