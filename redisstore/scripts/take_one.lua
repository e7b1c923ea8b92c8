-- fleetrate take, one bucket of one limit: the common case, mirroring
-- gcra's decideOne (the loops of take_all unrolled) without the helpers of
-- common.lua. It runs first in the take script and answers only a take
-- (count 1) from one key with one limit whose value is absent or in the
-- one-limit encoding, already written for this limit's fill time; any
-- other take falls through, having written nothing, to the general script
-- after it (common.lua and take.lua), which reads every encoding.
--
-- A one-limit value is "g #" followed by three little-endian doubles
-- (struct '<ddd'): the stamp (µs), the debt (ns) and the fill time (ns)
-- it was written for, every one an integer below 2^53 (whole µs below
-- 2^56 for a limit of a fill time beyond fleetrate.CoarseFillTime), exact
-- in a double; or "g %" followed by those three and the limit's leads
-- (gcra.Lead: start, min, previous start, previous min), which this path
-- writes.
-- Unpacking it costs Redis a tenth of parsing the text form. (Versions
-- before it read "g" as no stamp and "#..." as no number, and fail the
-- call rather than misread the bucket.)
-- ARGV and the reply are take.lua's.

if redis.replicate_commands then redis.replicate_commands() end

local MAX_ELAPSE_US = 65750400000000 -- (MaxFillTime + MaxWaitCap) in µs
local TTL_SLACK_MS = 1000

if #KEYS == 1 and ARGV[3] == '1' and ARGV[4] == '1' then
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local iv, burst = tonumber(ARGV[5]), tonumber(ARGV[6])
  local to = burst * iv
  local raw = redis.call('GET', KEYS[1])
  local debt, fill = 0, to
  local ls, lm, ps, pm -- the leads (see common.lua's note_takes), or nil
  if raw then
    fill = nil
    local stamp
    if #raw == 27 and string.sub(raw, 1, 3) == 'g #' then
      stamp, debt, fill = struct.unpack('<ddd', raw, 4)
    elseif #raw == 59 and string.sub(raw, 1, 3) == 'g %' then
      stamp, debt, fill, ls, lm, ps, pm = struct.unpack('<ddddddd', raw, 4)
    end
    if fill and now > stamp then debt = math.max(debt - math.min(now - stamp, MAX_ELAPSE_US) * 1000, 0) end
    if debt == 0 then ls = nil end -- full: no leads (see gcra's Elapse)
  end
  if fill == to then
    local n = tonumber(ARGV[1])
    local wait = math.max(debt - (burst - (n + tonumber(ARGV[7]))) * iv, 0)
    if wait <= tonumber(ARGV[2]) and n > 0 then
      -- The leads, as common.lua's note_takes records them (wait is
      -- whole µs for a limit beyond COARSE_NS: no grain).
      if not ls then
        ls = now + (debt + 999 - math.fmod(debt + 999, 1000)) / 1000 + 1
        lm, ps, pm = 0, ls, 0
      end
      local at = now + (wait - math.fmod(wait, 1000)) / 1000
      local lead = math.min(debt - wait, to)
      if at - ls >= math.max((to - math.fmod(to, 500)) / 500, 1) then
        ps, pm, ls, lm = ls, math.min(lm, lead), at, to
      else
        lm = math.min(lm, lead)
      end
      local d = math.max(debt, wait) + n * iv
      redis.call('SET', KEYS[1], 'g %' .. struct.pack('<ddddddd', now, d, to, ls, lm, ps, pm), 'PX', math.ceil(d / 1000000) + TTL_SLACK_MS)
    end
    return { now, 1, debt }
  end
end
