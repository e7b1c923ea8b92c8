-- fleetrate take with costs by bucket or in-flight permits: one take, all
-- or nothing across every bucket and every bound, at one instant. It
-- mirrors gcra's decide (tokens: needs and book, as take_all does for a
-- cost per bucket; permits: admit, enqueue and grant) with the helpers of
-- common.lua and permits.lua.
-- ARGV: nb (the bucket keys are KEYS[1..nb]), max_wait_ns, the permit id
-- ('' for none), its ttl_us, then for each bucket its limits and reserve
-- (see common.lua), its cost, its in-flight bound (0: none) and permit
-- reserve (its priority class: Bucket.PermitReserve), its number of
-- calendar quotas and for each its field (the period), window start and
-- end (µs) and count. After the bucket keys, KEYS holds the three permit
-- keys (h, q, w: see permits.lua) of each bucket with a bound, in order,
-- then the quota key of each bucket with quotas, in order.
-- Returns {now_us, 1, the debts of each bucket before the take, then for
-- each bucket with a bound held, mine, place, qlen, first, qfirst and
-- eligible before the take (see view), then each quota's use in its window before
-- the take, then the decision: 0 denied, 1 granted, 2 queued}; or
-- {now_us, 3} when a quota's window does not hold now. The client replays
-- the decision with gcra.Decide and checks it.
local nb = tonumber(ARGV[1])
local max_wait = tonumber(ARGV[2])
local id = ARGV[3]
local ttl = tonumber(ARGV[4])
local now = now_us()

local lims, ms, debts, bounds, preserves, pk, quotas = {}, {}, {}, {}, {}, {}, {}
local pos, k = 5, nb
for b = 1, nb do
  lims[b], ms[b], pos = read_take_limits(pos)
  lims[b].c, bounds[b], preserves[b] = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1]), tonumber(ARGV[pos + 2])
  local nq = tonumber(ARGV[pos + 3])
  pos = pos + 4
  quotas[b] = {}
  for i = 1, nq do
    quotas[b][i] = { field = ARGV[pos], start = tonumber(ARGV[pos + 1]), stop = tonumber(ARGV[pos + 2]), count = tonumber(ARGV[pos + 3]) }
    pos = pos + 4
  end
  debts[b] = load(KEYS[b], lims[b], ms[b], now)
  if bounds[b] > 0 then
    pk[b] = k
    k = k + 3
  end
end

-- Quotas: each bucket with quotas has one hash key after the permit keys,
-- a field per period holding "<window start> <used>". The client sent the
-- window it computed for its own clock; on this server's clock it may be
-- another one (near a boundary): then the reply is {now, 3}, and the
-- client sends the windows of now.
local qk = {}
for b = 1, nb do
  local qs = quotas[b]
  if #qs > 0 then
    k = k + 1
    qk[b] = KEYS[k]
    for i = 1, #qs do
      local q = qs[i]
      if now < q.start or now >= q.stop then return { now, 3 } end
      q.used = 0
      local v = redis.call('HGET', qk[b], q.field)
      if v then
        local st, used = string.match(v, '^(%d+) (%d+)$')
        if tonumber(st) == q.start then q.used = tonumber(used) end
      end
    end
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
    local v = view(h, q, w, bounds[b], id, preserves[b])
    views[b] = v
    local mine = 0
    if v.mine then mine = 1 end
    local o = #out
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6], out[o + 7] = v.held, mine, v.place, v.qlen, v.first, v.qfirst, v.eligible
    if id ~= '' and not blocked and not admits(v, bounds[b], preserves[b]) then blocked = b end
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

-- A quota that does not admit the take's cost refuses it, whatever its
-- max wait: a quota is not booked ahead.
local refused = false
for b = 1, nb do
  local qs = quotas[b]
  for i = 1, #qs do
    local o = #out
    out[o + 1] = qs[i].used
    if lims[b].c > 0 and qs[i].used + lims[b].c > qs[i].count then refused = true end
  end
end

local decision = 0
if refused or wait > max_wait then
  decision = 0
elseif blocked then
  if max_wait > 0 then
    -- Wait in the queue of every bound that does not admit id.
    decision = 2
    for b = 1, nb do
      if bounds[b] > 0 then
        local v = views[b]
        if b == blocked or not admits(v, bounds[b], preserves[b]) then
          local q, w = KEYS[pk[b] + 2], KEYS[pk[b] + 3]
          enqueue(q, w, v, id, exp, preserves[b])
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
      note_takes(d, l, ms[b], now, wait)
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
  for b = 1, nb do
    local qs = quotas[b]
    if #qs > 0 and lims[b].c > 0 then
      local last = 0
      for i = 1, #qs do
        local q = qs[i]
        redis.call('HSET', qk[b], q.field, string.format('%d %d', q.start, q.used + lims[b].c))
        last = math.max(last, q.stop)
      end
      redis.call('PEXPIRE', qk[b], math.max(math.ceil((last - now) / 1000), 0) + TTL_SLACK_MS)
    end
  end
end
out[#out + 1] = decision
return out
