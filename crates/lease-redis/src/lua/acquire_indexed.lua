-- Grants leases from the indexes of the published view to a batch of requests, as one atomic
-- step: each in turn gets the head of its index (see index.lua) that does not cool down for
-- it, as if the requests had come one after another. A request's index is the installation's
-- (`free`: an empty selector) or that of the attribute values its selector names (`free:<name>`
-- for each `key=value`; with several, the smallest is read and its proxies must be in the
-- others too). A replica gathers the acquires that arrive while its earlier ones are on their
-- way into one call (gather.rs), so what a call costs Redis whatever it carries (the call, the
-- clock, the due expiries, adding to `all` and its TTL, the count) is paid once.
-- KEYS: prefix. ARGV: now (ms, or '' for Redis's clock), retention (ms), ended leases kept,
--       cap (proxies looked at per request, at most), then per request: ttl (ms), target (its
--       digest, '' for none), lease id, k, then k index names.
-- Leases past their expiry are first moved to the ended (at most 1 000 a run), so every
-- active count is exact when the choices are made. When more remain the answer is {-1} and
-- nothing is granted: the caller runs the batch again.
-- Else {all active leases, then an answer per request}. An answer is {3} when there is no
-- index (no view published), when the first `cap` proxies of the index all cool down for the
-- request (or, with several names, are not in the other indexes) while more remain, or when a
-- request of several names finds nothing: the caller then sends its candidates, which count
-- exactly. Else as acquire.lua: {0, considered, at capacity, in cooldown, unhealthy}, {2} or
-- {1, proxy, its active leases, expires (ms)}.

local p, now = KEYS[1], clock(ARGV[1])
local retention, max_ended, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

if expire_due(p, now, max_ended, retention, 1000) == 1000 then return {-1} end

-- The index to read of `names` (the smallest), and the others; nil when one is empty.
local function smallest(names)
  local best, best_size
  for i, name in ipairs(names) do
    local size = redis.call('ZCARD', index_key(p, name))
    if size == 0 then return nil end
    if not best_size or size < best_size then best, best_size = i, size end
  end
  local others = {}
  for i, name in ipairs(names) do
    if i ~= best then others[#others + 1] = index_key(p, name) end
  end
  return index_key(p, names[best]), others
end

-- Whether the proxy is in every one of the indexes `others`.
local function in_all(others, id)
  for _, key in ipairs(others) do
    if not redis.call('ZSCORE', key, id) then return false end
  end
  return true
end

-- Why nothing was granted from the index `name` (nil: the installation's), `looked` proxies
-- with room having cooled down for the request: the rest of those offered are unhealthy or full.
local function refused(name, looked)
  local o, u = 'offered', 'unhealthy'
  if name then o, u = 'o:' .. name, 'u:' .. name end
  local counts = redis.call('HMGET', p .. 'count', o, u)
  -- An index the view does not know (a proxy of it is newer than the publication): the
  -- candidates decide.
  if name and not counts[1] then return {3} end
  local considered, unhealthy = tonumber(counts[1] or '0'), tonumber(counts[2] or '0')
  return {0, considered, considered - unhealthy - looked, looked, unhealthy}
end

-- One request's answer.
local function choose(ttl, target, lease, names)
  local free, others = index_key(p), {}
  if #names > 0 then free, others = smallest(names) end
  -- The head alone first: it is the answer unless it cools down for the target, and each
  -- member read costs Redis a string made for Lua. Then eight at a time.
  local looked, step = 0, 1
  while free and looked < cap do
    local chunk = redis.call('ZRANGE', free, looked, math.min(looked + step, cap) - 1, 'WITHSCORES')
    step = 8
    if #chunk == 0 then break end
    for j = 1, #chunk, 2 do
      local id = chunk[j]
      if in_all(others, id) and not cooling(p, id, target, now) then
        return grant(p, id, math.floor(tonumber(chunk[j + 1]) / SHIFT), lease, now, ttl, target, retention)
      end
      looked = looked + 1
    end
  end
  -- No index at all (`count` is made by every publication, an index only with a proxy in it).
  if looked == 0 and redis.call('EXISTS', p .. 'count') == 0 then return {3} end
  if #names > 1 or (looked >= cap and redis.call('ZCARD', free) > looked) then return {3} end
  -- Every proxy with room cools down: the offered ones are unhealthy, full or cooling.
  return refused(names[1], looked)
end

local out, longest, granted = {0}, -1, {}
local b = 5
while b <= #ARGV do
  local ttl, target, lease, k = tonumber(ARGV[b]), ARGV[b + 1], ARGV[b + 2], tonumber(ARGV[b + 3])
  local names = {}
  for i = 1, k do names[i] = ARGV[b + 3 + i] end
  b = b + 4 + k
  local answer = choose(ttl, target, lease, names)
  if answer[1] == 1 then
    if ttl > longest then longest = ttl end
    granted[#granted + 1] = answer[4]
    granted[#granted + 1] = lease
  end
  out[#out + 1] = answer
end
-- No choice reads `all`, so the batch's grants join it in one call.
if longest >= 0 then
  call_in_runs('ZADD', {p .. 'all'}, granted)
  extend(p .. 'all', longest + GRACE)
end
-- Every lease left in `all` is unexpired: the due ones were all moved above.
out[1] = redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')
return out
