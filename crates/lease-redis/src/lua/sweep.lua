-- Forgets ended leases from the index of all leases (everything else ends by its key's TTL).
-- ARGV: prefix, now (ms, or '' for Redis's clock). Returns all active leases.

-- The caller's time in ms, or Redis's own when the caller sends ''.
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local p, now = ARGV[1], clock(ARGV[2])
redis.call('ZREMRANGEBYSCORE', p .. 'all', '-inf', now)
return redis.call('ZCARD', p .. 'all')
