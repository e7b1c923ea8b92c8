-- fleetrate settle: adjust a grant to what its work really cost, bucket by
-- bucket (gcra.Settle): a bucket charged less than its cost gets back the
-- more of what refund.lua gives back of a grant made at at_us and of the
-- difference up to the least lead of the takes after the grant (its slot,
-- at_us, names it: see least_lead), and the leads after it are lowered by
-- what went back; one charged more owes the difference at once, each
-- limit's debt growing by (actual - cost) intervals, at most to its fill
-- time plus the longest wait (gcra.MaxDebt), and records the debt it grew
-- from as a lead (0 when capped).
-- ARGV: at_us, then for each key its limits and reserve (see common.lua),
-- its cost and its actual cost.
-- actual is at most a burst (validated), so the growth is at most a fill
-- time f and the sum at most 2f + MAX_WAIT_NS before the cap f +
-- MAX_WAIT_NS: exact below 2^53 for a limit up to COARSE_NS, and in whole
-- µs (an interval of whole µs) below 2^56 for a coarser one.
local at = tonumber(ARGV[1])
local now = now_us()
-- Clamped as in refund.lua.
local el = math.min(math.max(now - at, 0), REFUND_HORIZON_US) * 1000
local pos = 2
for b = 1, #KEYS do
  local lims, m
  lims, m, pos = read_take_limits(pos)
  local cost, actual = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1])
  pos = pos + 2
  local d = load(KEYS[b], lims, m, now)
  for i = 1, m do
    local iv, burst = lims[2 * i - 1], lims[2 * i]
    if actual < cost then
      local n = cost - actual
      local r = math.min(math.max(lims.r, 0), burst)
      local back = 0
      if d[i] > 0 and d[i] <= (burst - r) * iv then
        back = math.max(math.min(math.min(n, burst) * iv - el, d[i]), 0)
      end
      if d.l then
        back = math.max(back, math.min(math.min(n, burst) * iv, least_lead(d, i, at), d[i]))
      end
      if back > 0 then
        d[i] = d[i] - back
        spend_lead(d, i, at, back)
      end
    elseif actual > cost then
      local cap = burst * iv + MAX_WAIT_NS
      local grown = d[i] + (actual - cost) * iv
      if grown > cap then note_lead(d, i, 0) else note_lead(d, i, d[i]) end
      d[i] = math.min(grown, cap)
    end
  end
  save(KEYS[b], now, d)
end
return now
