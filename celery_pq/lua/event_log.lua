-- event_log: switch a queue's event log on (its stream's approximate cap) or off, in its mode
-- record md. A caller whose context carries an event-log cap records it on its first call
-- anyway (see mode_error in includes/queue.lua); this script is how the log is turned off, or
-- its cap changed, on purpose. The stream ev itself is kept.
--
-- KEYS[1] ii  hash    identifier-indexed table (names the stem of md)
-- ARGV[0] context  the queue context (see includes/queue.lua): sent last, taken off ARGV first
-- ARGV[1] cap       the stream's approximate cap (MAXLEN ~), 0 to turn the log off
-- Returns: the cap in force before; the error reply MODE_MISMATCH (nothing done) when the
--          caller's mode is not the queue's.
-- ERR -8 MODE_MISMATCH
-- ERR -9 MIGRATING
--!include queue.lua
--!keys

take_context()
CTX.ev_mine = 0 -- the cap asked for below is the one recorded, not the context's
local bad = mode_error(false)
if bad then
  return bad
end
local before = CTX.ev
CTX.ev = tonumber(ARGV[1])
local record = redis.call('GET', key_of('md'))
write_mode(record and string.sub(record, 1, 4) or CTX.mode)
return before
