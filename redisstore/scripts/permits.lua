-- fleetrate in-flight permits: helpers prepended (after common.lua) to the
-- scripts that take, release, renew or fill permits. They mirror package
-- inflight on three keys per bucket, which share the bucket's hash slot
-- (see permitKeys in permits.go):
--
--   h: the permits held, a sorted set of holder ids scored by lease end
--      (µs on the server's clock);
--   q: the queue, a sorted set of waiter ids scored by arrival (each new
--      waiter's whole part one above the last's), so first come first
--      served; the fraction is the waiter's reserve / 65536 (its priority
--      class: Bucket.PermitReserve, below MaxInFlight = 65536; 0 for the
--      top class, and for waiters written before classes);
--   w: the waiters' lease ends, a sorted set of the same ids.
--
-- After a failover (see failover_permits.go) h may also hold the member
-- FILL, scored by the end of the fill: until then the bucket counts as
-- holding every permit of its bound. No id has a space, so none is FILL.
-- Every score is an integer below 2^53, exact in a double and in Redis's
-- reply of it. The keys live until the last lease they hold ends, plus
-- slack (keep).

local FILL = ' fill'

-- reserve_of returns the reserve of a waiter whose queue score is score.
local function reserve_of(score)
  return (score - math.floor(score)) * 65536
end

-- last_score returns the highest score of sorted set z, or nil.
local function last_score(z)
  local r = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  return r[2] and tonumber(r[2])
end

-- keep_held sets the TTL of the held permits h to cover the last lease.
local function keep_held(h, now)
  local last = last_score(h)
  if last then redis.call('PEXPIRE', h, math.max(math.ceil((last - now) / 1000), 0) + TTL_SLACK_MS) end
end

-- keep sets the TTL of a bucket's permit keys to cover the last lease. (A
-- grant, which can only take a waiter out of the queue, needs keep_held
-- alone: the queue's TTL may then outlast its last lease, never fall
-- short of it.)
local function keep(h, q, w, now)
  keep_held(h, now)
  local last = last_score(w)
  if last then
    local ms = math.max(math.ceil((last - now) / 1000), 0) + TTL_SLACK_MS
    redis.call('PEXPIRE', w, ms)
    redis.call('PEXPIRE', q, ms)
  end
end

-- expire drops the leases that ended by now (inflight.Set.Expire).
local function expire(h, q, w, now)
  redis.call('ZREMRANGEBYSCORE', h, '-inf', now)
  local gone = redis.call('ZRANGEBYSCORE', w, '-inf', now)
  for i = 1, #gone do redis.call('ZREM', q, gone[i]) end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', w, '-inf', now) end
end

-- view returns where a bucket of in-flight bound stands for id ('' for
-- none), once expired: held (counting a live fill as the whole bound),
-- real (the holders alone), mine (id holds a permit), place (id's index in
-- the queue, -1 when it waits not), qlen, first (the earliest lease end
-- of the held, the fill's included; 0 when none is held) and qfirst (the
-- earliest lease end of the waiters; 0 when none waits).
local function view(h, q, w, bound, id, r)
  local real = redis.call('ZCARD', h)
  local fill = redis.call('ZSCORE', h, FILL)
  if fill then real = real - 1 end
  local held = real
  if fill and held < bound then held = bound end
  local v = { held = held, real = real, first = 0, mine = false, place = -1, qlen = redis.call('ZCARD', q), qfirst = 0 }
  if real > 0 or fill then
    local r = redis.call('ZRANGE', h, 0, 0, 'WITHSCORES')
    v.first = tonumber(r[2])
  end
  if v.qlen > 0 then
    local r = redis.call('ZRANGE', w, 0, 0, 'WITHSCORES')
    v.qfirst = tonumber(r[2])
  end
  if id ~= '' then
    v.mine = real > 0 and redis.call('ZSCORE', h, id) ~= false
    if v.qlen > 0 then v.place = redis.call('ZRANK', q, id) or -1 end
  end
  -- eligible: the waiters ahead of id (all, when it waits not) of its
  -- class or above, a reserve of at most r (inflight.Set.Admit).
  v.eligible = 0
  if r and v.qlen > 0 then
    local last = v.place - 1
    if v.place < 0 then last = -1 end
    if v.place ~= 0 then
      local ahead = redis.call('ZRANGE', q, 0, last, 'WITHSCORES')
      for i = 2, #ahead, 2 do
        if reserve_of(tonumber(ahead[i])) <= r then v.eligible = v.eligible + 1 end
      end
    end
  end
  return v
end

-- admits mirrors inflight.Set.Admit: whether id, of reserve r, may hold
-- a permit now, and how many of its class or above wait ahead of it.
local function admits(v, bound, r)
  if v.mine then return true, 0 end
  return v.held + v.eligible + r < bound, v.eligible
end

-- grant mirrors inflight.Set.Grant: id (whose view is v) holds a permit
-- until exp, leaving the queue; a permit held already keeps the later of
-- its ends.
local function grant(h, q, w, v, id, exp)
  if v.place >= 0 then
    redis.call('ZREM', q, id)
    redis.call('ZREM', w, id)
  end
  redis.call('ZADD', h, 'GT', exp, id)
end

-- enqueue mirrors inflight.Set.Enqueue: id, of reserve r, waits until
-- exp, keeping its place when it waits already. It returns how many of its
-- class or above wait ahead (v.eligible, which view counted for r).
local function enqueue(q, w, v, id, exp, r)
  if v.place >= 0 then
    redis.call('ZADD', w, 'GT', exp, id)
    return v.eligible
  end
  local seq = math.floor(last_score(q) or -1) + 1
  redis.call('ZADD', q, seq + r / 65536, id)
  redis.call('ZADD', w, exp, id)
  return v.eligible
end
