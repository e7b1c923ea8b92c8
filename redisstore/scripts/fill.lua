-- fleetrate fill: count every permit of a bucket as held until hold_us
-- from now (the member FILL of permits.lua), on a new master after a
-- failover, so that it grants no permit while one the old master granted
-- may still be held (see failover_permits.go).
-- KEYS: the bucket's three permit keys. ARGV: hold_us.
local now = now_us()
local h, q, w = KEYS[1], KEYS[2], KEYS[3]
redis.call('ZADD', h, 'GT', now + tonumber(ARGV[1]), FILL)
keep(h, q, w, now)
return now
