-- The stored records, read and written: entry "d,s,t,x,r,ts[,xp]|payload", lease, pointer,
-- dead-letter note, publish-id value (the mode record: queue.lua). They are laid out in
-- celery_pq/records.py, the Python twin of the readers and writers here (split_entry/
-- make_entry/join_entry, split_lease/join_lease, make_ptr/parse_ptr, dead_note);
-- tests/queue/test_records.py checks that the two agree.
--!include queue.lua

-- A pointer is the entry's seq in 6 bytes (big-endian) followed by its id.
local function make_ptr(seq, eid)
  return struct.pack('>I6', seq) .. eid
end

local function parse_ptr(p)
  if #p < 7 then
    return nil
  end
  return struct.unpack('>I6', p), string.sub(p, 7)
end

-- The parsed entry and the position of its "|", or nil when v is not an entry.
-- (One match over the value, up to its first "|", whose place is captured: no copy of the
-- header is made first.)
local function split_entry(v)
  local d, s, t, x, r, ts, xp, bar = string.match(v, '^(%d*),(%d+),([^,|]*),([^,|]*),([^,|]*),(%d*),?(%d*)()|')
  if not s then
    return nil
  end
  return { d = tonumber(d) or 0, s = s, t = t, x = x, r = r, ts = ts, xp = xp }, bar
end

-- Entry eid of ii: its value, parsed entry and bar (split_entry); nil when ii has no eid, the
-- value alone when it is malformed.
local function read_entry(ii, eid)
  local v = redis.call('HGET', ii, eid)
  if not v then
    return nil
  end
  return v, split_entry(v)
end

-- Is s (an entry's score field: digits, split_entry) the text of score n, as fmt writes it? Read
-- as a number rather than n printed (a sprintf costs more than twice the read); a score is a
-- whole number below 2^53, read exactly, so only a leading zero could make a second text of it.
local function same_score(s, n)
  return tonumber(s) == n and (string.byte(s, 1) ~= 48 or s == '0')
end

-- An entry: its header (deliveries, score, tenant, flags, dead-letter note, ts, and for an
-- entry with an expiry deadline ",<deadline ms>" after ts: pass ts .. "," .. xp as ts), then sep
-- and rest ("|" and the payload, or "" and what follows the header of a stored entry), made in
-- one concatenation.
local function make_entry(d, s, t, x, r, ts, sep, rest)
  return (d == 0 and '0' or fmt(d)) .. ',' .. s .. ',' .. t .. ',' .. x .. ',' .. r .. ',' .. ts .. sep .. rest
end

-- Entry e (as split_entry gives it) with the payload of v, whose "|" is at bar. Its expiry
-- deadline (e.xp, "" for none) is kept.
local function join_entry(e, v, bar)
  local ts = e.ts
  if e.xp and e.xp ~= '' then
    ts = ts .. ',' .. e.xp
  end
  return make_entry(e.d, e.s, e.t, e.x, e.r, ts, '', string.sub(v, bar))
end

-- Is entry e past its expiry deadline at now (ms)? An entry without one costs one comparison.
local function expired(e, now)
  return e.xp ~= '' and tonumber(e.xp) <= now
end

-- A dead-letter note: why, when (ms) and after how many deliveries.
local function dead_note(reason, ms, d)
  return reason .. '@' .. fmt(ms) .. '@' .. fmt(d)
end

-- token, consumer, score, deliveries, flags, tenant; all nil when info is not a lease record.
local function split_lease(info)
  local tok, c, s, d, x, t = string.match(info, '^([^,]*),([^,]*),(%d+),(%d*),([^,]*),([^,]*)$')
  if not tok then
    return nil
  end
  return tok, c, s, tonumber(d) or 0, x, t
end

local function join_lease(token, consumer, score, d, x, t)
  return token .. ',' .. consumer .. ',' .. score .. ',' .. fmt(d) .. ',' .. x .. ',' .. t
end

-- A list of entry ids as one string (each behind its length in 2 bytes), and back: what an
-- insert call's publish id stands for when the client made it for the whole call.
local function pack_ids(ids)
  local parts = {}
  for i, id in ipairs(ids) do
    parts[i] = struct.pack('>I2', #id) .. id
  end
  return table.concat(parts)
end

local function unpack_ids(s)
  local ids, pos = {}, 1
  while pos <= #s do
    local len, at = struct.unpack('>I2', s, pos)
    ids[#ids + 1] = string.sub(s, at, at + len - 1)
    pos = at + len
  end
  return ids
end
