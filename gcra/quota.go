package gcra

import (
	"iter"
	"time"

	"github.com/fleetrate/fleetrate"
)

// QuotaUse is what one calendar quota of a bucket (fleetrate.Quota) used
// in a window of its period. A state keeps one per quota with a use, and
// a store keeps the state until the last such window ends (see TTL).
type QuotaUse struct {
	// Key is the quota's fleetrate.Quota.Key: its period.
	Key string
	// Start and End are the window, in µs since the Unix epoch on the
	// store's clock: Start <= t < End.
	Start, End int64
	// Used is what the window's grants took.
	Used int64
}

// window returns q's window at now (µs).
func window(q *fleetrate.Quota, now int64) (start, end int64) {
	s, e := q.Period.Window(time.UnixMicro(now))
	return s.UnixMicro(), e.UnixMicro()
}

// quotaUse returns what q has used in its window at now in s: the use s
// keeps for q's period in that window, or none. i is the index of the
// use in s.Quotas, -1 when s keeps none for q's period.
func (s *State) quotaUse(q *fleetrate.Quota, now int64) (i int, u QuotaUse) {
	start, end := window(q, now)
	u = QuotaUse{Key: q.Key(), Start: start, End: end}
	for i := range s.Quotas {
		if s.Quotas[i].Key == u.Key {
			if s.Quotas[i].Start == start {
				u.Used = s.Quotas[i].Used
			}
			return i, u
		}
	}
	return -1, u
}

// quotaRefusal returns the quota of req's buckets that refuses its cost
// at now and whose window ends last (a take refused by a day's quota and
// a week's waits for the week), as (bucket, quota index), and how long
// (ns) until that window ends; -1 when every quota admits the take.
func quotaRefusal(now int64, req fleetrate.Request, states []State) (bucket, index int, wait int64) {
	bucket, index = -1, -1
	for c := range charged(req) {
		if _, u := states[c.b].quotaUse(c.q, now); u.Used+c.n > c.q.Count && (u.End-now)*1000 > wait {
			bucket, index, wait = c.b, c.qi, (u.End-now)*1000
		}
	}
	return bucket, index, wait
}

// useQuotas counts a granted take's cost in the window at now of every
// quota of req's buckets, and reports whether any was counted.
func useQuotas(now int64, req fleetrate.Request, states []State) bool {
	changed := false
	for c := range charged(req) {
		i, u := states[c.b].quotaUse(c.q, now)
		u.Used += c.n
		if i < 0 {
			states[c.b].Quotas = append(states[c.b].Quotas, u)
		} else {
			states[c.b].Quotas[i] = u
		}
		changed = true
	}
	return changed
}

// charge is a quota a take's cost charges: quota qi (q) of bucket b,
// which the take costs n > 0 tokens of.
type charge struct {
	b, qi int
	q     *fleetrate.Quota
	n     int64
}

// charged yields every quota that req's cost charges.
func charged(req fleetrate.Request) iter.Seq[charge] {
	return func(yield func(charge) bool) {
		for b := range req.Buckets {
			n := fleetrate.CostOf(req.N, req.Costs, b)
			if n == 0 {
				continue
			}
			for qi := range req.Buckets[b].Quotas {
				if !yield(charge{b: b, qi: qi, q: &req.Buckets[b].Quotas[qi], n: n}) {
					return
				}
			}
		}
	}
}

// fillQuotas sets res.Quotas from every quota of req's buckets at now,
// and res.Quota: the quota that refused the take (refused, with bucket
// and index), else the one with the fewest remaining.
func fillQuotas(res *fleetrate.Result, now int64, req fleetrate.Request, states []State, rb, ri int) {
	for b := range req.Buckets {
		for qi := range req.Buckets[b].Quotas {
			q := &req.Buckets[b].Quotas[qi]
			_, u := states[b].quotaUse(q, now)
			st := fleetrate.QuotaStatus{Bucket: b, Index: qi, Quota: *q, Used: u.Used, Remaining: max(q.Count-u.Used, 0), Reset: time.UnixMicro(u.End)}
			if b == rb && qi == ri {
				res.Quota, res.QuotaDenied = len(res.Quotas), true
			} else if !res.QuotaDenied && (len(res.Quotas) == 0 || st.Remaining < res.Quotas[res.Quota].Remaining) {
				res.Quota = len(res.Quotas)
			}
			res.Quotas = append(res.Quotas, st)
		}
	}
}

// hasQuotas reports whether a bucket of req has calendar quotas.
func hasQuotas(req fleetrate.Request) bool {
	for b := range req.Buckets {
		if len(req.Buckets[b].Quotas) > 0 {
			return true
		}
	}
	return false
}
