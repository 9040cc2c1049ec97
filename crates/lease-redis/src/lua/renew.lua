-- Renews a lease: extends it to `ttl` from now, never shortening it, while it is active.
-- KEYS: prefix. ARGV: now (ms, or '' for Redis's clock), lease id, mode, ttl (ms), retention
--       (ms). Modes: 'peek' answers {proxy} while the lease is active, {} otherwise, and
--       changes nothing (the caller then checks the proxy is fit); 'extend' answers {1, proxy,
--       its active leases, expires (ms), how long it lives from now (ms)}, or {0} when the
--       lease is not active.

local p, now, lease, mode = KEYS[1], clock(ARGV[1]), ARGV[2], ARGV[3]
local ttl, retention = tonumber(ARGV[4]), tonumber(ARGV[5])
local proxy = live_proxy(p, lease, now)
if mode == 'peek' then
  if proxy then return {proxy} end
  return {}
end
if not proxy then return {0} end
local expires, active = extend_lease(p, lease, proxy, now, ttl, retention)
return {1, proxy, active, expires, expires - now}
