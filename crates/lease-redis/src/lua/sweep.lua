-- Moves expired leases from the index of all leases (and their proxy's active set) to the
-- ended, at most 10 000 a run (everything else ends by its key's TTL), and counts each
-- client's live sessions (forgetting a client that has none left).
-- KEYS: prefix. ARGV: now (ms, or '' for Redis's clock), ended leases kept, retention (ms).
-- Returns {all active leases, then client, sessions for each client with sessions}.

local p, now = KEYS[1], clock(ARGV[1])
expire_due(p, now, tonumber(ARGV[2]), tonumber(ARGV[3]), 10000)
local out = {redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')}
-- As many clients as the API has tokens for, at most.
for _, client in ipairs(redis.call('SMEMBERS', p .. 'session-clients')) do
  local held = sessions_held(p, client, now)
  if held == 0 then
    redis.call('SREM', p .. 'session-clients', client)
  else
    out[#out + 1] = client
    out[#out + 1] = held
  end
end
return out
