-- Records that the leases `ids` ended, keeping the newest `max` ended leases reportable: the
-- oldest beyond them lose their record at once (at most 1000 per call). A list, so the order
-- is the order they ended in, whatever the clock says.
local function ended(p, ids, max, retention)
  if #ids == 0 then return end
  local key = p .. 'ended'
  for _, id in ipairs(ids) do redis.call('RPUSH', key, id) end
  local excess = redis.call('LLEN', key) - max
  if excess > 0 then
    local old = redis.call('LPOP', key, math.min(excess, 1000))
    for _, id in ipairs(old) do redis.call('DEL', p .. 'lease:' .. id) end
  end
  if redis.call('PTTL', key) < retention then redis.call('PEXPIRE', key, retention) end
end
