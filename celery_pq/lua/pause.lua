-- pause: pause or resume a queue, or one tenant of a fair queue. A paused queue delivers
-- nothing to any consumer (pop, pop_fair, priority views) while inserts go on; a paused tenant
-- is parked by pop_fair (state letter P) as a tenant at its concurrency cap is, its entries
-- left waiting. The queue's switch is a letter of its mode record md, which every script reads
-- already; a tenant's is the field "p:<tenant>" of the tenant settings fc, which pop_fair reads
-- with the tenant's other settings. A resume leaves wake tokens for the plain consumers and
-- every registered priority view, so idle consumers wake at once.
--
-- KEYS[1] ii  hash    identifier-indexed table (names the stem of md, vw and the view wake lists)
-- KEYS[2] wk  list    wake tokens of plain consumers
-- KEYS[3..10] te ts tb fv fc fn tw fr: fairness state (see includes/fair.lua), fair only
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] paused    "1" to pause, "0" to resume
-- ARGV[2] tenant    "" for the whole queue, else a tenant (escaped; fair queues only)
-- Returns: 1 when the state changed, 0 when it was so already; the error reply MODE_MISMATCH
--          (nothing done) when the caller's mode is not the queue's. Logs pause or resume.
-- ERR -8 MODE_MISMATCH
-- ERR -9 MIGRATING
--!include events.lua
--!include fair.lua
--!include queue.lua
--!include wake.lua
--!keys

--!queue
local pause, tenant = ARGV[1] == '1', ARGV[2]

-- Wake the plain consumers and those of every registered priority view.
local function wake_all()
  wake(wk)
  for _, name in ipairs(redis.call('HKEYS', key_of('vw'))) do
    wake(CTX.stem .. 'wk:' .. name)
  end
end

local changed
if tenant == '' then
  changed = CTX.paused ~= pause
  if changed then
    CTX.paused = pause
    write_mode(CTX.mode)
    if not pause then
      wake_all()
    end
  end
else
  local field = 'p:' .. tenant
  if pause then
    changed = redis.call('HSETNX', FK.fc, field, '1') == 1
    local old = redis.call('HGET', FK.tb, tenant)
    if old and string.sub(old, 1, 1) == 'A' then
      fair_park(tenant, string.sub(old, 2), 'P', 0)
    end
  else
    changed = redis.call('HDEL', FK.fc, field) == 1
    fair_resume(tenant, 'P')
    if changed then
      wake_all()
    end
  end
end
if not changed then
  return 0
end
emit(pause and 'pause' or 'resume', nil, nil, tenant)
return 1
