-- The queue's counters (hash ct, derived from the stem): what the scripts count, added once per
-- script call (tally, flush_counts) or at once (counter_add).
--!include queue.lua

local function counter_add(name, n)
  redis.call('HINCRBY', key_of('ct'), name, n or 1)
end

-- Add n (default 1) to counter name, written once per script by flush_counts: a call that
-- delivers ten entries adds 10 with one command.
local function tally(name, n)
  CTX.cnt[name] = (CTX.cnt[name] or 0) + (n or 1)
end

local function flush_counts()
  for name, n in pairs(CTX.cnt) do
    if n ~= 0 then
      redis.call('HINCRBY', key_of('ct'), name, fmt(n))
    end
  end
  CTX.cnt = {}
end
