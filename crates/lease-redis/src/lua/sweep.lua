-- Moves expired leases from the index of all leases (and their proxy's active set) to the
-- ended, at most 10 000 a run (everything else ends by its key's TTL).
-- KEYS: prefix. ARGV: now (ms, or '' for Redis's clock), ended leases kept, retention (ms).
-- Returns all active leases.

local p, now = KEYS[1], clock(ARGV[1])
expire_due(p, now, tonumber(ARGV[2]), tonumber(ARGV[3]), 10000)
return redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')
