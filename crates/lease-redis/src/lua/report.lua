-- Records a report: a rate_limited or banned result starts a cooldown for the lease's proxy
-- and the resolved target (the report's, else the lease's, else '' for a global one).
-- ARGV: prefix, now (ms, or '' for Redis's clock), lease id, 'ok' or 'cool', target ('' for none), cooldown (ms).
-- Returns 0 for an unknown or forgotten lease, 1 otherwise.

local p, now, lease, result, target, cooldown = ARGV[1], clock(ARGV[2]), ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
local l = redis.call('HMGET', p .. 'lease:' .. lease, 'proxy', 'target', 'expires')
if not l[1] then return 0 end
-- Forgotten one window after expiry, whatever the key's own TTL says.
if tonumber(l[3]) + cooldown <= now then return 0 end
if result == 'ok' then return 1 end
local resolved = target
if resolved == '' then resolved = l[2] end
local cool_key = p .. 'cool:' .. l[1]
local ends = now + cooldown
if ends > tonumber(redis.call('HGET', cool_key, resolved) or '0') then
  redis.call('HSET', cool_key, resolved, ends)
end
if redis.call('PTTL', cool_key) < cooldown then redis.call('PEXPIRE', cool_key, cooldown) end
return 1
