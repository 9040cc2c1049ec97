-- The active leases of each proxy, then of all.
-- ARGV: prefix, now (ms, or '' for Redis's clock), proxy ids... Returns {counts..., all}.

-- The caller's time in ms, or Redis's own when the caller sends ''.
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local p, now = ARGV[1], clock(ARGV[2])
local out = {}
for i = 3, #ARGV do
  out[#out + 1] = redis.call('ZCOUNT', p .. 'active:' .. ARGV[i], '(' .. now, '+inf')
end
out[#out + 1] = redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')
return out
