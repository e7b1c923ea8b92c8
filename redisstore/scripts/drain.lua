-- fleetrate drain: empty each bucket in KEYS until its own d ns from now;
-- it then refills from empty. A void drain also voids what was booked
-- beyond: the bucket is empty until now + d and no longer. ARGV, for each
-- key: d_ns, void (1 or 0), then its limits (see common.lua).
local now = now_us()
local pos = 1
for b = 1, #KEYS do
  local dur, void = tonumber(ARGV[pos]), ARGV[pos + 1] == '1'
  local lims, m
  lims, m, pos = read_limits(pos + 2)
  local d = load(KEYS[b], lims, m, now)
  for i = 1, m do
    local f = lims[2 * i] * lims[2 * i - 1]
    local empty = grain(dur, f) + f
    note_lead(d, i, 0)
    if void then d[i] = empty else d[i] = math.max(d[i], empty) end
  end
  save(KEYS[b], now, d)
end
return now
