package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate/gcra"
)

// State reads the stored state of a bucket, for tests and debugging. ok is
// false when the key is absent (a full bucket).
func (s *Store) State(ctx context.Context, key string) (st gcra.State, ok bool, err error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var raw string
	err = s.bounded(ctx, func(ctx context.Context) (err error) {
		raw, err = s.c.Get(ctx, key).Result()
		return err
	})
	if errors.Is(err, redis.Nil) {
		return st, false, nil
	}
	if err != nil {
		return st, false, unavailable("get", err)
	}
	if st, ok = parseState(raw); !ok {
		return st, false, fmt.Errorf("redisstore: key %q holds %q, not a bucket", key, raw)
	}
	return st, true, nil
}

// parseState reads a bucket's value as the scripts do: a one-limit value
// "g #" and three little-endian doubles (stamp, debt, fill), "g $" (and
// the anchor and horizon), "g %" (and the limit's four leads: see
// gcra.Lead) or "g &" (anchored, with leads), or the text "<stamp>
// <debt> -<fill> ... [<anchor> <horizon>] [L <leads> ...]" (or "<stamp>
// <debt> ..." as older versions wrote it).
func parseState(raw string) (gcra.State, bool) {
	if st, ok, bin := parseOneLimit(raw); bin {
		return st, ok
	}
	var leads []gcra.Lead
	if i := strings.Index(raw, " L "); i >= 0 {
		var ok bool
		if leads, ok = parseLeads(raw[i+3:]); !ok {
			return gcra.State{}, false
		}
		raw = raw[:i]
	}
	st, ok := parseText(raw)
	if !ok || leads == nil {
		return st, ok
	}
	if len(leads) != len(st.Debts) {
		return gcra.State{}, false
	}
	st.Leads = leads
	return st, true
}

// parseLeads reads the leads of the text form: four integers a limit.
func parseLeads(raw string) ([]gcra.Lead, bool) {
	f := strings.Fields(raw)
	if len(f) == 0 || len(f)%4 != 0 {
		return nil, false
	}
	v := make([]int64, len(f))
	for i, x := range f {
		var err error
		if v[i], err = strconv.ParseInt(x, 10, 64); err != nil || v[i] < 0 {
			return nil, false
		}
	}
	leads := make([]gcra.Lead, len(v)/4)
	for i := range leads {
		leads[i] = gcra.Lead{Start: v[4*i], Min: v[4*i+1], PrevStart: v[4*i+2], PrevMin: v[4*i+3]}
	}
	return leads, true
}

// parseText reads the text form without its leads.
func parseText(raw string) (gcra.State, bool) {
	f := strings.Fields(raw)
	if len(f) < 2 {
		return gcra.State{}, false
	}
	nums := make([]int64, len(f))
	for i, x := range f {
		var err error
		if nums[i], err = strconv.ParseInt(x, 10, 64); err != nil {
			return gcra.State{}, false
		}
	}
	st := gcra.State{Stamp: nums[0]}
	vals := nums[1:]
	if n := len(vals); n >= 4 && n%2 == 0 && vals[1] < 0 && vals[n-2] > 0 && vals[n-1] > 0 {
		// "<stamp> <debt> -<fill> ... <anchor> <horizon>": anchored.
		st.Anchor, st.Horizon, vals = vals[n-2], vals[n-1], vals[:n-2]
	}
	if len(vals)%2 == 0 && vals[1] < 0 {
		for i := 0; i < len(vals); i += 2 {
			if vals[i] < 0 || vals[i+1] >= 0 {
				return gcra.State{}, false
			}
			st.Debts, st.Fills = append(st.Debts, vals[i]), append(st.Fills, -vals[i+1])
		}
		return st, true
	}
	for _, v := range vals {
		if v < 0 {
			return gcra.State{}, false
		}
	}
	st.Debts = vals
	return st, true
}

// oneLimitTag starts the binary value of a one-limit bucket (see
// scripts/take_one.lua), anchoredTag that of an anchored one (two more
// doubles, the anchor and the horizon: see gcra.State.Anchor); leadsTag
// and anchoredLeadsTag those values followed by the limit's leads (four
// doubles: see gcra.Lead).
const (
	oneLimitTag      = "g #"
	anchoredTag      = "g $"
	leadsTag         = "g %"
	anchoredLeadsTag = "g &"
)

// parseOneLimit reads the binary value of a one-limit bucket. bin reports
// whether raw is one (by its tag and length); ok, whether it holds a
// valid state: three integers below 2^56 (five when anchored, four more
// with leads), the stamp and debt not negative and the fill time
// positive.
func parseOneLimit(raw string) (st gcra.State, ok, bin bool) {
	var v [9]int64
	n, anchored, leads := 3, false, false
	switch {
	case len(raw) == len(oneLimitTag)+24 && strings.HasPrefix(raw, oneLimitTag):
	case len(raw) == len(anchoredTag)+40 && strings.HasPrefix(raw, anchoredTag):
		n, anchored = 5, true
	case len(raw) == len(leadsTag)+56 && strings.HasPrefix(raw, leadsTag):
		n, leads = 7, true
	case len(raw) == len(anchoredLeadsTag)+72 && strings.HasPrefix(raw, anchoredLeadsTag):
		n, anchored, leads = 9, true, true
	default:
		return st, false, false
	}
	for i := range n {
		f := math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[len(oneLimitTag)+8*i:])))
		if f != math.Trunc(f) || f < 0 || f >= 1<<56 {
			return st, false, true
		}
		v[i] = int64(f)
	}
	if v[2] == 0 {
		return st, false, true
	}
	st = gcra.State{Stamp: v[0], Debts: []int64{v[1]}, Fills: []int64{v[2]}}
	rest := v[3:n]
	if anchored {
		st.Anchor, st.Horizon, rest = rest[0], rest[1], rest[2:]
	}
	if leads {
		st.Leads = []gcra.Lead{{Start: rest[0], Min: rest[1], PrevStart: rest[2], PrevMin: rest[3]}}
	}
	return st, true, true
}
