-- Ends leases now, in order; unknown or ended ids are fine. A replica gathers the releases
-- that arrive while its earlier ones are on their way into one call (gather.rs), so the call,
-- the clock, the reads of the records and of `all`, the push to the ended and the count are
-- paid once.
-- KEYS: prefix. ARGV: now (ms, or '' for Redis's clock), ended leases kept, retention (ms),
-- then the lease ids (a batch: at most a few dozen). Returns all active leases.

local p, now = KEYS[1], clock(ARGV[1])
local leases = {}
for i = 4, #ARGV do leases[#leases + 1] = ARGV[i] end
release_leases(p, leases, now, tonumber(ARGV[2]), tonumber(ARGV[3]))
return redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')
