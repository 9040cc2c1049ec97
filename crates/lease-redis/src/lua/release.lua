-- Ends a lease now; unknown or ended ids are fine.
-- ARGV: prefix, now (ms, or '' for Redis's clock), lease id. Returns all active leases.

-- The caller's time in ms, or Redis's own when the caller sends ''.
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local p, now, lease = ARGV[1], clock(ARGV[2]), ARGV[3]
local proxy = redis.call('HGET', p .. 'lease:' .. lease, 'proxy')
if proxy then redis.call('ZREM', p .. 'active:' .. proxy, lease) end
redis.call('ZREM', p .. 'all', lease)
return redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')
