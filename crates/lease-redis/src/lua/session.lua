-- The session step of an acquire in a session: the session's lease, extended while its proxy
-- is fit for the request; else given back. The caller has read the session (`expected`, its
-- lease as the caller saw it) and checked its proxy against the request's candidates (`fit`);
-- the step applies only while the session is still as read, so two replicas asking for one
-- session at once end with one lease.
-- KEYS: prefix. ARGV: now (ms, or '' for Redis's clock), session key (client/name), expected
--       lease, fit ('1'/'0'), ttl (ms), target (its digest, '' for none), ended leases kept,
--       retention (ms).
-- Returns {4} when the session changed since it was read; {6, sessions} when it has no live
-- lease (now: none, ended, or just given back because its proxy is unfit), with the client's
-- live sessions; {1, proxy, its active leases, expires (ms), all active, sessions, how long it
-- lives from now (ms)} for the session's lease, extended.

local p, now, key, expected = KEYS[1], clock(ARGV[1]), ARGV[2], ARGV[3]
local fit, ttl, target = ARGV[4] == '1', tonumber(ARGV[5]), ARGV[6]
local max_ended, retention = tonumber(ARGV[7]), tonumber(ARGV[8])
local client = session_parts(key)

local lease = session_lease(p, key)
if lease ~= expected then return {4} end
local proxy = live_proxy(p, lease, now)
if not proxy then
  -- Its lease ended (expired; a release ends the session at once).
  end_sessions(p, {lease})
  redis.call('DEL', p .. 'session:' .. key)
  return {6, sessions_held(p, client, now)}
end
-- The published view wins over the caller's values, as for a candidate.
local healthy, _, _, offered = view_entry(p, proxy)
if healthy ~= nil and not (healthy and offered) then fit = false end
if fit and not cooling(p, proxy, target, now) then
  local expires, active = extend_lease(p, lease, proxy, now, ttl, retention)
  return {1, proxy, active, expires, redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf'),
    sessions_held(p, client, now), expires - now}
end
release_leases(p, {lease}, now, max_ended, retention)
return {6, sessions_held(p, client, now)}
