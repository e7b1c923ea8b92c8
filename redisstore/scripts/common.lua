-- fleetrate: shared helpers, prepended to every script. They implement the
-- pure Go algorithm of package gcra with the same integer arithmetic, so
-- that they give the same answers: convert, refill and carried mirror the
-- gcra functions of those names, take_all the decision of gcra.Decide.
-- They are not a line-for-line copy: they read and write the state in the
-- encodings below, not as gcra.State, and report no decision (see
-- take_all); take_one.lua has its own path for a one-limit take.
--
-- A bucket key holds the server time of the last write (its stamp, µs)
-- and, per limit, its debt (ns of TAT beyond the stamp) and the fill time
-- (burst x interval) of the limit it was written for, then each limit's
-- leads (gcra.Lead, see note_takes). A bucket of one limit is "g %" and
-- the seven as little-endian doubles (see take_one.lua; "g &" adds the
-- anchor and horizon before the leads); one of several limits, the string
-- "<stamp_us> <debt_ns> -<fill_ns> ... L <leads> ..." (the fill times
-- negated). Values without leads ("g #", "g $", text without " L ", as
-- older versions wrote them) are read as knowing none. A one-limit value
-- in the text form (written by an older version) is read too, and so is
-- one without fill times (older still), as it is, without conversion.
-- Every number is an integer below 2^53, exact in Lua's doubles, but the
-- debts and fill times of a limit whose fill time exceeds COARSE_NS:
-- those are whole microseconds below 2^56, exact too (see grain).
--
-- ARGV layout after the operation's own leading arguments: for each key, the
-- number of limits m, then m pairs of (interval_ns, burst), and for a take
-- the bucket's reserve (tokens kept for higher priorities). A bucket's limits
-- are read into one flat table {iv1, burst1, iv2, burst2, ...}, with the
-- reserve of a take in its field r.

if redis.replicate_commands then redis.replicate_commands() end

local MAX_ELAPSE_US = 65750400000000 -- (MaxFillTime + MaxWaitCap) in µs
local COARSE_NS = 5184000000000000 -- fleetrate.CoarseFillTime in ns
local MAX_ANCHOR_AGE_US = 604800000000 -- gcra.MaxAnchorAge
local REFUND_HORIZON_US = 63158400000001 -- MaxFillTime in µs, plus 1
local MAX_WAIT_NS = 2592000000000000 -- fleetrate.MaxWaitCap in ns
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

-- grain returns x (ns, not negative) as a debt of a limit of fill time f
-- may hold it: whole µs (rounded up) when f exceeds COARSE_NS. Mirrors
-- gcra's grain; x is exact (below 2^53, or whole µs below 2^56), and so
-- are x - r and the result.
local function grain(x, f)
  if f <= COARSE_NS then return x end
  local r = math.fmod(x, 1000) -- exact; Lua 5.1's % is not above 2^53
  if r > 0 then return x - r + 1000 end
  return x
end

-- div_floor returns the whole part of x / q for x >= 0 and q > 0, exact
-- for x below 2^53 or whole µs below 2^56 (a float division alone may
-- round across an integer).
local function div_floor(x, q)
  return (x - math.fmod(x, q)) / q
end

-- Leads (gcra.Lead): a bucket's debts table keeps, in d.l, four numbers a
-- limit (flat: start, min, prev_start, prev_min of limit i at 4i-3..4i),
-- or nil when it knows none. They are written after the debts: in the
-- one-limit binary values "g %" (stamp, debt, fill and the four) and
-- "g &" (anchored: the anchor and horizon, then the four), and in the
-- text form after " L". A value without them knows none.

-- epoch_us mirrors gcra's epochUS: twice the fill time f (ns), in µs.
local function epoch_us(f)
  return math.max(div_floor(f, 500), 1)
end

-- forget_leads mirrors gcra's State.forget: both epochs of every limit
-- begin beyond every grant booked on the bucket, whose TAT is at most the
-- largest of its k debts (ns, in debts) from now, with no lead.
local function forget_leads(d, m, now, debts, k)
  local debt = 0
  for i = 1, k do
    if debts[i] > debt then debt = debts[i] end
  end
  local start = now + div_floor(debt + 999, 1000) + 1
  local l = {}
  for i = 1, m do
    l[4 * i - 3], l[4 * i - 2], l[4 * i - 1], l[4 * i] = start, 0, start, 0
  end
  d.l = l
end

-- note_takes mirrors gcra's State.noteTakes: before a take wait ns from
-- now books the m limits of lims, record each limit's lead (its debt less
-- the wait), starting a summary that knows nothing when there is none.
local function note_takes(d, lims, m, now, wait)
  if not d.l then
    forget_leads(d, m, now, d, m)
  end
  local at, l = now + div_floor(wait, 1000), d.l
  for i = 1, m do
    local f = lims[2 * i] * lims[2 * i - 1]
    local lead = math.min(math.max(d[i] - grain(wait, f), 0), f)
    local k = 4 * i - 3
    if at - l[k] >= epoch_us(f) then
      l[k + 2], l[k + 3] = l[k], math.min(l[k + 1], lead)
      l[k], l[k + 1] = at, f
    else
      l[k + 1] = math.min(l[k + 1], lead)
    end
  end
end

-- spend_lead mirrors gcra's Lead.spend for limit i of d after a give-back
-- of back ns for a grant of key at (µs; -1: unknown).
local function spend_lead(d, i, at, back)
  local l = d.l
  if not l then return end
  local k = 4 * i - 3
  l[k + 1] = math.max(l[k + 1] - back, 0)
  if at < l[k] then l[k + 3] = math.max(l[k + 3] - back, 0) end
end

-- note_lead mirrors gcra's Lead.note: an operation of lead lead (ns) on
-- limit i.
local function note_lead(d, i, lead)
  local l = d.l
  if not l then return end
  l[4 * i - 2] = math.min(l[4 * i - 2], math.max(lead, 0))
end

-- least_lead mirrors gcra's Lead.least for limit i of d (0 with none).
local function least_lead(d, i, at)
  local l = d.l
  if not l then return 0 end
  local k = 4 * i - 3
  if at >= l[k] then return l[k + 1] end
  if at >= l[k + 2] then return math.min(l[k + 1], l[k + 3]) end
  return 0
end

-- convert returns the debt, under a limit of fill time to (ns), of a
-- bucket that owed debt under a limit of fill time from: the part within
-- the old fill time keeps its fraction of the bucket, the part beyond it
-- (booked ahead) is kept as it is. Mirrors gcra.Convert, with the float
-- operations in the same order so that both give the same integer.
local function convert(debt, from, to)
  if from <= 0 or debt <= 0 then return math.max(debt, 0) end
  if debt > from then return to + grain(debt - from, to) end
  return grain(math.min(math.ceil(debt / from * to), to), to)
end

-- refill returns the debt, under a limit of fill time to, of a bucket
-- that owed debt under a limit of fill time from el ns ago: refilled in
-- the terms of the slower of the two (the longer fill time), and
-- converted. Mirrors gcra's refill.
local function refill(debt, from, to, el)
  if from >= to then return convert(math.max(debt - el, 0), from, to) end
  return math.max(convert(debt, from, to) - el, 0)
end

-- carried returns, for each limit j of fill time fills[j] (1..m), the
-- index of the limit of fill time old[i] (1..k) whose debt it carries
-- over, or 0 for none (it starts full): first the limit of the same fill
-- time, then, in order, the limits left on either side. Mirrors gcra's
-- carried.
local function carried(old, k, fills, m)
  local idx, used = {}, {}
  for j = 1, m do
    idx[j] = 0
    if j <= k and old[j] == fills[j] and not used[j] then
      idx[j], used[j] = j, true
    else
      for i = 1, k do
        if old[i] == fills[j] and not used[i] then
          idx[j], used[i] = i, true
          break
        end
      end
    end
  end
  local nx = 1
  for j = 1, m do
    if idx[j] == 0 then
      while nx <= k and used[nx] do nx = nx + 1 end
      if nx > k then break end
      idx[j], used[nx] = nx, true
    end
  end
  return idx
end

-- numbers reads the space-separated numbers of raw after the space at sp
-- (none when sp is nil), and their count.
local function numbers(raw, sp)
  local out, k = {}, 0
  while sp do
    local nx = string.find(raw, ' ', sp + 1, true)
    k = k + 1
    out[k] = tonumber(string.sub(raw, sp + 1, (nx or 0) - 1))
    sp = nx
  end
  return out, k
end

-- parse returns the debts held in raw (a bucket key's value, or false when
-- the key is missing) refilled up to now and converted to lims (see
-- gcra.State.Elapse). A missing key is a full bucket; one written for
-- other limits carries each limit's debt over (see carried); one without
-- fill times and of another number of limits is a full bucket. The debts
-- table also keeps the limits' fill times in d.f, the anchor to write
-- (gcra.State.Anchor, 0 for none) in d.a and the leads in d.l (nil for
-- none: a full bucket, one converted knows none beyond its old slots),
-- which save writes beside them.
local function parse(raw, lims, m, now)
  local d = {}
  local anchor, horizon = 0, 0
  if raw then
    local stamp, vals, n
    local leads -- the leads written (see note_takes), or nil
    local tag = string.sub(raw, 1, 3)
    if #raw == 27 and tag == 'g #' then
      -- One limit, binary: read as the text "stamp debt -fill".
      local debt, fill
      stamp, debt, fill = struct.unpack('<ddd', raw, 4)
      vals, n = { debt, -fill }, 2
    elseif #raw == 43 and tag == 'g $' then
      -- One limit, binary, anchored: "stamp debt -fill" and the anchor
      -- and horizon.
      local debt, fill
      stamp, debt, fill, anchor, horizon = struct.unpack('<ddddd', raw, 4)
      vals, n = { debt, -fill }, 2
    elseif #raw == 59 and tag == 'g %' then
      -- One limit, binary, with leads.
      local debt, fill
      leads = {}
      stamp, debt, fill, leads[1], leads[2], leads[3], leads[4] = struct.unpack('<ddddddd', raw, 4)
      vals, n = { debt, -fill }, 2
    elseif #raw == 75 and tag == 'g &' then
      -- One limit, binary, anchored, with leads.
      local debt, fill
      leads = {}
      stamp, debt, fill, anchor, horizon, leads[1], leads[2], leads[3], leads[4] = struct.unpack('<ddddddddd', raw, 4)
      vals, n = { debt, -fill }, 2
    else
      local lp = string.find(raw, ' L ', 1, true)
      if lp then
        -- "... L s1 m1 p1 q1 ...": the leads.
        leads = numbers(raw, lp + 2)
        raw = string.sub(raw, 1, lp - 1)
      end
      local sp = string.find(raw, ' ', 1, true)
      stamp = sp and tonumber(string.sub(raw, 1, sp - 1))
      vals, n = numbers(raw, sp)
      if n >= 4 and n % 2 == 0 and vals[2] < 0 and vals[n - 1] > 0 and vals[n] > 0 then
        -- "stamp d1 -f1 ... anchor horizon": anchored.
        anchor, horizon = vals[n - 1], vals[n]
        vals[n - 1], vals[n], n = nil, nil, n - 2
      end
    end
    local el = 0
    if stamp and now > stamp then el = math.min(now - stamp, MAX_ELAPSE_US) * 1000 end
    if anchor ~= 0 and (now >= horizon or now - anchor > MAX_ANCHOR_AGE_US) then anchor, horizon = 0, 0 end
    local fills = n > 0 and n % 2 == 0
    for i = 2, n, 2 do
      if not fills then break end
      fills = vals[i] < 0 and vals[i - 1] >= 0
    end
    if fills then
      -- "stamp d1 -f1 d2 -f2 ...": debts with their limits' fill times.
      local k = n / 2
      local od, of = {}, {}
      for i = 1, k do
        od[i], of[i] = vals[2 * i - 1], -vals[2 * i]
      end
      local f = {}
      local same = k == m
      for j = 1, m do
        f[j] = lims[2 * j] * lims[2 * j - 1]
        if f[j] ~= of[j] then same = false end
      end
      -- Full in its own terms (see gcra.State.Elapse), when it converts.
      local full = not same and anchor == 0
      for i = 1, k do
        if not full then break end
        full = od[i] <= el
      end
      if same then
        local full = true
        for j = 1, m do
          d[j] = math.max(od[j] - el, 0)
          if d[j] > 0 then full = false end
        end
        -- A full bucket is an absent one: no leads (see gcra's Elapse).
        if leads and #leads == 4 * m and not full then d.l = leads end
      else
        -- Converted: another chain's debts, whose grants get nothing
        -- back by leads (see gcra's State.carry).
        forget_leads(d, m, now, od, k)
      end
      if same then
      elseif full then
        for j = 1, m do d[j] = 0 end
      else
        local idx = carried(of, k, f, m)
        local shorter, longer = false, false
        for j = 1, m do
          local i = idx[j]
          d[j] = 0
          if i > 0 then
            if of[i] > f[j] then shorter = true elseif of[i] < f[j] then longer = true end
            if of[i] < f[j] and anchor ~= 0 and anchor < stamp then
              -- Refill from the anchor (see gcra.State.Elapse).
              local ael = math.max(math.min(now - anchor, MAX_ELAPSE_US), 0) * 1000
              d[j] = refill(od[i] + (stamp - anchor) * 1000, of[i], f[j], ael)
            else
              d[j] = refill(od[i], of[i], f[j], el)
            end
          end
        end
        if shorter and anchor == 0 then
          -- Anchored at the longer limits' state (not full: see above)
          -- until it would have been full again (see gcra.State.Anchor).
          local mx = 0
          for i = 1, k do
            if od[i] > mx then mx = od[i] end
          end
          anchor, horizon = stamp, stamp + math.floor((mx + 999) / 1000)
        elseif longer and not shorter then
          anchor, horizon = 0, 0
        end
      end
      d.f, d.a, d.h = f, anchor, horizon
      return d
    end
    anchor, horizon = 0, 0
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
  d.f, d.a, d.h = f, 0, 0
  return d
end

-- load is parse for a key read now.
local function load(key, lims, m, now)
  return parse(redis.call('GET', key), lims, m, now)
end

-- encode returns the value that holds the debts d at now, each with its
-- limit's fill time (binary for one limit; as text, negated, so that a
-- value is never mistaken for one without them, for several), and the
-- anchor d.a and horizon d.h when there are; and how long the value must
-- live (ns): its largest debt, or until its horizon. A full bucket has no
-- value (nil).
local function encode(now, d)
  local mx = 0
  for i = 1, #d do
    if d[i] > mx then mx = d[i] end
  end
  local f, a, h = d.f, d.a or 0, d.h or 0
  if a ~= 0 then
    -- Not full before its horizon: live that long (ns from now).
    mx = math.max(mx, (h - now) * 1000)
  end
  if mx <= 0 then return nil, 0 end
  local l = d.l
  if #d == 1 then
    if l then
      if a ~= 0 then return 'g &' .. struct.pack('<ddddddddd', now, d[1], f[1], a, h, l[1], l[2], l[3], l[4]), mx end
      return 'g %' .. struct.pack('<ddddddd', now, d[1], f[1], l[1], l[2], l[3], l[4]), mx
    end
    if a ~= 0 then return 'g $' .. struct.pack('<ddddd', now, d[1], f[1], a, h), mx end
    return 'g #' .. struct.pack('<ddd', now, d[1], f[1]), mx
  end
  local parts = { string.format(INT, now) }
  for i = 1, #d do parts[i + 1] = string.format(INT2, d[i], -f[i]) end
  if a ~= 0 then parts[#parts + 1] = string.format(INT2, a, h) end
  if l then
    parts[#parts + 1] = 'L'
    for i = 1, #l do parts[#parts + 1] = string.format(INT, l[i]) end
  end
  return table.concat(parts, ' '), mx
end

-- save writes the debts (see encode) with a TTL of the time until the
-- bucket is full again plus slack; a full bucket is simply deleted. absent
-- says the key was read as missing (see below).
local function save(key, now, d, absent)
  local v, mx = encode(now, d)
  if not v then
    redis.call('DEL', key)
    return
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
-- instant, now (µs), each all or nothing across buckets 1..nb (debts[b], lims[b] and
-- ms[b] per bucket) and booked up to max_wait ns ahead, updating the debts
-- in place as gcra.Decide does. A bucket's reserve r counts as tokens the
-- take needs beside its n, which it does not book. It stops at the first denial (every
-- later take would be denied the same way) and returns the number of
-- decisions made, that denial included, and whether any tokens were booked.
-- The scripts reply with the debts from before the takes; the client
-- replays the decisions from them with gcra.Decide, so the script
-- computes no report of its own.
local function take_all(debts, lims, ms, nb, n, max_wait, count, now)
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
        note_takes(d, l, ms[b], now, wait)
        for i = 1, ms[b] do d[i] = math.max(d[i], grain(wait, l[2 * i] * l[2 * i - 1])) + n * l[2 * i - 1] end
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
