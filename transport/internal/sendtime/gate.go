package sendtime

import (
	"fmt"
	"time"

	"github.com/fleetrate/fleetrate"
)

// A strict window (an endpoint's Spacing) admits one request per interval
// and no burst, so it refuses a request that reaches it a little early. A
// fleet paced at 95 % of it (52.6 ms apart for a 50 ms window) keeps 2.6
// ms between its slots, but the wire does not: a request that spends 3 ms
// more on the way than the next one reaches the upstream less than 50 ms
// before it, draws a 429 and, from most upstreams, a pause of the whole
// credential.
//
// A response cannot leave the upstream before its request reached it, so
// the sender of a request whose answer came back late knows, long before
// the next slot, that the request may have reached the upstream late, and
// by at most how much. The spacing gate shares that: a bucket in the store
// beside the endpoint's, of one token per Spacing + Margin, that every
// request takes just before it goes out (waiting for it when needed),
// together with a hold (hold.Gate) that a late answer drains, so that the
// next request, whichever process sends it, leaves no sooner than Spacing
// after the late one may have arrived (see Late).

// Margin returns what the spacing gate adds to an endpoint's spacing: a
// millisecond, or a twentieth of spacing when that is less.
func Margin(spacing time.Duration) time.Duration {
	return min(time.Millisecond, spacing/20)
}

// The bounds of an endpoint's Spacing.
const (
	MinSpacing = time.Millisecond
	MaxSpacing = time.Minute
)

// CheckSpacing checks a spacing against its bounds.
func CheckSpacing(d time.Duration) error {
	if d != 0 && (d < MinSpacing || d > MaxSpacing) {
		return fmt.Errorf("must be 0 or between %v and %v, got %v", MinSpacing, MaxSpacing, d)
	}
	return nil
}

// GateLimit is the spacing gate's limit: one token per spacing + Margin,
// no burst.
func GateLimit(spacing time.Duration) fleetrate.Limit {
	return fleetrate.Every(spacing+Margin(spacing), 1).Named("gate")
}

// Late decides what the answer (not a rate limit) to a request that
// passed the gate tells: the request was let go by a take sent at asked
// (plus the wait it booked), was sent at sent and answered after rtt.
// It left the gate's decision, reached the upstream and came back in the
// time from asked to its answer; beyond the quickest recent take of the
// gate (quickestTake) and the quickest recent answer of the endpoint
// (quickestAnswer), that time may all have been spent before the request
// reached the upstream. When it exceeds the gate's margin, the gate is
// held for hold, so that the next request goes no sooner than spacing
// after the late one may have arrived: spacing after the answer, less the
// endpoint's quickest answer, the time a request on time would have taken
// to come back. An endpoint whose quickest answer takes the whole spacing
// tells nothing in time, and its gate is never held.
func Late(spacing time.Duration, asked, sent time.Time, rtt time.Duration, q Quickest) (late, hold time.Duration) {
	quickestTake, quickestAnswer := q.Take, q.Answer
	late = sent.Add(rtt).Sub(asked) - quickestTake - quickestAnswer
	if late <= Margin(spacing) || quickestAnswer >= spacing {
		return late, 0
	}
	return late, spacing - quickestAnswer
}

// Quickest are the quickest recent round trips Late compares a request's
// with: the gate's take (quickestTake) and the endpoint's answer
// (quickestAnswer).
type Quickest struct {
	Take, Answer time.Duration
}

// RTTWindow is how long the quickest answer of an endpoint counts: the
// quickest is the least over the current window and the one before.
const RTTWindow = 10 * time.Second

// RTTSamples is how many answers the quickest is taken over before it is
// trusted: each of them is compared with none, as a process's first few
// answers may all have been slow.
const RTTSamples = 16

// RTTFloor is the quickest recent round trip of one kind (an endpoint's
// answers, or its gate's takes) in one process.
type RTTFloor struct {
	cur, prev time.Duration
	start     time.Time // the current window's
	n         int       // round trips since the first, or since starting over
}

// Add records a round trip of rtt begun at now, and returns the quickest
// of the current window and the one before, or 0 for the first
// RTTSamples. Two whole windows without one (an idle spell of 20 s or
// more) start over.
func (f *RTTFloor) Add(now time.Time, rtt time.Duration) time.Duration {
	switch {
	case f.start.IsZero() || now.Sub(f.start) >= 2*RTTWindow:
		*f = RTTFloor{cur: rtt, prev: rtt, start: now}
	case now.Sub(f.start) >= RTTWindow:
		f.prev, f.cur, f.start = f.cur, rtt, now
	default:
		f.cur = min(f.cur, rtt)
	}
	if f.n++; f.n <= RTTSamples {
		return 0
	}
	return min(f.cur, f.prev)
}
