package gcra

import (
	"slices"

	"github.com/fleetrate/fleetrate"
)

// The bounded summary that lets Settle give back what no later take
// relies on (docs/ARCHITECTURE.md, "Settling").
//
// A limit's debt is the state of a chain of operations in the order they
// were decided: a take of n tokens at slot s sets TAT := max(TAT, s) + n
// intervals. Lowering an earlier grant's cost by δ lowers the TAT the
// chain ends at by min(δ intervals, the least lead of what came after
// it), a take's lead being TAT before it less its slot (its debt before
// it less its wait): a take that found the bucket nearly full relied on
// refill, which the lower cost would have lost. Settle gives back that
// much, so the state is the one the chain would have reached had the
// grant cost its real cost from the start, with every later grant still
// conforming (it was decided on a higher state).

// Lead is, for one limit, a lower bound of the least lead of the takes
// (and of the other operations that bound what may go back) decided
// after any grant of the last two epochs, each epoch a span of the limit's
// fill time (epochUS) of the grants' keys. A grant's key is its slot in
// µs, as fleetrate.Settlement.At gives it: what a settle names the grant
// by. A take whose key is at least Start plus an epoch begins a new
// epoch: the current one becomes the previous one, with the take's own
// lead (it came after every grant of that epoch). So epochs begin at keys
// at least an epoch apart, and every grant of an earlier epoch has a key
// below every later epoch's Start: a grant whose key is at least Start was
// decided in the current epoch, and everything decided after it is
// counted in Min; one whose key is at least PrevStart in one of the two,
// and everything after it in PrevMin or Min. Of an older grant nothing is
// known, and nothing goes back. Leads are between 0 and the limit's fill
// time, which stands for "none" (a settle gives back at most a fill time).
type Lead struct {
	// Start is the key (µs) that began the current epoch, and Min the
	// least lead (ns) of what was decided in it after the take that
	// began it.
	Start, Min int64
	// PrevStart and PrevMin are those of the epoch before, Min counting
	// the take that ended it.
	PrevStart, PrevMin int64
}

// epochUS is the span of keys (µs) of an epoch of a limit of fill time f
// (ns): twice its fill time, at least 1 µs. The summary keeps two epochs,
// so a grant settled more than two to four fill times of slots after its
// own gets only what Refund gives back; a longer epoch counts more takes
// before the grant in the least lead, and each give-back lowers the leads
// of its whole epoch. On the busy meter of TestExactSettleUtilisation
// (fill time 1 s, answers 0.1 to 0.5 s after the slot) an epoch of half
// or a quarter of the fill time answers 90.9 % of the limit (what
// Refund alone gives back), one fill time 96.8 %, two 99.7 %, four
// 99.9 %.
func epochUS(f int64) int64 { return max(f/500, 1) }

// least returns the least lead (ns) of what was decided after a grant of
// key at (µs), as far as l knows it: 0 when the grant is older than the
// previous epoch.
func (l *Lead) least(at int64) int64 {
	switch {
	case at >= l.Start:
		return l.Min
	case at >= l.PrevStart:
		return min(l.Min, l.PrevMin)
	}
	return 0
}

// spend lowers the leads of what was decided after a grant of key at by
// back (ns), what a give-back lowered the state by: their leads in the
// chain where the grant cost less are lower by up to that much. at < 0
// means unknown: every epoch is lowered.
func (l *Lead) spend(at, back int64) {
	l.Min = max(l.Min-back, 0)
	if at < l.Start {
		l.PrevMin = max(l.PrevMin-back, 0)
	}
}

// note records an operation of lead lead (ns) decided now, in the current
// epoch: one beyond which nothing earlier can go back.
func (l *Lead) note(lead int64) { l.Min = min(l.Min, max(lead, 0)) }

// take records a take of key at (µs) whose lead was lead (ns), on a limit
// of fill time f: it begins a new epoch when at is an epoch beyond Start.
func (l *Lead) take(at, lead, f int64) {
	lead = min(max(lead, 0), f)
	if at-l.Start >= epochUS(f) {
		l.PrevStart, l.PrevMin = l.Start, min(l.Min, lead)
		l.Start, l.Min = at, f
		return
	}
	l.Min = min(l.Min, lead)
}

// hasLeads reports whether s holds a summary for each of its limits.
func (s *State) hasLeads() bool { return len(s.Leads) == len(s.Debts) && len(s.Leads) > 0 }

// forget starts the summary of s anew at now (µs), knowing nothing of
// what was decided before: both epochs begin beyond the key of every grant
// booked on it, which lies before its limits' TAT (debt µs from now, at
// most debt), and hold no lead, so that none of those grants gets
// anything back (see Lead).
func (s *State) forget(now, debt int64) {
	if len(s.Leads) != len(s.Debts) {
		s.Leads = make([]Lead, len(s.Debts))
	}
	start := now + (max(debt, 0)+999)/1000 + 1
	for i := range s.Leads {
		s.Leads[i] = Lead{Start: start, PrevStart: start}
	}
}

// noteTakes records in s a take booked at key at (µs), wait ns from now,
// on limits whose debts (before the take) are s.Debts: each limit's lead
// is its debt less the wait (as book rounds it). A state without a
// summary starts one that knows nothing of the grants before.
func (s *State) noteTakes(now int64, limits []fleetrate.Limit, wait int64) {
	if !s.hasLeads() {
		s.forget(now, slices.Max(s.Debts))
	}
	at := now + wait/1000
	for i := range limits {
		f := fill(&limits[i])
		s.Leads[i].take(at, s.Debts[i]-grain(wait, f), f)
	}
}

// dropFullLeads drops the summary of s when every limit is full: a store
// deletes a full bucket (the Lua mirror does), and what a full bucket
// gives back by leads is nothing (every grant's slot lies before its
// TAT, now), so dropping them changes no give-back.
func (s *State) dropFullLeads() {
	for _, d := range s.Debts {
		if d > 0 {
			return
		}
	}
	s.Leads = nil
}
