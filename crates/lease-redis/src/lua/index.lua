-- Put after ended.lua before every script (lib.rs joins them). The pieces every script that
-- grants or ends a lease shares, and the index an installation-wide acquire chooses from:
--
--   <p>view   HASH   proxy id -> "healthy,latency,max,offered", as published
--   <p>count  HASH   offered, unhealthy (of the offered), token (of the last publication)
--   <p>free   ZSET   the offered, healthy proxies with room, scored active * 2^32 + latency
--
-- Equal scores sort by the member's bytes, so the head of `free` is the in-memory store's
-- choice: fewest active leases, then lowest latency, then smallest id. Whoever changes a
-- proxy's active leases or its view entry calls `rescore`, so `free` stays exact, and its
-- scores can stand in for the proxy's active count (which saves Redis a call per grant and
-- release).
--
-- A lease's record is one string, "expires,target,proxy" (see `record`), so that a grant
-- checks the id is free, writes the record and sets its TTL in one `SET ... NX PX`.

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

-- Puts the proxy in `free` at its place, or takes it out. `active`: its active leases when the
-- caller knows them (else they are counted).
local function rescore(p, id, active)
  local key = p .. 'free'
  local healthy, latency, max, offered = view_entry(p, id)
  if healthy and offered then
    active = active or redis.call('ZCARD', p .. 'active:' .. id)
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

-- Moves the proxy up `free` after one of its leases ended: a proxy in `free` had room and still
-- has, under the same view entry, one lease fewer (its score says how many it had). One that
-- was not there (full, say), or whose score said no lease at all, is placed by `rescore`.
local function rescore_released(p, id)
  local score = redis.call('ZADD', p .. 'free', 'XX', 'INCR', -SHIFT, id)
  if not score or tonumber(score) < 0 then rescore(p, id) end
end

-- How long a lease's record lives past its expiry (ms): a cooldown window, at least GRACE.
local function kept(retention)
  return math.max(retention, GRACE)
end

-- A record's text "expires,target,proxy" as proxy, target digest and expiry (ms); nil when it
-- is not one.
local function parsed_record(text)
  local expires, target, proxy = string.match(text, '^(%d+),(%x*),(.*)$')
  if not expires then return nil end
  return proxy, target, tonumber(expires)
end

-- The lease's record: its proxy, target digest and expiry (ms); nil when there is none.
local function record(p, lease)
  local key = p .. 'lease:' .. lease
  local r = redis.pcall('GET', key)
  if type(r) == 'table' and r.err then
    -- A hash: a lease granted by a build before records were strings, which lives on after an
    -- upgrade until its TTL.
    local h = redis.call('HMGET', key, 'proxy', 'target', 'expires')
    if not h[1] or not tonumber(h[3] or '') then return nil end
    return h[1], h[2] or '', tonumber(h[3])
  end
  if not r then return nil end
  return parsed_record(r)
end

-- The records of `leases`, in their order, each as {proxy, target digest, expiry} ({} for
-- none): read with `MGET` (1 000 at a time), and with `record` where that found no string (no
-- record, or an older build's hash).
local function records(p, leases)
  local keys, out = record_keys(p, leases), {}
  for first = 1, #keys, 1000 do
    local found = redis.call('MGET', unpack(keys, first, math.min(first + 999, #keys)))
    for i = first, math.min(first + 999, #keys) do
      local text = found[i - first + 1]
      if text then out[i] = {parsed_record(text)} else out[i] = {record(p, leases[i])} end
    end
  end
  return out
end

-- Moves at most `limit` leases past their expiry out of the index of all leases and their
-- proxy's active set, to the ended. Returns how many it moved.
local function expire_due(p, now, max_ended, retention, limit)
  local due = redis.call('ZRANGEBYSCORE', p .. 'all', '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
  if #due == 0 then return 0 end
  local expired, last = {}, 0
  for i = 1, #due, 2 do
    expired[#expired + 1] = due[i]
    last = tonumber(due[i + 1])
  end
  call_in_runs('ZREM', {p .. 'all'}, expired)
  local found = records(p, expired)
  for i, lease in ipairs(expired) do
    local proxy = found[i][1]
    if proxy then
      if redis.call('ZREM', p .. 'active:' .. proxy, lease) == 1 then
        rescore_released(p, proxy)
      else
        -- Not in its proxy's set: that went behind the scripts' back (see release.lua).
        rescore(p, proxy)
      end
    end
  end
  -- In expiry order: the last one's record lives longest.
  ended(p, expired, max_ended, last + kept(retention) - now, retention)
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

-- Grants `lease` on `proxy`, which has `active` leases. Returns {2} when the lease id is taken,
-- else {1, proxy, its active leases, expires (ms)}. The caller adds the lease to `all` and
-- makes `all` live past it (`extend`): a batch of grants does both once.
local function grant(p, proxy, active, lease, now, ttl, target, retention)
  local expires = now + ttl
  local made = redis.call('SET', p .. 'lease:' .. lease, expires .. ',' .. target .. ',' .. proxy,
    'NX', 'PX', ttl + kept(retention))
  if not made then return {2} end
  local active_key = p .. 'active:' .. proxy
  redis.call('ZADD', active_key, expires, lease)
  if active == 0 then
    -- The proxy's first lease made its set: one call sets the TTL. (Were a set there behind the
    -- scripts' back, it may now end before its leases; their release or expiry then counts the
    -- proxy afresh, see release.lua.) Later leases only make it later; `extend` also gives a
    -- TTL to a set made again behind the index's back (its score said leases it no longer had).
    redis.call('PEXPIRE', active_key, ttl + GRACE)
  else
    extend(active_key, ttl + GRACE)
  end
  rescore(p, proxy, active + 1)
  return {1, proxy, active + 1, expires}
end
