-- Wake tokens: one token left in a wake list wakes one blocked consumer (docs/key-layout.md).
--!include queue.lua

-- Leave one wake token for a blocked consumer (at most one waits in the list).
local function wake(wk)
  if redis.call('LLEN', wk) == 0 then
    redis.call('RPUSH', wk, '1')
  end
end

-- The end of a pop: a wake token when entries are left for the next consumer, else none.
local function wake_if(wk, left)
  if left then
    wake(wk)
  else
    redis.call('DEL', wk)
  end
end

-- Wake the consumers of every registered priority view whose range holds rank. The registry
-- (hash vw, "lo-hi" -> 1) is read here, so views registered by any process are woken; each
-- view's wake list is "<wk>:lo-hi" under the queue's stem.
local function wake_registered_views(rank)
  for _, name in ipairs(redis.call('HKEYS', key_of('vw'))) do
    local lo, hi = string.match(name, '^(%d+)-(%d+)$')
    if lo and rank >= tonumber(lo) and rank <= tonumber(hi) then
      wake(CTX.stem .. 'wk:' .. name)
    end
  end
end
