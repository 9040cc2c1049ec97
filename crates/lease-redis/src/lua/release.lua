-- Ends a lease now; unknown or ended ids are fine.
-- ARGV: prefix, now (ms, or '' for Redis's clock), lease id, ended leases kept, retention (ms).
-- Returns all active leases.

local p, now, lease = ARGV[1], clock(ARGV[2]), ARGV[3]
local max_ended, retention = tonumber(ARGV[4]), tonumber(ARGV[5])
local proxy = redis.call('HGET', p .. 'lease:' .. lease, 'proxy')
if proxy then redis.call('ZREM', p .. 'active:' .. proxy, lease) end
if redis.call('ZREM', p .. 'all', lease) == 1 then ended(p, {lease}, max_ended, retention) end
return redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')
