-- Grants leases from the installation's index to a batch of requests, as one atomic step: each
-- in turn gets the head of `free` (see index.lua) that does not cool down for it, as if the
-- requests had come one after another. A replica gathers the acquires that arrive while its
-- earlier ones are on their way into one call (gather.rs), so what a call costs Redis whatever
-- it carries (the call, the clock, the due expiries, adding to `all` and its TTL, the count) is
-- paid once.
-- KEYS: prefix. ARGV: now (ms, or '' for Redis's clock), retention (ms), ended leases kept,
--       cap (proxies looked at per request, at most), then per request: ttl (ms), target (its
--       digest, '' for none), lease id.
-- Leases past their expiry are first moved to the ended (at most 1 000 a run), so every
-- active count is exact when the choices are made. When more remain the answer is {-1} and
-- nothing is granted: the caller runs the batch again.
-- Else {all active leases, then an answer per request}. An answer is {3} when there is no
-- index (no view published) or the first `cap` proxies of `free` all cool down for the request
-- while more remain: the caller then sends its candidates. Else as acquire.lua: {0,
-- considered, at capacity, in cooldown, unhealthy}, {2} or {1, proxy, its active leases,
-- expires (ms)}.

local p, now = KEYS[1], clock(ARGV[1])
local retention, max_ended, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

if expire_due(p, now, max_ended, retention, 1000) == 1000 then return {-1} end

local free = p .. 'free'

-- One request's answer.
local function choose(ttl, target, lease)
  -- The head alone first: it is the answer unless it cools down for the target, and each
  -- member read costs Redis a string made for Lua. Then eight at a time.
  local looked, step = 0, 1
  while looked < cap do
    local chunk = redis.call('ZRANGE', free, looked, math.min(looked + step, cap) - 1, 'WITHSCORES')
    step = 8
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
end

local out, longest, granted = {0}, -1, {}
for b = 5, #ARGV, 3 do
  local ttl = tonumber(ARGV[b])
  local answer = choose(ttl, ARGV[b + 1], ARGV[b + 2])
  if answer[1] == 1 then
    if ttl > longest then longest = ttl end
    granted[#granted + 1] = answer[4]
    granted[#granted + 1] = ARGV[b + 2]
  end
  out[#out + 1] = answer
end
-- No choice reads `all`, so the batch's grants join it in one call.
if longest >= 0 then
  call_in_runs('ZADD', {p .. 'all'}, granted)
  extend(p .. 'all', longest + GRACE)
end
-- Every lease left in `all` is unexpired: the due ones were all moved above.
out[1] = redis.call('ZCARD', p .. 'all')
return out
