-- The active leases of each proxy, then of all.
-- KEYS: prefix. ARGV: now (ms, or '' for Redis's clock), proxy ids... Returns {counts..., all}.

local p, now = KEYS[1], clock(ARGV[1])
local out = {}
for i = 2, #ARGV do
  out[#out + 1] = redis.call('ZCOUNT', p .. 'active:' .. ARGV[i], '(' .. now, '+inf')
end
out[#out + 1] = redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')
return out
