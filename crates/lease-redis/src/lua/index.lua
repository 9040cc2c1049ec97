-- Put after ended.lua before every script (lib.rs joins them). The pieces every script that
-- grants or ends a lease shares, and the index an installation-wide acquire chooses from:
--
--   <p>view     HASH  proxy id -> "healthy,latency,max,offered" and "\0key=value" for each
--                     index it is in, as published
--   <p>count    HASH  offered, unhealthy (of the offered), token (of the last publication), and
--                     per index `o:<name>`, `u:<name>` (its offered and unhealthy)
--   <p>free     ZSET  the offered, healthy proxies with room, scored active * 2^32 + latency
--   <p>free:<name>    the same, of the proxies in the index `name` (`key=value`)
--   <p>indexes  SET   the names of the indexes (what a publication keeps alive)
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

-- The proxy's published entry: healthy, latency, max, offered, and the indexes it belongs to
-- (a list of `key=value` names); nil when it has none. An entry is "h,l,m,o", then "\0name" for
-- each index.
local function view_entry(p, id)
  local published = redis.call('HGET', p .. 'view', id)
  if not published then return nil end
  local head, rest = string.match(published, '^([^%z]*)(.*)$')
  local h, l, m, o = string.match(head, '^([01]),(%-?%d+),(%-?%d+),?([01]?)$')
  if not h then return nil end
  local names = {}
  for name in string.gmatch(rest, '%z([^%z]+)') do names[#names + 1] = name end
  return h == '1', tonumber(l), tonumber(m), o ~= '0', names
end

-- The key of an index: the installation's (`name` nil) or one attribute value's.
local function index_key(p, name)
  if name then return p .. 'free:' .. name end
  return p .. 'free'
end

-- Puts the proxy in the index `key` at `score`, or takes it out (`score` nil). An index lives
-- as long as the view it indexes (a member added may have made the key).
local function place(p, key, id, score)
  if not score then
    redis.call('ZREM', key, id)
    return
  end
  if redis.call('ZADD', key, score, id) == 1 and redis.call('PTTL', key) == -1 then
    local lives = redis.call('PTTL', p .. 'view')
    if lives > 0 then redis.call('PEXPIRE', key, lives) else redis.call('DEL', key) end
  end
end

-- Puts the proxy in `free` and in each of its indexes at its place, or takes it out. `active`:
-- its active leases when the caller knows them (else they are counted).
local function rescore(p, id, active)
  local healthy, latency, max, offered, names = view_entry(p, id)
  local score
  if healthy and offered then
    active = active or redis.call('ZCARD', p .. 'active:' .. id)
    if active < max then
      -- Latencies beyond 2^32 - 1 ms (seven weeks) rank as equal; negative ones as 0.
      if latency < 0 then latency = 0 elseif latency >= SHIFT then latency = SHIFT - 1 end
      score = active * SHIFT + latency
    end
  end
  place(p, index_key(p), id, score)
  for _, name in ipairs(names or {}) do place(p, index_key(p, name), id, score) end
end

-- Whether the view has attribute indexes at all: what a script that ends leases asks once, so
-- that an installation without them pays nothing per lease for them.
local function has_indexes(p)
  return redis.call('EXISTS', p .. 'indexes') == 1
end

-- Moves the proxy up `free` and its indexes after one of its leases ended: a proxy in `free`
-- had room and still has, under the same view entry, one lease fewer (its score says how many
-- it had), and its place in each index is the same. One that was not there (full, say), or
-- whose score said no lease at all, is placed by `rescore`. `indexed`: `has_indexes(p)`.
local function rescore_released(p, id, indexed)
  local score = redis.call('ZADD', p .. 'free', 'XX', 'INCR', -SHIFT, id)
  if not score or tonumber(score) < 0 then return rescore(p, id) end
  if not indexed then return end
  local _, _, _, _, names = view_entry(p, id)
  for _, name in ipairs(names or {}) do place(p, index_key(p, name), id, tonumber(score)) end
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
  local found, indexed = records(p, expired), has_indexes(p)
  for i, lease in ipairs(expired) do
    local proxy = found[i][1]
    if proxy then
      if redis.call('ZREM', p .. 'active:' .. proxy, lease) == 1 then
        rescore_released(p, proxy, indexed)
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

-- Sessions (sticky leases; see session.lua):
--
--   <p>session:<client>/<name>  STRING  "lease,proxy": the session's lease, while it is
--   <p>lsess:<lease>            STRING  "<client>/<name>": the session a lease is of
--   <p>sessions:<client>        ZSET    the client's sessions by their lease's expiry
--   <p>session-clients          SET     clients with sessions (what the sweep counts)

-- The client and name of a session key "client/name" (a client name holds no '/').
local function session_parts(key)
  return string.match(key, '^([^/]+)/(.+)$')
end

-- The session's lease and proxy; nil when it has none.
local function session_lease(p, key)
  local held = redis.call('GET', p .. 'session:' .. key)
  if not held then return nil end
  return string.match(held, '^([^,]+),(.+)$')
end

-- The client's live sessions, having forgotten those whose lease expired.
local function sessions_held(p, client, now)
  local key = p .. 'sessions:' .. client
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  return redis.call('ZCARD', key)
end

-- Makes the session `key` last as its lease `lease` does, until `expires` (ms): the session's
-- key, the lease's note of its session and the client's set.
local function session_lives(p, key, lease, expires, now, retention)
  local client, name = session_parts(key)
  local lives = expires - now
  redis.call('PEXPIRE', p .. 'session:' .. key, lives + GRACE)
  redis.call('PEXPIRE', p .. 'lsess:' .. lease, lives + kept(retention))
  redis.call('ZADD', p .. 'sessions:' .. client, expires, name)
  extend(p .. 'sessions:' .. client, lives + GRACE)
  redis.call('SADD', p .. 'session-clients', client)
  extend(p .. 'session-clients', lives + GRACE)
end

-- Makes `lease`, granted on `proxy` until `expires`, the lease of the session `key`.
local function bind_session(p, key, lease, proxy, expires, now, retention)
  redis.call('SET', p .. 'session:' .. key, lease .. ',' .. proxy)
  redis.call('SET', p .. 'lsess:' .. lease, key)
  session_lives(p, key, lease, expires, now, retention)
end

-- Ends the sessions whose leases `leases` (just ended) still are. An installation without
-- sessions pays one read per call for them.
local function end_sessions(p, leases)
  if #leases == 0 or redis.call('EXISTS', p .. 'session-clients') == 0 then return end
  local keys = {}
  for i, lease in ipairs(leases) do keys[i] = p .. 'lsess:' .. lease end
  local found = {}
  for first = 1, #keys, 1000 do
    local part = redis.call('MGET', unpack(keys, first, math.min(first + 999, #keys)))
    for i = 1, #part do found[first + i - 1] = part[i] end
  end
  for i, lease in ipairs(leases) do
    local key = found[i]
    if key then
      redis.call('DEL', keys[i])
      if session_lease(p, key) == lease then
        local client, name = session_parts(key)
        redis.call('DEL', p .. 'session:' .. key)
        redis.call('ZREM', p .. 'sessions:' .. client, name)
      end
    end
  end
end

-- Ends the leases `leases` now, in order; unknown or ended ids are fine. Returns nothing.
local function release_leases(p, leases, now, max_ended, retention)
  local gone, lives = {}, 0
  if #leases > 0 then
    local scores = redis.call('ZMSCORE', p .. 'all', unpack(leases))
    local found, indexed = records(p, leases), has_indexes(p)
    local seen = {}
    for i, lease in ipairs(leases) do
      local proxy, _, expires = unpack(found[i])
      -- An id twice in one batch is ended by the first.
      local active = scores[i] and not seen[lease]
      seen[lease] = true
      local held = proxy and redis.call('ZREM', p .. 'active:' .. proxy, lease) == 1
      if held then
        rescore_released(p, proxy, indexed)
      elseif active and proxy then
        -- Active, yet not in its proxy's set: the set went behind the scripts' back (its TTL,
        -- an eviction), so the proxy's place in the index is counted afresh.
        rescore(p, proxy)
      end
      if active then
        gone[#gone + 1] = lease
        lives = math.max(lives, (expires or now) + kept(retention) - now)
      end
    end
    if #gone > 0 then redis.call('ZREM', p .. 'all', unpack(gone)) end
  end
  end_sessions(p, gone)
  ended(p, gone, max_ended, lives, retention)
end

-- The proxy of `lease` while it is active (unreleased, unexpired); nil otherwise.
local function live_proxy(p, lease, now)
  local score = redis.call('ZSCORE', p .. 'all', lease)
  if not score or tonumber(score) <= now then return nil end
  local proxy = record(p, lease)
  if not proxy or not redis.call('ZSCORE', p .. 'active:' .. proxy, lease) then return nil end
  return proxy
end

-- Extends the active lease `lease` on `proxy` to `ttl` from now, never shortening it: its
-- expiry in `all`, in its proxy's set, in its record and in its session. Returns the expiry and
-- the proxy's active leases.
local function extend_lease(p, lease, proxy, now, ttl, retention)
  local was = tonumber(redis.call('ZSCORE', p .. 'all', lease))
  local expires = math.max(was, now + ttl)
  if expires > was then
    local lives = expires - now
    redis.call('ZADD', p .. 'all', 'XX', expires, lease)
    extend(p .. 'all', lives + GRACE)
    redis.call('ZADD', p .. 'active:' .. proxy, 'XX', expires, lease)
    extend(p .. 'active:' .. proxy, lives + GRACE)
    local _, target = record(p, lease)
    redis.call('SET', p .. 'lease:' .. lease, expires .. ',' .. (target or '') .. ',' .. proxy,
      'PX', lives + kept(retention))
    local key = redis.call('GET', p .. 'lsess:' .. lease)
    if key and session_lease(p, key) == lease then
      session_lives(p, key, lease, expires, now, retention)
    end
  end
  return expires, redis.call('ZCOUNT', p .. 'active:' .. proxy, '(' .. now, '+inf')
end
