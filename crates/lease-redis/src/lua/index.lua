-- Put after ended.lua before every script (lib.rs joins them). The pieces every script that
-- grants or ends a lease shares, and the index an installation-wide acquire chooses from:
--
--   <p>view   HASH   proxy id -> "healthy,latency,max,offered", as published
--   <p>count  HASH   offered, unhealthy (of the offered), token (of the last publication)
--   <p>free   ZSET   the offered, healthy proxies with room, scored active * 2^32 + latency
--
-- Equal scores sort by the member's bytes, so the head of `free` is the in-memory store's
-- choice: fewest active leases, then lowest latency, then smallest id. Whoever changes a
-- proxy's active leases or its view entry calls `rescore`, so `free` stays exact.

local SHIFT = 4294967296
-- How long past its expiry a lease stays in `all`, in its proxy's active set and in its record
-- (ms): expiry is noticed by reading them (`expire_due`), and a proxy leaves `free` for good if
-- they vanish first. Longer than the view lives unpublished (five minutes), so while the
-- leader publishes, the sweep of every replica (every 30 s) has moved them; without both, the
-- view expires too, and the next publication rebuilds the index whole.
local GRACE = 360000

-- The proxy's published entry: healthy, latency, max, offered; nil when it has none.
local function view_entry(p, id)
  local published = redis.call('HGET', p .. 'view', id)
  if not published then return nil end
  local h, l, m, o = string.match(published, '^([01]),(%-?%d+),(%-?%d+),?([01]?)$')
  if not h then return nil end
  return h == '1', tonumber(l), tonumber(m), o ~= '0'
end

-- Puts the proxy in `free` at its place, or takes it out.
local function rescore(p, id)
  local key = p .. 'free'
  local healthy, latency, max, offered = view_entry(p, id)
  if healthy and offered then
    local active = redis.call('ZCARD', p .. 'active:' .. id)
    if active < max then
      -- Latencies beyond 2^32 - 1 ms (seven weeks) rank as equal; negative ones as 0.
      if latency < 0 then latency = 0 elseif latency >= SHIFT then latency = SHIFT - 1 end
      -- The index lives as long as the view it indexes (a member added may have made the key).
      if redis.call('ZADD', key, active * SHIFT + latency, id) == 1 and redis.call('PTTL', key) == -1 then
        local lives = redis.call('PTTL', p .. 'view')
        if lives > 0 then redis.call('PEXPIRE', key, lives) else redis.call('DEL', key) end
      end
      return
    end
  end
  redis.call('ZREM', key, id)
end

-- Moves at most `limit` leases past their expiry out of the index of all leases and their
-- proxy's active set, to the ended. Returns how many it moved.
local function expire_due(p, now, max_ended, retention, limit)
  local expired = redis.call('ZRANGEBYSCORE', p .. 'all', '-inf', now, 'LIMIT', 0, limit)
  for _, lease in ipairs(expired) do
    redis.call('ZREM', p .. 'all', lease)
    local proxy = redis.call('HGET', p .. 'lease:' .. lease, 'proxy')
    if proxy then
      redis.call('ZREM', p .. 'active:' .. proxy, lease)
      rescore(p, proxy)
    end
  end
  ended(p, expired, max_ended, retention)
  return #expired
end

-- Whether the proxy cools down for a request naming `target` ('' for none).
local function cooling(p, id, target, now)
  local key = p .. 'cool:' .. id
  if target == '' then return tonumber(redis.call('HGET', key, '') or '0') > now end
  local ends = redis.call('HMGET', key, '', target)
  return tonumber(ends[1] or '0') > now or tonumber(ends[2] or '0') > now
end

-- Makes the key live at least `ms` more: one call when that is later than its TTL, two when
-- it has none yet.
local function extend(key, ms)
  if redis.call('PEXPIRE', key, ms, 'GT') == 0 then redis.call('PEXPIRE', key, ms, 'NX') end
end

-- Grants `lease` on `proxy`, which has `active` leases. Returns the acquire scripts' answer:
-- {2} when the lease id is taken, else {1, proxy, its active leases, expires (ms), all active}.
local function grant(p, proxy, active, lease, now, ttl, target, retention)
  local lease_key = p .. 'lease:' .. lease
  if redis.call('EXISTS', lease_key) == 1 then return {2} end
  local expires = now + ttl
  redis.call('HSET', lease_key, 'proxy', proxy, 'target', target, 'expires', expires)
  redis.call('PEXPIRE', lease_key, ttl + math.max(retention, GRACE))
  local active_key = p .. 'active:' .. proxy
  redis.call('ZADD', active_key, expires, lease)
  extend(active_key, ttl + GRACE)
  redis.call('ZADD', p .. 'all', expires, lease)
  extend(p .. 'all', ttl + GRACE)
  rescore(p, proxy)
  return {1, proxy, active + 1, expires, redis.call('ZCOUNT', p .. 'all', '(' .. now, '+inf')}
end

