-- Calls `command` with `head` (a list of leading arguments) and then the values of `values`, in
-- as many calls as it takes to pass at most 1 000 values each: Lua unpacks only so many at once.
-- Returns the last call's answer (nil when `values` is empty).
local function call_in_runs(command, head, values)
  local answer
  for first = 1, #values, 1000 do
    local args = {unpack(head)}
    for i = first, math.min(first + 999, #values) do args[#args + 1] = values[i] end
    answer = redis.call(command, unpack(args))
  end
  return answer
end

-- The keys of the records of `leases`.
local function record_keys(p, leases)
  local keys = {}
  for i = 1, #leases do keys[i] = p .. 'lease:' .. leases[i] end
  return keys
end

-- Records that the leases `ids` ended, keeping the newest `max` ended leases reportable: the
-- oldest beyond them lose their record at once. A list, so the order is the order they ended
-- in, whatever the clock says. Callers add at most 10 000 ids at once, so the excess removed
-- here is bounded too. The list lives as long as the longest-lived record it names: `lives`
-- (ms) is how long the longest-lived of `ids` has left, and the list never lives less than it
-- did; `retention` when that is nothing.
local function ended(p, ids, max, lives, retention)
  if #ids == 0 then return end
  local key = p .. 'ended'
  local length = call_in_runs('RPUSH', {key}, ids)
  local excess = length - max
  if excess > 0 then
    call_in_runs('DEL', {}, record_keys(p, redis.call('LPOP', key, excess)))
  end
  if lives <= 0 then lives = retention end
  -- Never shorter than it was: an older record may outlive these.
  if redis.call('PEXPIRE', key, lives, 'GT') == 0 then redis.call('PEXPIRE', key, lives, 'NX') end
end
