-- Ends leases now, in order; unknown or ended ids are fine. A replica gathers the releases
-- that arrive while its earlier ones are on their way into one call (gather.rs), so the call,
-- the clock, the reads of the records and of `all`, the push to the ended and the count are
-- paid once.
-- KEYS: prefix. ARGV: now (ms, or '' for Redis's clock), ended leases kept, retention (ms),
-- then the lease ids (a batch: at most a few dozen). Returns all active leases.

local p, now = KEYS[1], clock(ARGV[1])
local max_ended, retention = tonumber(ARGV[2]), tonumber(ARGV[3])
local leases = {}
for i = 4, #ARGV do leases[#leases + 1] = ARGV[i] end
local gone, lives = {}, 0
if #leases > 0 then
  local scores = redis.call('ZMSCORE', p .. 'all', unpack(leases))
  local found = records(p, leases)
  local seen = {}
  for i, lease in ipairs(leases) do
    local proxy, _, expires = unpack(found[i])
    -- An id twice in one batch is ended by the first.
    local active = scores[i] and not seen[lease]
    seen[lease] = true
    local held = proxy and redis.call('ZREM', p .. 'active:' .. proxy, lease) == 1
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
  if #gone > 0 then redis.call('ZREM', p .. 'all', unpack(gone)) end
end
ended(p, gone, max_ended, lives, retention)
return redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')
