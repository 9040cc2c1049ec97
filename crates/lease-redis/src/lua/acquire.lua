-- Grants a lease on the best eligible candidate of a batch the caller sends, as one atomic
-- step (the candidates of a selector no index serves).
-- KEYS: prefix. ARGV: now (ms, or '' for Redis's clock), ttl (ms), target (its digest, '' for
--       none), lease id, retention (ms), n, final ('1': the last batch), ended leases kept,
--       session key (client/name, '' for none), the client's cap of sessions, then n times:
--       id, healthy ('1'/'0'), latency (ms), max leases.
-- In a session (after session.lua found it without a live lease): {4} when the session has
-- a lease again (another replica's), {5, sessions} when the client holds its cap of them;
-- else the grant becomes the session's lease, and its answer carries the client's sessions
-- last.
-- A candidate's expired leases leave its active set and the index of all leases as it is
-- considered, and count as ended.
-- The published view wins over the caller's values; a candidate it marks not offered (a
-- pool's standby or draining member) is skipped and not counted, as the caller leaves out the
-- ones it knows. Candidates come in the caller's (latency, id) order; the first idle eligible
-- one is the best there is and ends the search. Without one, a batch that is not the last
-- answers 3, and the caller sends every candidate in one final run.
-- Returns {0, considered, at capacity, in cooldown, unhealthy} when nothing is eligible,
-- {2} when the lease id is taken, {3} to send every candidate, {1, proxy, its active leases,
-- expires (ms), all active}.

local p, now, ttl, target, lease = KEYS[1], clock(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local retention, n, final = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1'
local max_ended, session, cap = tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10])
local client = session ~= '' and session_parts(session)

if client then
  if redis.call('EXISTS', p .. 'session:' .. session) == 1 then return {4} end
  local held = sessions_held(p, client, now)
  if held >= cap then return {5, held} end
end

-- Byte order, as the in-memory store compares ids (Lua's < follows the server's locale).
local function before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local considered, at_capacity, cooling_n, unhealthy = 0, 0, 0, 0
local best, best_active, best_latency
local idle = false
for i = 0, n - 1 do
  local b = 11 + i * 4
  local id, healthy, latency, max = ARGV[b], ARGV[b + 1] == '1', tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local offered = true
  local h, l, m, o = view_entry(p, id)
  if h ~= nil then healthy, latency, max, offered = h, l, m, o end
  if offered then considered = considered + 1 end
  if not offered then
    -- held back: no candidate
  elseif not healthy then
    unhealthy = unhealthy + 1
  else
    local active_key = p .. 'active:' .. id
    local due = redis.call('ZRANGEBYSCORE', active_key, '-inf', now, 'WITHSCORES')
    if #due > 0 then
      redis.call('ZREMRANGEBYSCORE', active_key, '-inf', now)
      local expired = {}
      for j = 1, #due, 2 do
        expired[#expired + 1] = due[j]
        redis.call('ZREM', p .. 'all', due[j])
      end
      -- In expiry order: the last one's record lives longest.
      ended(p, expired, max_ended, tonumber(due[#due]) + kept(retention) - now, retention)
      rescore(p, id)
    end
    local active = redis.call('ZCARD', active_key)
    if active >= max then
      at_capacity = at_capacity + 1
    elseif cooling(p, id, target, now) then
      cooling_n = cooling_n + 1
    else
      if best == nil or active < best_active
        or (active == best_active and (latency < best_latency or (latency == best_latency and before(id, best)))) then
        best, best_active, best_latency = id, active, latency
      end
      if active == 0 then idle = true; break end
    end
  end
end
if not idle and not final then return {3} end
if best == nil then return {0, considered, at_capacity, cooling_n, unhealthy} end
local answer = grant(p, best, best_active, lease, now, ttl, target, retention)
if answer[1] == 1 then
  redis.call('ZADD', p .. 'all', answer[4], lease)
  extend(p .. 'all', ttl + GRACE)
  answer[5] = redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')
  if client then
    bind_session(p, session, lease, best, answer[4], now, retention)
    answer[6] = sessions_held(p, client, now)
  end
end
return answer
