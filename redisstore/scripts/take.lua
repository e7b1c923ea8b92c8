-- fleetrate take: count identical, consecutive takes of n tokens, each all
-- or nothing across every bucket in KEYS and booked up to max_wait ns ahead,
-- at one instant (see take_all in common.lua). The store sends count 1
-- (shared calls use take_batch.lua); the benchmark's ceiling runs it too.
-- ARGV: n, max_wait_ns, count, then the limits and the reserve of each key
-- (see common.lua).
-- Returns {now_us, decisions made, the debts of each key before the takes}.
local n = tonumber(ARGV[1])
local max_wait = tonumber(ARGV[2])
local count = tonumber(ARGV[3])
local now = now_us()

local lims, ms, debts = {}, {}, {}
local pos = 4
for b = 1, #KEYS do
  lims[b], ms[b], pos = read_take_limits(pos)
  debts[b] = load(KEYS[b], lims[b], ms[b], now)
end

local out = { now, 0 }
append_debts(out, debts, ms, #KEYS)
local made, booked = take_all(debts, lims, ms, #KEYS, n, max_wait, count, now)
out[2] = made
if booked then
  for b = 1, #KEYS do save(KEYS[b], now, debts[b]) end
end
return out
