-- fleetrate renew: extend id's permit, or its place in the queue, to
-- ttl_us from now in every bucket with an in-flight bound
-- (inflight.Set.Renew). While a bucket's permits are filled after a
-- failover (see permits.lua), a holder the new master does not know is
-- taken back as a holder, up to the bound: it held a permit on the old
-- master, which the fill keeps free for it.
-- KEYS: for each bucket, its three permit keys. ARGV: id, ttl_us, then
-- each bucket's bound.
-- Returns how many of the buckets held or queued id.
local id = ARGV[1]
local now = now_us()
local exp = now + tonumber(ARGV[2])
local held = 0
for b = 1, #KEYS / 3 do
  local h, q, w = KEYS[3 * b - 2], KEYS[3 * b - 1], KEYS[3 * b]
  expire(h, q, w, now)
  if redis.call('ZSCORE', h, id) then
    redis.call('ZADD', h, 'XX', 'GT', exp, id)
    held = held + 1
  elseif redis.call('ZSCORE', w, id) then
    redis.call('ZADD', w, 'XX', 'GT', exp, id)
    held = held + 1
  elseif redis.call('ZSCORE', h, FILL) and view(h, q, w, 0, '').real < tonumber(ARGV[2 + b]) then
    redis.call('ZADD', h, exp, id)
    held = held + 1
  end
  keep(h, q, w, now)
end
return held
