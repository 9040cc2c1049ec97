-- Records that the leases `ids` ended, keeping the newest `max` ended leases reportable: the
-- oldest beyond them lose their record at once. A list, so the order is the order they ended
-- in, whatever the clock says. Callers add at most 10 000 ids at once, so the excess removed
-- here is bounded too. The list lives as long as the longest-lived record it names: `lives`
-- (ms) is how long the longest-lived of `ids` has left, and the list never lives less than it
-- did; `retention` when that is nothing.
local function ended(p, ids, max, lives, retention)
  if #ids == 0 then return end
  local key = p .. 'ended'
  local length = 0
  -- In pushes of at most 1 000: Lua unpacks only so many values at once.
  for first = 1, #ids, 1000 do
    length = redis.call('RPUSH', key, unpack(ids, first, math.min(first + 999, #ids)))
  end
  local excess = length - max
  if excess > 0 then
    for _, id in ipairs(redis.call('LPOP', key, excess)) do redis.call('DEL', p .. 'lease:' .. id) end
  end
  if lives <= 0 then lives = retention end
  -- Never shorter than it was: an older record may outlive these.
  if redis.call('PEXPIRE', key, lives, 'GT') == 0 then redis.call('PEXPIRE', key, lives, 'NX') end
end
