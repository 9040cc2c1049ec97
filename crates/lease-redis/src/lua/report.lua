-- Records a report: a rate_limited or banned result starts a cooldown for the lease's proxy
-- and the resolved target (the report's, else the lease's, else '' for a global one).
-- A proxy cools down for at most `cap` targets beside its global cooldown: a new one beyond
-- them first forgets ended ones, then drops the one that ends soonest.
-- KEYS: prefix. ARGV: now (ms, or '' for Redis's clock), lease id, 'ok' or 'cool', target (its
--       digest, '' for none), cooldown (ms), cap.
-- Returns 0 for an unknown or forgotten lease, 2 when a cooldown was dropped, 1 otherwise.

local p, now, lease, result, target, cooldown = KEYS[1], clock(ARGV[1]), ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local cap = tonumber(ARGV[6])
local proxy, lease_target, expires = record(p, lease)
if not proxy then return 0 end
-- Forgotten one window after expiry, whatever the key's own TTL says.
if expires + cooldown <= now then return 0 end
if result == 'ok' then return 1 end
local resolved = target
if resolved == '' then resolved = lease_target end
local cool_key = p .. 'cool:' .. proxy
local ends = now + cooldown
local current = redis.call('HGET', cool_key, resolved)
local dropped = 0
if not current and resolved ~= '' then
  local held = redis.call('HLEN', cool_key) - redis.call('HEXISTS', cool_key, '')
  if held >= cap then
    local all = redis.call('HGETALL', cool_key)
    local soonest, soonest_end
    for i = 1, #all, 2 do
      local field, field_end = all[i], tonumber(all[i + 1])
      if field ~= '' then
        if field_end <= now then
          redis.call('HDEL', cool_key, field)
          held = held - 1
        elseif soonest_end == nil or field_end < soonest_end then
          soonest, soonest_end = field, field_end
        end
      end
    end
    if held >= cap and soonest then
      redis.call('HDEL', cool_key, soonest)
      dropped = 1
    end
  end
end
if ends > tonumber(current or '0') then
  redis.call('HSET', cool_key, resolved, ends)
end
if redis.call('PTTL', cool_key) < cooldown then redis.call('PEXPIRE', cool_key, cooldown) end
return 1 + dropped
