-- fleetrate drain: empty every bucket in KEYS until d ns from now; it then
-- refills from empty. ARGV: d_ns, then the limits of each key (see
-- common.lua).
local dur = tonumber(ARGV[1])
local now = now_us()
local pos = 2
for b = 1, #KEYS do
  local lims
  lims, pos = read_limits(pos)
  local d = load(KEYS[b], #lims, now)
  for i, l in ipairs(lims) do d[i] = math.max(d[i], dur + l[2] * l[1]) end
  save(KEYS[b], now, d)
end
return now
