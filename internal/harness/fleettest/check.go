package fleettest

import (
	"fmt"
	"math"
	"math/big"
	"slices"
	"time"

	"github.com/fleetrate/fleetrate"
)

// Times returns, for each grant, the instant a check reads: the slot or
// the act.
type Times func(Grant) int64

// Slots reads the library's slots; Acts, the moments callers acted.
var (
	Slots Times = func(g Grant) int64 { return g.Slot }
	Acts  Times = func(g Grant) int64 { return g.Act }
)

// CheckWindows verifies that in every window between two grants' instants
// the tokens used are at most burst + rate × window + slack tokens. It
// returns the largest excess over burst + rate × window it saw (0 when
// none) and an error for the first window beyond the slack.
func CheckWindows(grants []Grant, at Times, l fleetrate.Limit, slack float64) (worst float64, err error) {
	g := slices.Clone(grants)
	slices.SortFunc(g, func(a, b Grant) int { return cmpInt(at(a), at(b)) })
	for i := range g {
		var sum int64
		for j := i; j < len(g); j++ {
			sum += g[j].N
			w := at(g[j]) - at(g[i])
			excess := float64(sum) - (float64(l.Burst) + l.Rate*float64(w)/1e9)
			if excess <= 0 || !exceeds(sum, w, l) {
				continue
			}
			worst = max(worst, excess)
			if excess > slack && err == nil {
				err = fmt.Errorf("%d tokens used in a window of %v (grants %d..%d); the bound is %d + %g × window = %.3f, slack %.3f",
					sum, time.Duration(w), i, j, l.Burst, l.Rate, float64(l.Burst)+l.Rate*float64(w)/1e9, slack)
			}
		}
	}
	return worst, err
}

// exceeds reports exactly, in rational arithmetic, whether sum tokens in
// windowNs nanoseconds exceed burst + rate × window.
func exceeds(sum, windowNs int64, l fleetrate.Limit) bool {
	rate := new(big.Rat).SetFloat64(l.Rate)
	bound := new(big.Rat).Mul(rate, new(big.Rat).SetFrac64(windowNs, 1e9))
	bound.Add(bound, new(big.Rat).SetInt64(l.Burst))
	return new(big.Rat).SetInt64(sum).Cmp(bound) > 0
}

// NoiseSlack is the tolerance, in tokens, that the run's timer noise
// allows where callers act: a caller that woke late by the run's largest
// lateness while another woke early by its smallest narrows a window by
// their difference, which at rate r admits r × that difference more
// tokens than the window's length would, plus one for the token at each
// end.
func NoiseSlack(rep Report, l fleetrate.Limit) float64 {
	spread := rep.Lateness.Max - min(rep.Lateness.Min, 0)
	return math.Ceil(l.Rate*spread.Seconds()) + 1
}

// CheckFIFO verifies that waiters were booked in decision order: a wait
// decided later never got an earlier slot.
func CheckFIFO(grants []Grant) error {
	var waits []Grant
	for _, g := range grants {
		if g.Wait {
			waits = append(waits, g)
		}
	}
	slices.SortStableFunc(waits, func(a, b Grant) int { return cmpInt(a.Booked, b.Booked) })
	for i := 1; i < len(waits); i++ {
		if waits[i].Booked > waits[i-1].Booked && waits[i].Slot < waits[i-1].Slot {
			return fmt.Errorf("waiter decided at %d got slot %d, before the slot %d of one decided earlier at %d",
				waits[i].Booked, waits[i].Slot, waits[i-1].Slot, waits[i-1].Booked)
		}
	}
	return nil
}

// Filter returns the grants that keep reports true.
func Filter(grants []Grant, keep func(Grant) bool) []Grant {
	var out []Grant
	for _, g := range grants {
		if keep(g) {
			out = append(out, g)
		}
	}
	return out
}
