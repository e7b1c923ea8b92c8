-- fleetrate refund: return n tokens to every bucket in KEYS, capped at the
-- burst. ARGV: n, then the limits of each key (see common.lua).
local n = tonumber(ARGV[1])
local now = now_us()
local pos = 2
for b = 1, #KEYS do
  local lims, m
  lims, m, pos = read_limits(pos)
  local d = load(KEYS[b], lims, m, now)
  for i = 1, m do d[i] = math.max(d[i] - n * lims[2 * i - 1], 0) end
  save(KEYS[b], now, d)
end
return now
