-- ack: the leased entries are Done and are deleted (BQF MarkAsDone, with clean-up at once).
-- Each lease token is checked, so a late ack from a consumer whose lease ran out cannot
-- delete the copy now delivered to another consumer.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] lz  zset    lease deadlines
-- KEYS[3] lt  hash    leases
-- KEYS[4] dp  hash    task id -> duplicate entry ids
-- ARGV[1..] pairs: entry id, lease token
-- Returns: one code per pair: 1 acked, or an error code.
-- ERR -2 NOT_LEASED
-- ERR -3 TOKEN_MISMATCH
--!include common.lua

local ii, lz, lt, dp = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local out = {}
for i = 1, #ARGV, 2 do
  local eid, token = ARGV[i], ARGV[i + 1]
  local info = redis.call('HGET', lt, eid)
  if not info then
    out[#out + 1] = -2
  else
    local tok, _, _, _, x = split_lease(info)
    if tok ~= token then
      out[#out + 1] = -3
    else
      redis.call('HDEL', ii, eid)
      redis.call('HDEL', lt, eid)
      redis.call('ZREM', lz, eid)
      if x == 'd' then
        dup_forget(dp, eid)
      end
      out[#out + 1] = 1
    end
  end
end
return out
