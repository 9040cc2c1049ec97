-- Ends a lease now; unknown or ended ids are fine.
-- ARGV: prefix, now (ms, or '' for Redis's clock), lease id. Returns all active leases.

local p, now, lease = ARGV[1], clock(ARGV[2]), ARGV[3]
local proxy = redis.call('HGET', p .. 'lease:' .. lease, 'proxy')
if proxy then redis.call('ZREM', p .. 'active:' .. proxy, lease) end
redis.call('ZREM', p .. 'all', lease)
return redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')
