-- The event log (docs/events.md): when it is on (CTX.ev, the stream's approximate cap), the
-- script that makes a change appends one entry to the queue's stream ev, so the log is exact.
-- Fields, all strings, in this order: e q id p k t c task n r ms (empty when not applicable),
-- then h (ms the lease was held) on the ack, requeue and expire events of a fair_cost="time" queue.
--!include queue.lua

-- An entry id as text: a packed UUID unpacked, the "\2" escape taken off (celery_pq/ids.py).
local function text_id(eid)
  local b = string.byte(eid, 1)
  if b == 1 and #eid >= 17 then -- a packed UUID (celery_pq/ids.py): its 16 bytes as six numbers
    local u1, u2, u3, u4, u5, u6 = struct.unpack('>I4I2I2I2I2I4', eid, 2)
    return string.format('%08x-%04x-%04x-%04x-%04x%08x%s', u1, u2, u3, u4, u5, u6, string.sub(eid, 18))
  elseif b == 2 then
    return string.sub(eid, 2)
  end
  return eid
end

local function unescape(text)
  if not string.find(text, '%', 1, true) then
    return text
  end
  return (string.gsub(text, '%%(%x%x)', function(h)
    return string.char(tonumber(h, 16))
  end))
end

-- The queue's name, from the hash tag of the stem (keys.py escapes "%", "{" and "}" in it).
local function queue_name()
  if not CTX.qname then
    CTX.qname = unescape(string.match(CTX.stem, '{([^{}]*)}:[^{}]*$') or '')
    if CTX.is_dead then
      CTX.qname = CTX.qname .. '.dead'
    end
  end
  return CTX.qname
end

-- Log event e of entry eid (stored form; nil for a queue event) whose score is score (nil: no
-- priority), tenant t (escaped), consumer c, delivery count n, reason r, task name task, ms held h.
local function emit(e, eid, score, t, c, n, r, task, h)
  if CTX.ev == 0 then
    return
  end
  local p, k = '', ''
  if score then
    local rank = split_score(score)
    k = fmt(rank)
    p = string.sub(CTX.mode, 3, 3) == 'h' and fmt(255 - rank) or k
  end
  local id, tt, nn = eid and text_id(eid) or '', t and unescape(t) or '', n and fmt(n) or ''
  if h then
    CTX.now_s, CTX.ev_key = CTX.now_s or fmt(now_ms()), key_of('ev')
    queue_name()
    redis.call('XADD', CTX.ev_key, 'MAXLEN', '~', fmt(CTX.ev), '*', 'e', e, 'q', CTX.qname, 'id', id, 'p', p,
      'k', k, 't', tt, 'c', c or '', 'task', task or '', 'n', nn, 'r', r or '', 'ms', CTX.now_s, 'h', fmt(h))
    return
  end
  if CTX.now_s then
    redis.call('XADD', CTX.ev_key, '*', 'e', e, 'q', CTX.qname, 'id', id, 'p', p, 'k', k, 't', tt,
      'c', c or '', 'task', task or '', 'n', nn, 'r', r or '', 'ms', CTX.now_s)
    return
  end
  -- The first event of a script call: the time, the key and the name made once, and the stream
  -- trimmed to about its cap. Only this XADD trims (MAXLEN costs more than the rest of an XADD),
  -- so the stream holds at most one call's events more than MAXLEN ~ would keep.
  CTX.now_s, CTX.ev_key = fmt(now_ms()), key_of('ev')
  queue_name()
  redis.call('XADD', CTX.ev_key, 'MAXLEN', '~', fmt(CTX.ev), '*', 'e', e, 'q', CTX.qname, 'id', id, 'p', p,
    'k', k, 't', tt, 'c', c or '', 'task', task or '', 'n', nn, 'r', r or '', 'ms', CTX.now_s)
end
