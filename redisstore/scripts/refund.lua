-- fleetrate refund: return n tokens to every bucket in KEYS, capped at the
-- burst. ARGV: n, then the limits of each key (see common.lua).
local n = tonumber(ARGV[1])
local now = now_us()
local pos = 2
for b = 1, #KEYS do
  local lims
  lims, pos = read_limits(pos)
  local d = load(KEYS[b], #lims, now)
  for i, l in ipairs(lims) do d[i] = math.max(d[i] - n * l[1], 0) end
  save(KEYS[b], now, d)
end
return now
