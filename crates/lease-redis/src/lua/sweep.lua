-- Moves expired leases from the index of all leases (and their proxy's active set) to the
-- ended, at most 10 000 a run (everything else ends by its key's TTL).
-- ARGV: prefix, now (ms, or '' for Redis's clock), ended leases kept, retention (ms).
-- Returns all active leases.

local p, now = ARGV[1], clock(ARGV[2])
local max_ended, retention = tonumber(ARGV[3]), tonumber(ARGV[4])
local expired = redis.call('ZRANGEBYSCORE', p .. 'all', '-inf', now, 'LIMIT', 0, 10000)
for _, lease in ipairs(expired) do
  redis.call('ZREM', p .. 'all', lease)
  local proxy = redis.call('HGET', p .. 'lease:' .. lease, 'proxy')
  if proxy then redis.call('ZREM', p .. 'active:' .. proxy, lease) end
end
ended(p, expired, max_ended, retention)
return redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')
