package sendtime

import (
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

// spreader is one process sending one bucket's requests: Spread, then
// Record when the request goes.
type spreader struct {
	paced []fleetrate.Bucket
	h     History
}

func (s *spreader) spread(due, now time.Time) (time.Duration, bool) {
	at, void := Spread(s.paced, []History{s.h}, due, now)
	if void {
		return 0, true
	}
	s.h.Record(at)
	return at.Sub(now), false
}

// TestSpreadLateWakers: a request of a strict (burst 1) bucket woken
// later after its slot than LateSlack is booked again, every time, since
// whoever holds the next slot would follow it too closely; with a larger
// burst, the requests of a process that stalled go out one interval apart
// as long as each stays within (burst − 1) intervals + LateSlack of its
// slot, and the one that would not is booked again.
func TestSpreadLateWakers(t *testing.T) {
	strict := &spreader{paced: []fleetrate.Bucket{{Key: "{ota}/avail", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 1)}}}}
	strict.h.Sends = ColdSends // see TestSpreadColdRequests
	now := time.Unix(1000, 0)
	if d, void := strict.spread(now, now); d != 0 || void {
		t.Fatalf("strict, on time: wait %v, void %v; want 0, false", d, void)
	}
	if d, void := strict.spread(now.Add(-LateSlack/2), now); d != 0 || void {
		t.Fatalf("strict, within LateSlack: wait %v, void %v; want 0, false", d, void)
	}
	for range 3 {
		if _, void := strict.spread(now.Add(-10*time.Millisecond), now); !void {
			t.Fatalf("strict, 10 ms late: not booked again; the next slot, 100 ms after this one's, would follow it by 90 ms")
		}
	}

	// Burst 4 at 10/s: a request may go out up to 305 ms after its slot.
	loose := &spreader{paced: []fleetrate.Bucket{{Key: "{ota}/search", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 4)}}}}
	loose.h.Sends = ColdSends
	if d, void := loose.spread(now, now); d != 0 || void {
		t.Fatalf("burst 4, on time: wait %v, void %v; want 0, false", d, void)
	}
	// Slots that passed while the process stalled, 130 and 80 ms ago: each
	// goes one interval (100 ms) after the last.
	for i, ago := range []time.Duration{130, 80} {
		d, void := loose.spread(now.Add(-ago*time.Millisecond), now)
		want := time.Duration(i+1) * 100 * time.Millisecond
		if void || d != want {
			t.Errorf("burst 4, %v ms late: wait %v, void %v; want %v, false (spaced one interval apart)", ago, d, void, want)
		}
	}
	// The next, 30 ms ago, would go out 330 ms after its slot: beyond the
	// burst's 305 ms, so it is booked again.
	if _, void := loose.spread(now.Add(-30*time.Millisecond), now); !void {
		t.Errorf("burst 4: a request that would go out 330 ms after its slot was not booked again")
	}
}

// TestSpreadColdRequests: a process's first ColdSends requests of a
// burst-1 bucket go out as booked only within ColdSlack of their slot
// (1.25 ms at 20/s), since they are the ones that go out late (code run
// for the first time, new connections) at a fleet's start; later ones
// within LateSlack. A request booked again does not count as sent.
func TestSpreadColdRequests(t *testing.T) {
	s := &spreader{paced: []fleetrate.Bucket{{Key: "{ota}/avail", Limits: []fleetrate.Limit{fleetrate.PerSecond(20, 1)}}}}
	now := time.Unix(1000, 0)
	for range 3 {
		if _, void := s.spread(now.Add(-2*time.Millisecond), now); !void {
			t.Fatalf("a process's first request, 2 ms late: not booked again (cold slack 1.25 ms)")
		}
	}
	for i := range ColdSends {
		now = now.Add(50 * time.Millisecond)
		if d, void := s.spread(now.Add(-time.Millisecond), now); d != 0 || void {
			t.Fatalf("cold request %d, 1 ms late: wait %v, void %v; want 0, false", i, d, void)
		}
	}
	now = now.Add(50 * time.Millisecond)
	if d, void := s.spread(now.Add(-3*time.Millisecond), now); d != 0 || void {
		t.Fatalf("after %d sends, 3 ms late (within LateSlack): wait %v, void %v; want 0, false", ColdSends, d, void)
	}
}

func TestSpacing(t *testing.T) {
	b := func(ls ...fleetrate.Limit) fleetrate.Bucket { return fleetrate.Bucket{Limits: ls} }
	for _, c := range []struct {
		name                   string
		paced                  []fleetrate.Bucket
		cold                   bool
		gap, tolerance, onTime time.Duration
	}{
		{"strict", []fleetrate.Bucket{b(fleetrate.PerSecond(20, 1))}, false, 50 * time.Millisecond, LateSlack, LateSlack},
		{"strict, cold", []fleetrate.Bucket{b(fleetrate.PerSecond(20, 1))}, true, 50 * time.Millisecond, 1250 * time.Microsecond, 1250 * time.Microsecond},
		{"strict, fast and cold: at least 1 ms", []fleetrate.Bucket{b(fleetrate.PerSecond(4000, 1))}, true, 250 * time.Microsecond, time.Millisecond, time.Millisecond},
		{"strict, slow and cold: at most LateSlack", []fleetrate.Bucket{b(fleetrate.PerSecond(1, 1))}, true, time.Second, LateSlack, LateSlack},
		{"burst 2", []fleetrate.Bucket{b(fleetrate.PerSecond(20, 2))}, false, 50 * time.Millisecond, 50*time.Millisecond + LateSlack, LateSlack},
		{"burst 2, cold: as warm", []fleetrate.Bucket{b(fleetrate.PerSecond(20, 2))}, true, 50 * time.Millisecond, 50*time.Millisecond + LateSlack, LateSlack},
		{"the strictest limit of two buckets", []fleetrate.Bucket{b(fleetrate.PerSecond(20, 3)), b(fleetrate.PerSecond(10, 1), fleetrate.Limit{Name: "minute", Rate: 100.0 / 60, Burst: 50})},
			false, 100 * time.Millisecond, LateSlack, LateSlack},
	} {
		gap, tol, onTime := Spacing(c.paced, c.cold)
		if gap != c.gap || tol != c.tolerance || onTime != c.onTime {
			t.Errorf("%s: Spacing = %v, %v, %v; want %v, %v, %v", c.name, gap, tol, onTime, c.gap, c.tolerance, c.onTime)
		}
	}
}

// TestSpinLead: only a burst-1 limit's requests wake early to wait out the
// rest of their slot without a timer, by at most MaxSpin and at most an
// eighth of the limit's interval.
func TestSpinLead(t *testing.T) {
	bucket := func(ls ...fleetrate.Limit) fleetrate.Bucket { return fleetrate.Bucket{Key: "{ota}/avail", Limits: ls} }
	for _, c := range []struct {
		name  string
		paced []fleetrate.Bucket
		want  time.Duration
	}{
		{"19/s burst 1", []fleetrate.Bucket{bucket(fleetrate.PerSecond(19, 1))}, MaxSpin},
		{"1000/s burst 1", []fleetrate.Bucket{bucket(fleetrate.PerSecond(1000, 1))}, 125 * time.Microsecond},
		{"20/s burst 2", []fleetrate.Bucket{bucket(fleetrate.PerSecond(20, 2))}, 0},
		{"endpoint burst 2, credential burst 1", []fleetrate.Bucket{
			bucket(fleetrate.PerSecond(20, 2)), bucket(fleetrate.PerSecond(4000, 1))}, 31250 * time.Nanosecond},
	} {
		if got := SpinLead(c.paced); got != c.want {
			t.Errorf("%s: SpinLead = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestLate: an answer that came back later than the quickest take and
// answer allow, by more than the margin, holds the gate for spacing less
// the quickest answer; within the margin, or from an endpoint whose
// quickest answer takes the whole spacing, it holds nothing.
func TestLate(t *testing.T) {
	ms := time.Millisecond
	asked := time.Unix(1000, 0)
	for _, c := range []struct {
		name                string
		spacing             time.Duration
		sent                time.Time
		rtt, qTake, qAnswer time.Duration
		wantLate, wantHold  time.Duration
	}{
		{"on time", 50 * ms, asked, 10 * ms, 2 * ms, 8 * ms, 0, 0},
		{"within the margin", 50 * ms, asked, 10*ms + ms, 2 * ms, 8 * ms, ms, 0},
		{"late", 50 * ms, asked, 20 * ms, 2 * ms, 8 * ms, 10 * ms, 42 * ms},
		{"sent late", 50 * ms, asked.Add(5 * ms), 10 * ms, 2 * ms, 8 * ms, 5 * ms, 42 * ms},
		{"answers slower than the spacing tell nothing", 50 * ms, asked, 100 * ms, 0, 50 * ms, 50 * ms, 0},
		{"first answers: none to compare with", 50 * ms, asked, 10 * ms, 0, 0, 10 * ms, 50 * ms},
	} {
		late, hold := Late(c.spacing, asked, c.sent, c.rtt, Quickest{Take: c.qTake, Answer: c.qAnswer})
		if late != c.wantLate || hold != c.wantHold {
			t.Errorf("%s: Late = %v, %v; want %v, %v", c.name, late, hold, c.wantLate, c.wantHold)
		}
	}
}
