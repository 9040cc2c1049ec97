-- Forgets ended leases from the index of all leases (everything else ends by its key's TTL).
-- ARGV: prefix, now (ms, or '' for Redis's clock). Returns all active leases.

local p, now = ARGV[1], clock(ARGV[2])
redis.call('ZREMRANGEBYSCORE', p .. 'all', '-inf', now)
return redis.call('ZCARD', p .. 'all')
