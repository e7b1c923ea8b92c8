-- fleetrate take with costs by bucket or in-flight permits: one take, all
-- or nothing across every bucket and every bound, at one instant. It
-- mirrors gcra's decide (tokens: needs and book, as take_all does for a
-- cost per bucket; permits: admit, enqueue and grant) with the helpers of
-- common.lua and permits.lua.
-- ARGV: nb (the bucket keys are KEYS[1..nb]), max_wait_ns, the permit id
-- ('' for none), its ttl_us, then for each bucket its limits and reserve
-- (see common.lua), its cost and its in-flight bound (0: none). After the
-- bucket keys, KEYS holds the three permit keys (h, q, w: see
-- permits.lua) of each bucket with a bound, in order.
-- Returns {now_us, 1, the debts of each bucket before the take, then for
-- each bucket with a bound held, mine, place, qlen, first and qfirst
-- before the take (see view), then the decision: 0 denied, 1 granted, 2 queued}. The
-- client replays the decision with gcra.Decide and checks it.
local nb = tonumber(ARGV[1])
local max_wait = tonumber(ARGV[2])
local id = ARGV[3]
local ttl = tonumber(ARGV[4])
local now = now_us()

local lims, ms, debts, bounds, pk = {}, {}, {}, {}, {}
local pos, k = 5, nb
for b = 1, nb do
  lims[b], ms[b], pos = read_take_limits(pos)
  lims[b].c, bounds[b] = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1])
  pos = pos + 2
  debts[b] = load(KEYS[b], lims[b], ms[b], now)
  if bounds[b] > 0 then
    pk[b] = k
    k = k + 3
  end
end

local out = { now, 1 }
append_debts(out, debts, ms, nb)

-- Permits: expire every bound's leases, and find the first that has no
-- permit free for id.
local views, blocked = {}, nil
for b = 1, nb do
  if bounds[b] > 0 then
    local h, q, w = KEYS[pk[b] + 1], KEYS[pk[b] + 2], KEYS[pk[b] + 3]
    expire(h, q, w, now)
    local v = view(h, q, w, bounds[b], id)
    views[b] = v
    local mine = 0
    if v.mine then mine = 1 end
    local o = #out
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = v.held, mine, v.place, v.qlen, v.first, v.qfirst
    if id ~= '' and not blocked and not admits(v, bounds[b]) then blocked = b end
  end
end

-- Tokens: the wait of the take, as take_all computes it with each
-- bucket's own cost.
local need = nil
for b = 1, nb do
  local d, l = debts[b], lims[b]
  local nr = l.c + l.r
  for i = 1, ms[b] do
    local wt = d[i] - (l[2 * i] - nr) * l[2 * i - 1]
    if need == nil or wt > need then need = wt end
  end
end
local wait = math.max(need, 0)
local exp = now + ttl

local decision = 0
if wait > max_wait then
  decision = 0
elseif blocked then
  if max_wait > 0 then
    -- Wait in the queue of every bound that does not admit id.
    decision = 2
    for b = 1, nb do
      if bounds[b] > 0 then
        local v = views[b]
        if b == blocked or not admits(v, bounds[b]) then
          local q, w = KEYS[pk[b] + 2], KEYS[pk[b] + 3]
          enqueue(q, w, v, id, exp)
          keep(KEYS[pk[b] + 1], q, w, now)
        end
      end
    end
  end
else
  decision = 1
  local booked = false
  for b = 1, nb do
    local l = lims[b]
    if l.c > 0 then
      booked = true
      local d = debts[b]
      for i = 1, ms[b] do d[i] = math.max(d[i], wait) + l.c * l[2 * i - 1] end
    end
    if bounds[b] > 0 and id ~= '' then
      local h, q, w = KEYS[pk[b] + 1], KEYS[pk[b] + 2], KEYS[pk[b] + 3]
      grant(h, q, w, views[b], id, exp)
      keep_held(h, now)
    end
  end
  if booked then
    for b = 1, nb do save(KEYS[b], now, debts[b]) end
  end
end
out[#out + 1] = decision
return out
