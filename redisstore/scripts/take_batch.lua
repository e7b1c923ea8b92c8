-- fleetrate batch take: independent takes from many callers in one call, at
-- one instant, exactly as if each ran the take script in turn. A key that
-- several takes name is read once and its state carried from one take to
-- the next; every changed key is written once at the end.
-- ARGV: the number of takes, then for each take: its number of keys, n,
-- max_wait_ns, count, then the limits of each of its keys (see common.lua).
-- KEYS: the keys of every take, in order.
-- Returns now_us, then for each take the number of decisions it made and
-- the debts of its keys before it (see take_all).
local now = now_us()
local takes = tonumber(ARGV[1])
local raws = redis.call('MGET', unpack(KEYS))
local pos, kpos = 2, 0
-- key -> its debts, which also record the number of limits they were read
-- for (m), whether the key was missing (absent: MGET cannot tell a missing
-- key from one of another type, so its write must be NX) and whether a take
-- booked them (dirty).
local cache = {}
local out = { now }
-- The current take's buckets; the tables are reused from take to take.
local lims, ms, debts = {}, {}, {}

for _ = 1, takes do
  local nb, n, max_wait, count = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1]), tonumber(ARGV[pos + 2]), tonumber(ARGV[pos + 3])
  pos = pos + 4
  for b = 1, nb do
    kpos = kpos + 1
    local key = KEYS[kpos]
    local m = tonumber(ARGV[pos])
    local l = lims[b]
    if not l then
      l = {}
      lims[b] = l
    end
    for i = 1, 2 * m do l[i] = tonumber(ARGV[pos + i]) end
    pos = pos + 1 + 2 * m
    ms[b] = m
    local d = cache[key]
    if not d then
      d = parse(raws[kpos], m, now)
      d.m, d.absent = m, not raws[kpos]
      cache[key] = d
    elseif d.m ~= m then
      -- Run alone, an earlier take that booked would have written the key
      -- for a different number of limits, which this take reads as full;
      -- one that booked nothing would have left the key as it is.
      if d.dirty then
        save(key, now, d, d.absent)
        d = {}
        for i = 1, m do d[i] = 0 end
      else
        d = load(key, m, now)
      end
      d.m = m
      cache[key] = d
    end
    debts[b] = d
  end
  local k = #out + 1
  out[k] = 0
  append_debts(out, debts, ms, nb)
  local made, booked = take_all(debts, lims, ms, nb, n, max_wait, count)
  out[k] = made
  if booked then
    for b = 1, nb do debts[b].dirty = true end
  end
end

for key, d in pairs(cache) do
  if d.dirty then save(key, now, d, d.absent) end
end
return out
