-- Publishes one chunk of the view. The caller sends a publication in chunks of at most
-- PUBLISH_CHUNK proxies (lib.rs), so that no run holds Redis for long however large the fleet.
-- KEYS: prefix. ARGV: lifetime (ms), mode, guard token, this publication's token, whole ('1':
--       part of a whole publication), n, then n ids to remove, then pairs: id,
--       "healthy,latency,max,offered" and "\0key=value" for each index it is in, to set.
-- Modes:
--   'changes'  the first chunk of what changed since the caller's last publication: applies
--              only while that publication (the guard) is the last in Redis, so not when
--              another replica published since or the view expired;
--   'take'     the first chunk of a whole publication: applies over whatever is there;
--   'more'     each later chunk: applies only while this publication (the guard) is the last.
-- Returns the number of proxies in the view when applied, -1 when not (the caller then
-- publishes its whole view).
-- Every chunk leaves the view, `count` (offered, unhealthy) and the indexes (index.lua) in step, so
-- an acquire between two chunks finds each proxy as one of the two publications has it. In a
-- change, an entry that is already as sent costs one read; a whole publication places every
-- proxy it sends in `free` afresh from its active set, so whatever went behind the scripts'
-- back (an active set's TTL, an eviction) is mended at least at every leader's first one.

local p, lifetime, mode, guard, token = KEYS[1], tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]
local whole, n = ARGV[5] == '1', tonumber(ARGV[6])
local view, count, indexes = p .. 'view', p .. 'count', p .. 'indexes'

if mode == 'take' then
  -- Counts without the view they count (it expired, or was never made): start from nothing.
  if redis.call('EXISTS', count, view) < 2 then
    for _, name in ipairs(redis.call('SMEMBERS', indexes)) do redis.call('DEL', index_key(p, name)) end
    redis.call('DEL', view, count, indexes, index_key(p))
    redis.call('HSET', count, 'offered', 0, 'unhealthy', 0)
  end
elseif redis.call('HGET', count, 'token') ~= guard then
  return -1
end

-- Adds `sign` times the proxy's entry to the counts, the installation's and its indexes'; an
-- index no offered proxy is in any more is forgotten.
local function counted(id, sign)
  local healthy, _, _, offered, names = view_entry(p, id)
  if not offered then return end
  redis.call('HINCRBY', count, 'offered', sign)
  if not healthy then redis.call('HINCRBY', count, 'unhealthy', sign) end
  for _, name in ipairs(names) do
    if redis.call('HINCRBY', count, 'o:' .. name, sign) > 0 then
      redis.call('SADD', indexes, name)
      if not healthy then redis.call('HINCRBY', count, 'u:' .. name, sign) end
    else
      redis.call('HDEL', count, 'o:' .. name, 'u:' .. name)
      redis.call('SREM', indexes, name)
    end
  end
end

-- Takes the proxy out of the indexes its entry names (before the entry changes or goes).
local function unplace(id)
  local _, _, _, _, names = view_entry(p, id)
  for _, name in ipairs(names or {}) do redis.call('ZREM', index_key(p, name), id) end
  redis.call('ZREM', index_key(p), id)
end

for i = 7, 6 + n do
  counted(ARGV[i], -1)
  unplace(ARGV[i])
  redis.call('HDEL', view, ARGV[i])
end
redis.call('HSET', count, 'token', token)
redis.call('PEXPIRE', count, lifetime)
local placed = {}
for i = 7 + n, #ARGV, 2 do
  local changed = redis.call('HGET', view, ARGV[i]) ~= ARGV[i + 1]
  if changed then
    counted(ARGV[i], -1)
    unplace(ARGV[i])
    redis.call('HSET', view, ARGV[i], ARGV[i + 1])
    counted(ARGV[i], 1)
  end
  if changed or whole then placed[#placed + 1] = ARGV[i] end
end
if redis.call('EXISTS', view) == 1 then redis.call('PEXPIRE', view, lifetime) end
-- The first chunk of each publication keeps every index alive as long as the view: their
-- number is bounded by the publisher (PUBLISH_INDEXES).
if mode ~= 'more' then
  for _, name in ipairs(redis.call('SMEMBERS', indexes)) do
    if redis.call('EXISTS', index_key(p, name)) == 1 then redis.call('PEXPIRE', index_key(p, name), lifetime) end
  end
  if redis.call('EXISTS', indexes) == 1 then redis.call('PEXPIRE', indexes, lifetime) end
end
if redis.call('EXISTS', index_key(p)) == 1 then redis.call('PEXPIRE', index_key(p), lifetime) end
-- After the view's lifetime is set: `rescore` gives the index the view's.
for _, id in ipairs(placed) do rescore(p, id) end
return redis.call('HLEN', view)
