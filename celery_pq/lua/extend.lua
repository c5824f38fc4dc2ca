-- extend: renew leases (the consumer is alive), each checked against its token.
--
-- KEYS[1] lz  zset    lease deadlines
-- KEYS[2] lt  hash    leases
-- ARGV[1] lease_ms    new lease length from now, milliseconds
-- ARGV[2..] eid token...  the leases to renew, a pair each: entry id, lease token
-- Returns: one code per pair: 1 renewed, or an error code.
-- ERR -2 NOT_LEASED
-- ERR -3 TOKEN_MISMATCH
--!include queue.lua
--!include records.lua
--!keys

local deadline = fmt(now_ms() + tonumber(ARGV[1]))
local out = {}
for i = 2, #ARGV, 2 do
  local eid, token = ARGV[i], ARGV[i + 1]
  local info = redis.call('HGET', lt, eid)
  if not info then
    out[#out + 1] = NOT_LEASED
  elseif split_lease(info) ~= token then
    out[#out + 1] = TOKEN_MISMATCH
  else
    redis.call('ZADD', lz, 'XX', deadline, eid)
    out[#out + 1] = 1
  end
end
return out
