-- Ends leases now, in order; unknown or ended ids are fine. A replica gathers the releases
-- that arrive while its earlier ones are on their way into one call (gather.rs), so the call,
-- the clock, the push to the ended and the count are paid once.
-- KEYS: prefix. ARGV: now (ms, or '' for Redis's clock), ended leases kept, retention (ms),
-- then the lease ids. Returns all active leases.

local p, now = KEYS[1], clock(ARGV[1])
local max_ended, retention = tonumber(ARGV[2]), tonumber(ARGV[3])
local gone, lives = {}, 0
for i = 4, #ARGV do
  local lease = ARGV[i]
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
  if active then
    gone[#gone + 1] = lease
    lives = math.max(lives, (expires or now) + kept(retention) - now)
  end
end
ended(p, gone, max_ended, lives, retention)
return redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')
