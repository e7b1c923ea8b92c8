-- fleetrate take: an all-or-nothing take of n tokens from every bucket in
-- KEYS, booked up to max_wait ns ahead. ARGV: n, max_wait_ns, then the
-- limits of each key (see common.lua).
-- Returns {allowed, remaining, wait_ns, retry_ns, reset_ns, bucket, limit, now_us}
-- with bucket and limit 0-based.
local n = tonumber(ARGV[1])
local max_wait = tonumber(ARGV[2])
local now = now_us()

local lims, debts = {}, {}
local need, wb, wl = nil, 1, 1
local pos = 3
for b = 1, #KEYS do
  lims[b], pos = read_limits(pos)
  local d = load(KEYS[b], #lims[b], now)
  debts[b] = d
  for i, l in ipairs(lims[b]) do
    local w = d[i] + n * l[1] - l[2] * l[1]
    if need == nil or w > need then need, wb, wl = w, b, i end
  end
end

local wait = math.max(need, 0)
local allowed = 0
if wait <= max_wait then
  allowed = 1
  if n > 0 then
    for b = 1, #KEYS do
      local d = debts[b]
      for i, l in ipairs(lims[b]) do d[i] = math.max(d[i], wait) + n * l[1] end
      save(KEYS[b], now, d)
    end
  end
end

local remaining, reset = nil, 0
for b = 1, #KEYS do
  for i, l in ipairs(lims[b]) do
    local d = debts[b][i]
    local tokens = 0
    local left = l[2] * l[1] - d
    if left > 0 then tokens = idiv(left, l[1]) end
    if remaining == nil or tokens < remaining then
      remaining = tokens
      if allowed == 1 then wb, wl = b, i end
    end
    if d > reset then reset = d end
  end
end

if allowed == 1 then
  return { 1, remaining, wait, 0, reset, wb - 1, wl - 1, now }
end
return { 0, remaining, 0, wait, reset, wb - 1, wl - 1, now }
