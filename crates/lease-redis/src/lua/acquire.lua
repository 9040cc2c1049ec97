-- Grants a lease on the best eligible candidate of a batch, as one atomic step.
-- ARGV: prefix, now (ms, or '' for Redis's clock), ttl (ms), target (its digest, '' for none),
--       lease id, retention (ms), n, final ('1': the last batch), ended leases kept, then n times:
--       id, healthy ('1'/'0'), latency (ms), max leases.
-- A candidate's expired leases leave its active set and the index of all leases as it is
-- considered, and count as ended.
-- The published view (HASH <prefix>view: id -> "healthy,latency,max,offered") wins over the
-- caller's values; a candidate it marks not offered (a pool's standby or draining member) is
-- skipped and not counted, as the caller leaves out the ones it knows. (An entry without the
-- fourth field, published by an older build, counts as offered.) Candidates come in the
-- caller's (latency, id) order; the first idle eligible one is the best there is and ends the
-- search. Without one, a batch that is not the last answers 3,
-- and the caller sends every candidate in one final run.
-- Returns {0, considered, at capacity, in cooldown, unhealthy} when nothing is eligible,
-- {2} when the lease id is taken, {3} to send every candidate, {1, proxy, its active leases,
-- expires (ms), all active}.

local p, now, ttl, target, lease = ARGV[1], clock(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local retention, n, final = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8] == '1'
local max_ended = tonumber(ARGV[9])

-- Byte order, as the in-memory store compares ids (Lua's < follows the server's locale).
local function before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local function extend(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

local considered, at_capacity, cooling, unhealthy = 0, 0, 0, 0
local best, best_active, best_latency
local idle = false
for i = 0, n - 1 do
  local b = 10 + i * 4
  local id, healthy, latency, max = ARGV[b], ARGV[b + 1] == '1', tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local published = redis.call('HGET', p .. 'view', id)
  local offered = true
  if published then
    local h, l, m, o = string.match(published, '^([01]),(%-?%d+),(%-?%d+),?([01]?)$')
    if h then healthy, latency, max, offered = h == '1', tonumber(l), tonumber(m), o ~= '0' end
  end
  if offered then considered = considered + 1 end
  if not offered then
    -- held back: no candidate
  elseif not healthy then
    unhealthy = unhealthy + 1
  else
    local active_key = p .. 'active:' .. id
    local expired = redis.call('ZRANGEBYSCORE', active_key, '-inf', now)
    if #expired > 0 then
      redis.call('ZREMRANGEBYSCORE', active_key, '-inf', now)
      for _, gone in ipairs(expired) do redis.call('ZREM', p .. 'all', gone) end
      ended(p, expired, max_ended, retention)
    end
    local active = redis.call('ZCARD', active_key)
    if active >= max then
      at_capacity = at_capacity + 1
    else
      local cool_key = p .. 'cool:' .. id
      local global_end = tonumber(redis.call('HGET', cool_key, '') or '0')
      local target_end = 0
      if target ~= '' then target_end = tonumber(redis.call('HGET', cool_key, target) or '0') end
      if global_end > now or target_end > now then
        cooling = cooling + 1
      else
        if best == nil or active < best_active
          or (active == best_active and (latency < best_latency or (latency == best_latency and before(id, best)))) then
          best, best_active, best_latency = id, active, latency
        end
        if active == 0 then idle = true; break end
      end
    end
  end
end
if not idle and not final then return {3} end
if best == nil then return {0, considered, at_capacity, cooling, unhealthy} end

local lease_key = p .. 'lease:' .. lease
if redis.call('EXISTS', lease_key) == 1 then return {2} end
local expires = now + ttl
redis.call('HSET', lease_key, 'proxy', best, 'target', target, 'expires', expires)
redis.call('PEXPIRE', lease_key, ttl + retention)
local active_key = p .. 'active:' .. best
redis.call('ZADD', active_key, expires, lease)
extend(active_key, ttl)
redis.call('ZADD', p .. 'all', expires, lease)
extend(p .. 'all', ttl)
return {1, best, best_active + 1, expires, redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')}
