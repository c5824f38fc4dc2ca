-- purge: delete up to ARGV[1] waiting entries from the front of the queue, then delayed ones
-- (leased entries stay leased). Called repeatedly by the client until it returns {0, 0}.
--
-- KEYS[1] ii  hash    identifier-indexed table
-- KEYS[2] pi  zset    priority-indexed table
-- KEYS[3] wk  list    wake tokens
-- KEYS[4] dp  hash    task id -> duplicate entry ids
-- KEYS[5] dz  zset    delayed entries
-- KEYS[6..13] te ts tb fv fc fn tw fr: fairness state (see includes/fair.lua)
-- ARGV[1] count  members to take in this call
-- ARGV[2] fair   "1" when fairness is on
-- ARGV[3] scope  "P" within_priority or "T" tenant_first
-- Returns: {entries_deleted, members_taken}
--!include common.lua
--!include fair.lua

local ii, pi, wk, dp, dz = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
FK = { te = KEYS[6], ts = KEYS[7], tb = KEYS[8], fv = KEYS[9], fc = KEYS[10], fn = KEYS[11], tw = KEYS[12],
  fr = KEYS[13] }
local fair = ARGV[2] == '1'
FA = { scope = ARGV[3], conc = 0, rate = 0 }
local popped = redis.call('ZPOPMIN', pi, tonumber(ARGV[1]))
if #popped == 0 then
  popped = redis.call('ZPOPMIN', dz, tonumber(ARGV[1]))
end
local deleted = 0
local tenants = {}
for i = 1, #popped, 2 do
  local eid = popped[i]
  local v = redis.call('HGET', ii, eid)
  if v then
    redis.call('HDEL', ii, eid)
    local e = split_entry(v)
    if e.x == 'd' then
      dup_forget(dp, eid)
    end
    if fair and e.s ~= '' then
      local rank, seq = split_score(e.s)
      if redis.call('ZREM', FK.te, te_member(e.t, rank, seq, eid)) == 1 then
        if redis.call('HINCRBY', FK.fn, 'n:' .. e.t, -1) <= 0 then
          redis.call('HDEL', FK.fn, 'n:' .. e.t)
        end
      end
      tenants[e.t] = true
    end
    deleted = deleted + 1
  end
end
for t in pairs(tenants) do
  fair_refresh(t, false)
end
if redis.call('ZCARD', pi) == 0 then
  redis.call('DEL', wk)
end
return { deleted, #popped / 2 }
