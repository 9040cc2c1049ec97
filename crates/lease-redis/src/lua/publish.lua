-- Publishes the view: the whole of it, replacing the last one, or only what changed since the
-- caller's own last publication.
-- KEYS: prefix. ARGV: lifetime (ms), 'full' or 'changes', the token of the caller's last
--       publication, this one's token, n, then n ids to remove, then pairs: id,
--       "healthy,latency,max,offered" to set.
-- Changes apply only over the publication they were computed from: when another replica has
-- published since, or the view expired, nothing is done and 0 is returned (the caller then
-- publishes the whole view). Returns 1 when published.
-- Keeps `count` (offered, unhealthy) and `free` (index.lua) in step with the view, so the
-- work is one step per proxy changed.

local p, lifetime, mode, last, token = KEYS[1], tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]
local n = tonumber(ARGV[5])
local view, count = p .. 'view', p .. 'count'

if mode == 'full' then
  redis.call('DEL', view, count, p .. 'free')
  redis.call('HSET', count, 'offered', 0, 'unhealthy', 0)
elseif redis.call('HGET', count, 'token') ~= last then
  return 0
end

-- Adds `sign` times the proxy's entry to the counts.
local function counted(id, sign)
  local healthy, _, _, offered = view_entry(p, id)
  if offered then
    redis.call('HINCRBY', count, 'offered', sign)
    if not healthy then redis.call('HINCRBY', count, 'unhealthy', sign) end
  end
end

for i = 6, 5 + n do
  counted(ARGV[i], -1)
  redis.call('HDEL', view, ARGV[i])
  redis.call('ZREM', p .. 'free', ARGV[i])
end
redis.call('HSET', count, 'token', token)
redis.call('PEXPIRE', count, lifetime)
for i = 6 + n, #ARGV, 2 do
  counted(ARGV[i], -1)
  redis.call('HSET', view, ARGV[i], ARGV[i + 1])
  counted(ARGV[i], 1)
end
if redis.call('EXISTS', view) == 1 then redis.call('PEXPIRE', view, lifetime) end
if redis.call('EXISTS', p .. 'free') == 1 then redis.call('PEXPIRE', p .. 'free', lifetime) end
-- After the view's lifetime is set: `rescore` gives the index the view's.
for i = 6 + n, #ARGV, 2 do rescore(p, ARGV[i]) end
return 1
