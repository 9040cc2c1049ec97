-- Ends a lease now; unknown or ended ids are fine.
-- KEYS: prefix. ARGV: now (ms, or '' for Redis's clock), lease id, ended leases kept,
-- retention (ms). Returns all active leases.

local p, now, lease = KEYS[1], clock(ARGV[1]), ARGV[2]
local max_ended, retention = tonumber(ARGV[3]), tonumber(ARGV[4])
local proxy, _, expires = record(p, lease)
local held = proxy and redis.call('ZREM', p .. 'active:' .. proxy, lease) == 1
local active = redis.call('ZREM', p .. 'all', lease) == 1
if held then
  rescore_released(p, proxy)
elseif active and proxy then
  -- Active, yet not in its proxy's set: the set went behind the scripts' back (its TTL, an
  -- eviction), so the proxy's place in the index is counted afresh.
  rescore(p, proxy)
end
if active then ended(p, {lease}, max_ended, (expires or now) + kept(retention) - now, retention) end
return redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')
