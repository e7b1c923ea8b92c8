-- fleetrate release: give back id's permit, and its place in the queue, in
-- every bucket with an in-flight bound (inflight.Set.Release), and publish
-- on channel a notice "<waiter id> <bucket key>" for each waiter a permit
-- is now free for (the first ones in the queue, as many as are free,
-- passing over those whose priority class's reserve leaves them none), so
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
  local free = bound - v.held
  if free > 0 and v.qlen > 0 then
    -- The first waiters a permit is free for, in order: a waiter of a
    -- reserve of free or more cannot take one (inflight.Set.Admit), so
    -- it is passed over, within the first free + 64.
    local ahead = redis.call('ZRANGE', q, 0, free + 63, 'WITHSCORES')
    local woken = 0
    for i = 1, #ahead, 2 do
      if woken >= free then break end
      if reserve_of(tonumber(ahead[i + 1])) < free then
        redis.call('PUBLISH', channel, ahead[i] .. ' ' .. key)
        woken = woken + 1
      end
    end
  end
end
return held
