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
local cache = {} -- key -> {m = limits, d = debts, dirty = written since read}
local out = { now }

for _ = 1, takes do
  local nb, n, max_wait, count = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1]), tonumber(ARGV[pos + 2]), tonumber(ARGV[pos + 3])
  pos = pos + 4
  local lims, ms, debts, entries = {}, {}, {}, {}
  for b = 1, nb do
    kpos = kpos + 1
    local key = KEYS[kpos]
    lims[b], ms[b], pos = read_limits(pos)
    local e = cache[key]
    if not e then
      e = { m = ms[b], d = parse(raws[kpos], ms[b], now), dirty = false }
      cache[key] = e
    elseif e.m ~= ms[b] then
      -- Run alone, an earlier take that booked would have written the key
      -- for a different number of limits, which this take reads as full;
      -- one that booked nothing would have left the key as it is.
      if e.dirty then
        save(key, now, e.d)
        local d = {}
        for i = 1, ms[b] do d[i] = 0 end
        e = { m = ms[b], d = d, dirty = false }
      else
        e = { m = ms[b], d = load(key, ms[b], now), dirty = false }
      end
      cache[key] = e
    end
    debts[b], entries[b] = e.d, e
  end
  local k = #out + 1
  out[k] = 0
  append_debts(out, debts, ms, nb)
  local made, booked = take_all(debts, lims, ms, nb, n, max_wait, count)
  out[k] = made
  if booked then
    for b = 1, nb do entries[b].dirty = true end
  end
end

for key, e in pairs(cache) do
  if e.dirty then save(key, now, e.d) end
end
return out
