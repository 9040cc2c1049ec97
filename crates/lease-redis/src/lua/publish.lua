-- Replaces the published view in one step.
-- ARGV: prefix, lifetime (ms), then pairs: id, "healthy,latency,max,offered".
local p, lifetime = ARGV[1], tonumber(ARGV[2])
local key = p .. 'view'
redis.call('DEL', key)
for i = 3, #ARGV, 2 do redis.call('HSET', key, ARGV[i], ARGV[i + 1]) end
if #ARGV > 2 then redis.call('PEXPIRE', key, lifetime) end
return 1
