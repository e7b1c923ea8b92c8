-- fleetrate take: count identical, consecutive takes of n tokens, each all
-- or nothing across every bucket in KEYS and booked up to max_wait ns ahead,
-- at one instant. count is 1 for a plain take; more when concurrent callers
-- of one hot bucket are folded into one call. The takes stop at the first
-- denial (every later one would be denied the same way).
-- ARGV: n, max_wait_ns, count, then the limits of each key (see common.lua).
-- Returns 8 integers per decision made:
-- {allowed, remaining, wait_ns, retry_ns, reset_ns, bucket, limit, now_us},
-- bucket and limit 0-based.
local n = tonumber(ARGV[1])
local max_wait = tonumber(ARGV[2])
local count = tonumber(ARGV[3])
local now = now_us()

local lims, ms, debts = {}, {}, {}
local pos = 4
for b = 1, #KEYS do
  lims[b], ms[b], pos = read_limits(pos)
  debts[b] = load(KEYS[b], ms[b], now)
end

local out = {}
local booked = false
for _ = 1, count do
  local need, wb, wl = nil, 1, 1
  for b = 1, #KEYS do
    local d, l = debts[b], lims[b]
    for i = 1, ms[b] do
      local iv = l[2 * i - 1]
      local w = d[i] - (l[2 * i] - n) * iv
      if need == nil or w > need then need, wb, wl = w, b, i end
    end
  end

  local wait = math.max(need, 0)
  local allowed = 0
  if wait <= max_wait then
    allowed = 1
    if n > 0 then
      booked = true
      for b = 1, #KEYS do
        local d, l = debts[b], lims[b]
        for i = 1, ms[b] do d[i] = math.max(d[i], wait) + n * l[2 * i - 1] end
      end
    end
  end

  local remaining, reset = nil, 0
  for b = 1, #KEYS do
    local l = lims[b]
    for i = 1, ms[b] do
      local d, iv = debts[b][i], l[2 * i - 1]
      local tokens = 0
      local left = l[2 * i] * iv - d
      if left > 0 then tokens = idiv(left, iv) end
      if remaining == nil or tokens < remaining then
        remaining = tokens
        if allowed == 1 then wb, wl = b, i end
      end
      if d > reset then reset = d end
    end
  end

  local k = #out
  if allowed == 1 then
    out[k + 1], out[k + 2], out[k + 3], out[k + 4] = 1, remaining, wait, 0
  else
    out[k + 1], out[k + 2], out[k + 3], out[k + 4] = 0, remaining, 0, wait
  end
  out[k + 5], out[k + 6], out[k + 7], out[k + 8] = reset, wb - 1, wl - 1, now
  if allowed == 0 then break end
end

if booked then
  for b = 1, #KEYS do save(KEYS[b], now, debts[b]) end
end
return out
