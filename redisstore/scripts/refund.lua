-- fleetrate refund: give back n tokens of a grant made at at_us that was
-- never used, to every bucket in KEYS: each limit gets back what time has
-- not refilled since at_us (n intervals less the time since), at most its
-- debt, and nothing while its debt is above its fill time less the
-- bucket's reserve (a slot booked ahead, or a drain). Mirrors gcra.Refund.
-- ARGV: n, at_us, then the limits and the reserve of each key (see
-- common.lua).
local n = tonumber(ARGV[1])
local now = now_us()
-- Clamped one µs beyond the longest fill time (60 days), as gcra's
-- refundHorizonUS: every limit has refilled such a grant in full.
local el = math.min(math.max(now - tonumber(ARGV[2]), 0), REFUND_HORIZON_US) * 1000
local pos = 3
for b = 1, #KEYS do
  local lims, m
  lims, m, pos = read_take_limits(pos)
  local d = load(KEYS[b], lims, m, now)
  for i = 1, m do
    local iv, burst = lims[2 * i - 1], lims[2 * i]
    local r = math.min(math.max(lims.r, 0), burst)
    if d[i] > 0 and d[i] <= (burst - r) * iv then
      local back = math.min(math.min(n, burst) * iv - el, d[i])
      if back > 0 then
        d[i] = d[i] - back
        spend_lead(d, i, -1, back)
      end
    end
  end
  save(KEYS[b], now, d)
end
return now
