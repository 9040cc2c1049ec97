-- Ends a lease now; unknown or ended ids are fine.
-- KEYS: prefix. ARGV: now (ms, or '' for Redis's clock), lease id, ended leases kept,
-- retention (ms). Returns all active leases.

local p, now, lease = KEYS[1], clock(ARGV[1]), ARGV[2]
local max_ended, retention = tonumber(ARGV[3]), tonumber(ARGV[4])
local proxy, _, expires = record(p, lease)
if proxy and redis.call('ZREM', p .. 'active:' .. proxy, lease) == 1 then rescore_released(p, proxy) end
if redis.call('ZREM', p .. 'all', lease) == 1 then
  ended(p, {lease}, max_ended, (expires or now) + kept(retention) - now, retention)
end
return redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')
