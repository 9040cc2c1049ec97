-- The active leases of each proxy, then of all.
-- ARGV: prefix, now (ms, or '' for Redis's clock), proxy ids... Returns {counts..., all}.

local p, now = ARGV[1], clock(ARGV[2])
local out = {}
for i = 3, #ARGV do
  out[#out + 1] = redis.call('ZCOUNT', p .. 'active:' .. ARGV[i], '(' .. now, '+inf')
end
out[#out + 1] = redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')
return out
