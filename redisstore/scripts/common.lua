-- fleetrate: shared helpers, prepended to every script. They mirror the
-- pure Go algorithm in the fleetrate package (gcra.go) line for line.
--
-- A bucket key holds the server time of the last write (its stamp, µs)
-- and, per limit, its debt (ns of TAT beyond the stamp) and the fill time
-- (burst x interval) of the limit it was written for. A bucket of one limit
-- is "g #" and the three as little-endian doubles (see take_one.lua); one
-- of several limits, the string "<stamp_us> <debt_ns> -<fill_ns> ..." (the
-- fill times negated). A one-limit value in that text form (written by an
-- older version) is read too, and so is one without fill times (older
-- still), as it is, without conversion.
-- Every number is an integer below 2^53, exact in Lua's doubles.
--
-- ARGV layout after the operation's own leading arguments: for each key, the
-- number of limits m, then m pairs of (interval_ns, burst), and for a take
-- the bucket's reserve (tokens kept for higher priorities). A bucket's limits
-- are read into one flat table {iv1, burst1, iv2, burst2, ...}, with the
-- reserve of a take in its field r.

if redis.replicate_commands then redis.replicate_commands() end

local MAX_ELAPSE_US = 7776000000000 -- (MaxFillTime + MaxWaitCap) in µs
local TTL_SLACK_MS = 1000

-- '%d' formats an integral double exactly and faster than '%.0f' where
-- Lua's integer format is 64 bits wide (every 64-bit Redis); elsewhere the
-- scripts fall back to '%.0f'.
local INT = '%.0f'
if string.format('%d', 2 ^ 52 + 1) == '4503599627370497' then INT = '%d' end
local INT2 = INT .. ' ' .. INT

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- read_limits parses one bucket's limits starting at ARGV[pos] and returns
-- them (flat), their number, and the position after them.
local function read_limits(pos)
  local m = tonumber(ARGV[pos])
  local lims = {}
  for i = 1, 2 * m do
    lims[i] = tonumber(ARGV[pos + i])
  end
  return lims, m, pos + 1 + 2 * m
end

-- read_take_limits is read_limits for a take: the limits are followed by
-- the bucket's reserve (see fleetrate.Bucket.Reserve), kept in lims.r.
local function read_take_limits(pos)
  local lims, m, nx = read_limits(pos)
  lims.r = tonumber(ARGV[nx])
  return lims, m, nx + 1
end

-- convert returns the debt, under a limit of fill time to (ns), of a
-- bucket that owed debt under a limit of fill time from: the part within
-- the old fill time keeps its fraction of the bucket, the part beyond it
-- (booked ahead) is kept as it is. Mirrors gcra.Convert, with the float
-- operations in the same order so that both give the same integer.
local function convert(debt, from, to)
  if from <= 0 or debt <= 0 then return math.max(debt, 0) end
  if debt > from then return to + (debt - from) end
  return math.min(math.ceil(debt / from * to), to)
end

-- parse returns the debts held in raw (a bucket key's value, or false when
-- the key is missing) refilled up to now and converted to lims (see
-- gcra.State.Elapse). A missing key, or one written for a different number
-- of limits, is a full bucket. The debts table also keeps the limits' fill
-- times in d.f, which save writes beside the debts.
local function parse(raw, lims, m, now)
  local d = {}
  if raw then
    local stamp, vals, n
    if #raw == 27 and string.sub(raw, 1, 3) == 'g #' then
      -- One limit, binary: read as the text "stamp debt -fill".
      local debt, fill
      stamp, debt, fill = struct.unpack('<ddd', raw, 4)
      vals, n = { debt, -fill }, 2
    else
      local sp = string.find(raw, ' ', 1, true)
      stamp = sp and tonumber(string.sub(raw, 1, sp - 1))
      vals, n = {}, 0
      while sp do
        local nx = string.find(raw, ' ', sp + 1, true)
        n = n + 1
        vals[n] = tonumber(string.sub(raw, sp + 1, (nx or 0) - 1))
        sp = nx
      end
    end
    local el = 0
    if stamp and now > stamp then el = math.min(now - stamp, MAX_ELAPSE_US) * 1000 end
    local fills = n == 2 * m
    for i = 2, n, 2 do
      if not fills then break end
      fills = vals[i] < 0 and vals[i - 1] >= 0
    end
    if fills then
      -- "stamp d1 -f1 d2 -f2 ...": debts with their limits' fill times.
      local f = {}
      for i = 1, m do
        d[i] = math.max(vals[2 * i - 1] - el, 0)
        f[i] = -vals[2 * i]
        local to = lims[2 * i] * lims[2 * i - 1]
        if f[i] ~= to then
          d[i] = convert(d[i], f[i], to)
          f[i] = to
        end
      end
      d.f = f
      return d
    end
    local legacy = n == m
    for i = 1, n do
      if vals[i] < 0 then legacy = false end
    end
    if legacy then
      -- Written before fill times were kept: nothing to convert.
      for i = 1, m do d[i] = math.max(vals[i] - el, 0) end
    end
  end
  for i = #d + 1, m do d[i] = 0 end
  local f = {}
  for i = 1, m do f[i] = lims[2 * i] * lims[2 * i - 1] end
  d.f = f
  return d
end

-- load is parse for a key read now.
local function load(key, lims, m, now)
  return parse(redis.call('GET', key), lims, m, now)
end

-- save writes the debts, each with its limit's fill time (binary for one
-- limit; as text, negated, so that a value is never mistaken for one
-- without them, for several), with a TTL of the time
-- until the bucket is full again plus slack; a full bucket is simply
-- deleted. absent says the key was read as missing (see below).
local function save(key, now, d, absent)
  local mx = 0
  for i = 1, #d do
    if d[i] > mx then mx = d[i] end
  end
  if mx <= 0 then
    redis.call('DEL', key)
    return
  end
  local v
  local f = d.f
  if #d == 1 then
    v = 'g #' .. struct.pack('<ddd', now, d[1], f[1])
  else
    local parts = { string.format(INT, now) }
    for i = 1, #d do parts[i + 1] = string.format(INT2, d[i], -f[i]) end
    v = table.concat(parts, ' ')
  end
  local ttl = math.ceil(mx / 1000000) + TTL_SLACK_MS
  if absent then
    -- The key read as missing: NX makes sure it is, so that a key of
    -- another type (which MGET also reads as missing) is an error, as GET
    -- makes it for a single take, and is never overwritten.
    if not redis.call('SET', key, v, 'PX', ttl, 'NX') then
      error({ err = 'WRONGTYPE key ' .. key .. ' holds a value that is not a fleetrate bucket' })
    end
    return
  end
  redis.call('SET', key, v, 'PX', ttl)
end

-- take_all makes count identical, consecutive takes of n tokens at one
-- instant, each all or nothing across buckets 1..nb (debts[b], lims[b] and
-- ms[b] per bucket) and booked up to max_wait ns ahead, updating the debts
-- in place as gcra.Decide does. A bucket's reserve r counts as tokens the
-- take needs beside its n, which it does not book. It stops at the first denial (every
-- later take would be denied the same way) and returns the number of
-- decisions made, that denial included, and whether any tokens were booked.
-- The scripts reply with the debts from before the takes; the client
-- replays the decisions from them with fleetrate.Decide, so the script
-- computes no report of its own.
local function take_all(debts, lims, ms, nb, n, max_wait, count)
  local made, booked = 0, false
  for _ = 1, count do
    local need = nil
    for b = 1, nb do
      local d, l = debts[b], lims[b]
      local nr = n + l.r
      for i = 1, ms[b] do
        local w = d[i] - (l[2 * i] - nr) * l[2 * i - 1]
        if need == nil or w > need then need = w end
      end
    end
    made = made + 1
    local wait = math.max(need, 0)
    if wait > max_wait then break end
    if n > 0 then
      booked = true
      for b = 1, nb do
        local d, l = debts[b], lims[b]
        for i = 1, ms[b] do d[i] = math.max(d[i], wait) + n * l[2 * i - 1] end
      end
    end
  end
  return made, booked
end

-- append_debts appends the debts of buckets 1..nb to out.
local function append_debts(out, debts, ms, nb)
  local k = #out
  for b = 1, nb do
    local d = debts[b]
    for i = 1, ms[b] do
      k = k + 1
      out[k] = d[i]
    end
  end
end
