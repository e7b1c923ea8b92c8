-- fleetrate cancel: give back a booking made at stamp_us whose slot began
-- wait_ns after it: nothing once the slot has begun, else each limit of
-- each bucket its cost only when nothing was booked on it since (its debt,
-- refilled to now, is still the one the booking left). Mirrors gcra.Cancel.
-- ARGV: stamp_us, wait_ns (gcra.BookedWait), then for each key its limits
-- (see common.lua), what the booking cost it (Booking.Costs, or n) and the
-- debts the booking left on its limits.
local stamp = tonumber(ARGV[1])
local now = now_us()
local el = (now - stamp) * 1000
local begun = el > tonumber(ARGV[2])
local pos = 3
for b = 1, #KEYS do
  local lims, m
  lims, m, pos = read_limits(pos)
  local n = tonumber(ARGV[pos])
  pos = pos + 1
  local d = load(KEYS[b], lims, m, now)
  for i = 1, m do
    local booked = tonumber(ARGV[pos + i - 1])
    if not begun and n > 0 and d[i] > 0 and d[i] + el == booked then
      local left = math.max(d[i] - n * lims[2 * i - 1], 0)
      spend_lead(d, i, -1, d[i] - left)
      d[i] = left
    end
  end
  pos = pos + m
  save(KEYS[b], now, d)
end
return now
