-- fleetrate batch take: independent takes from many callers in one call, at
-- one instant, exactly as if each ran the take script in turn. A key that
-- several takes name is read once and its state carried from one take to
-- the next; every changed key is written once at the end.
-- ARGV: the number of shapes, then each shape: its number of keys, n,
-- max_wait_ns, count, then the limits and the reserve of each of its keys
-- (see common.lua);
-- then one argument per take, the number of its shape (from 1). Takes of
-- one limiter share a shape, so a take costs Redis one argument and its
-- keys, not its limits again.
-- KEYS: the keys of every take, in order.
-- Returns now_us, then for each take the number of decisions it made and
-- the debts of its keys before it (see take_all).
local now = now_us()
local raws = redis.call('MGET', unpack(KEYS))
local shapes, pos = {}, 2
for s = 1, tonumber(ARGV[1]) do
  local nb = tonumber(ARGV[pos])
  local sh = { nb = nb, n = tonumber(ARGV[pos + 1]), max_wait = tonumber(ARGV[pos + 2]), count = tonumber(ARGV[pos + 3]), lims = {}, ms = {} }
  pos = pos + 4
  for b = 1, nb do
    sh.lims[b], sh.ms[b], pos = read_take_limits(pos)
  end
  shapes[s] = sh
end
-- key -> its debts, which also record the number of limits they were read
-- for (m), whether the key was missing (absent: MGET cannot tell a missing
-- key from one of another type, so its write must be NX) and whether a take
-- booked them (dirty).
local cache = {}
local out = { now }
local debts = {} -- the current take's, reused from take to take
local kpos = 0

for t = pos, #ARGV do
  local sh = shapes[tonumber(ARGV[t])]
  local nb, ms = sh.nb, sh.ms
  local copies = {} -- bucket -> key, for debts converted for this take alone
  for b = 1, nb do
    kpos = kpos + 1
    local key, m = KEYS[kpos], ms[b]
    local lims = sh.lims[b]
    local d = cache[key]
    if not d then
      d = parse(raws[kpos], lims, m, now)
      d.m, d.absent = m, not raws[kpos]
      cache[key] = d
    else
      local same = d.m == m
      for i = 1, m do
        if not same then break end
        same = d.f[i] == lims[2 * i] * lims[2 * i - 1]
      end
      if not same then
        -- Other limits for the same key (another limiter's config): run
        -- alone, this take would read what the last take that booked
        -- wrote, or the stored value, and carry it over (see parse), and
        -- keep that only if it booked.
        if d.dirty then
          local cp = parse(encode(now, d) or false, lims, m, now)
          cp.m, cp.absent, cp.dirty = m, d.absent, true
          copies[b] = key
          d = cp
        else
          d = load(key, lims, m, now)
          d.m = m
          cache[key] = d
        end
      end
    end
    debts[b] = d
  end
  local k = #out + 1
  out[k] = 0
  append_debts(out, debts, ms, nb)
  local made, booked = take_all(debts, sh.lims, ms, nb, sh.n, sh.max_wait, sh.count, now)
  out[k] = made
  if booked then
    for b = 1, nb do
      debts[b].dirty = true
      if copies[b] then cache[copies[b]] = debts[b] end
    end
  end
end

for key, d in pairs(cache) do
  if d.dirty then save(key, now, d, d.absent) end
end
return out
