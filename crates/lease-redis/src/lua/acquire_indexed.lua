-- Grants a lease on the best eligible proxy of the installation's index, as one atomic step:
-- the head of `free` (see index.lua) that is not cooling down for the request.
-- KEYS: prefix. ARGV: now (ms, or '' for Redis's clock), ttl (ms), target (its digest, '' for
--       none), lease id, retention (ms), ended leases kept, cap (proxies looked at, at most).
-- Leases past their expiry are first moved to the ended (at most 1 000 a run), so every
-- active count is exact when the choice is made.
-- Returns {3} when there is no index (no view published) or the first `cap` proxies of `free`
-- all cool down for the request while more remain: the caller then sends its candidates.
-- {4} when more expired leases remain to be moved: the caller runs the script again.
-- Else as acquire.lua: {0, considered, at capacity, in cooldown, unhealthy}, {2} or {1, ...}.

local p, now, ttl, target, lease = KEYS[1], clock(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local retention, max_ended, cap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])

if expire_due(p, now, max_ended, retention, 1000) == 1000 then return {4} end

local free = p .. 'free'
local looked = 0
while looked < cap do
  local chunk = redis.call('ZRANGE', free, looked, math.min(looked + 7, cap - 1), 'WITHSCORES')
  if #chunk == 0 then
    -- No index at all (`count` is made by every publication, `free` only with a proxy in it).
    if looked == 0 and redis.call('EXISTS', p .. 'count') == 0 then return {3} end
    break
  end
  for j = 1, #chunk, 2 do
    local id = chunk[j]
    if not cooling(p, id, target, now) then
      return grant(p, id, math.floor(tonumber(chunk[j + 1]) / SHIFT), lease, now, ttl, target, retention)
    end
    looked = looked + 1
  end
end
if looked >= cap and redis.call('ZCARD', free) > looked then return {3} end
-- Every proxy with room cools down: the offered ones are unhealthy, full or cooling.
local counts = redis.call('HMGET', p .. 'count', 'offered', 'unhealthy')
local considered, unhealthy = tonumber(counts[1] or '0'), tonumber(counts[2] or '0')
return {0, considered, considered - unhealthy - looked, looked, unhealthy}
