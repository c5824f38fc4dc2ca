-- peek: the first entries in delivery order, without leasing them (read-only). Stale pointers
-- are skipped, not deleted.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table: ranks with waiting entries (and their lists)
-- KEYS[3] lt  hash    leases
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] count        entries wanted
-- ARGV[2] stale_budget  stale pointers to skip at most
-- Returns: {eid1, score1, value1, eid2, ...}
--          The error reply MODE_MISMATCH (nothing done) when the caller's mode is not the queue's.
-- ERR -8 MODE_MISMATCH
-- ERR -9 MIGRATING
--!include index.lua
--!include queue.lua
--!keys

--!queue
local want = tonumber(ARGV[1])
local stale_budget = tonumber(ARGV[2])
local out = {}
local seen = {}
local got, stale = 0, 0
-- Up to want entries from list key of rank, from its front.
local function read_list(key, rank)
  local start = 0
  while got < want and stale < stale_budget do
    local batch = math.max(want - got, 10)
    local ptrs = redis.call('LRANGE', key, start, start + batch - 1)
    for _, p in ipairs(ptrs) do
      if got >= want then
        break
      end
      local eid, score, v = pi_entry(ii, lt, p, rank)
      if eid and not seen[eid] then
        seen[eid] = true
        got = got + 1
        out[#out + 1] = eid
        out[#out + 1] = score
        out[#out + 1] = v
      else
        stale = stale + 1
      end
    end
    start = start + batch
    if #ptrs < batch then
      break
    end
  end
end

for _, r in ipairs(redis.call('ZRANGE', pi, 0, -1)) do
  local rank = tonumber(r)
  for _, key in ipairs(pi_lists(pi, rank)) do -- (a compaction pass's front list first)
    read_list(key, rank)
  end
  if got >= want or stale >= stale_budget then
    break
  end
end
return out
