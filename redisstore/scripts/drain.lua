-- fleetrate drain: empty every bucket in KEYS until d ns from now; it then
-- refills from empty. ARGV: d_ns, then the limits of each key (see
-- common.lua).
local dur = tonumber(ARGV[1])
local now = now_us()
local pos = 2
for b = 1, #KEYS do
  local lims, m
  lims, m, pos = read_limits(pos)
  local d = load(KEYS[b], lims, m, now)
  for i = 1, m do
    local f = lims[2 * i] * lims[2 * i - 1]
    d[i] = math.max(d[i], grain(dur, f) + f)
  end
  save(KEYS[b], now, d)
end
return now
