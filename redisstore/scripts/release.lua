-- fleetrate release: give back id's permit, and its place in the queue, in
-- every bucket with an in-flight bound (inflight.Set.Release), and publish
-- on channel a notice "<waiter id> <bucket key>" for each waiter a permit
-- is now free for (the first ones in the queue, as many as are free), so
-- that only their processes wake (see NotifyPermit).
-- KEYS: for each bucket, its key and its three permit keys (see
-- permits.lua). ARGV: channel, id, then each bucket's bound.
-- Returns how many of the buckets held a permit for id.
local channel, id = ARGV[1], ARGV[2]
local now = now_us()
local held = 0
for b = 1, #KEYS / 4 do
  local key, h, q, w = KEYS[4 * b - 3], KEYS[4 * b - 2], KEYS[4 * b - 1], KEYS[4 * b]
  local bound = tonumber(ARGV[2 + b])
  expire(h, q, w, now)
  redis.call('ZREM', q, id)
  redis.call('ZREM', w, id)
  held = held + redis.call('ZREM', h, id)
  local v = view(h, q, w, bound, '')
  if v.held < bound and v.qlen > 0 then
    local woken = redis.call('ZRANGE', q, 0, bound - v.held - 1)
    for i = 1, #woken do redis.call('PUBLISH', channel, woken[i] .. ' ' .. key) end
  end
end
return held
