package transport

import (
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

// TestSpreadLateWakers: a request of a strict (burst 1) bucket woken
// later after its slot than lateSlack is booked again, every time, since
// whoever holds the next slot would follow it too closely; with a larger
// burst, the requests of a process that stalled go out one interval apart
// as long as each stays within (burst − 1) intervals + lateSlack of its
// slot, and the one that would not is booked again.
func TestSpreadLateWakers(t *testing.T) {
	strict := fleetrate.Bucket{Key: "{ota}/avail", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 1)}}
	tk := take{buckets: []fleetrate.Bucket{strict, pauseMarker(strict)}, paced: 1}
	tr := &Transport{}
	now := time.Now()
	tr.views.get(strict.Key).sends = coldSends // see TestSpreadColdRequests
	if d, void := tr.spread(tk, now, now); d != 0 || void {
		t.Fatalf("strict, on time: wait %v, void %v; want 0, false", d, void)
	}
	if d, void := tr.spread(tk, now.Add(-lateSlack/2), now); d != 0 || void {
		t.Fatalf("strict, within lateSlack: wait %v, void %v; want 0, false", d, void)
	}
	for range 3 {
		if _, void := tr.spread(tk, now.Add(-10*time.Millisecond), now); !void {
			t.Fatalf("strict, 10 ms late: not booked again; the next slot, 100 ms after this one's, would follow it by 90 ms")
		}
	}

	// Burst 4 at 10/s: a request may go out up to 305 ms after its slot.
	loose := fleetrate.Bucket{Key: "{ota}/search", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 4)}}
	tk = take{buckets: []fleetrate.Bucket{loose, pauseMarker(loose)}, paced: 1}
	if d, void := tr.spread(tk, now, now); d != 0 || void {
		t.Fatalf("burst 4, on time: wait %v, void %v; want 0, false", d, void)
	}
	// Slots that passed while the process stalled, 130 and 80 ms ago: each
	// goes one interval (100 ms) after the last.
	for i, ago := range []time.Duration{130, 80} {
		d, void := tr.spread(tk, now.Add(-ago*time.Millisecond), now)
		want := time.Duration(i+1) * 100 * time.Millisecond
		if void || d < want-5*time.Millisecond || d > want+5*time.Millisecond {
			t.Errorf("burst 4, %v ms late: wait %v, void %v; want about %v, false (spaced one interval apart)", ago, d, void, want)
		}
	}
	// The next, 30 ms ago, would go out 330 ms after its slot: beyond the
	// burst's 305 ms, so it is booked again.
	if _, void := tr.spread(tk, now.Add(-30*time.Millisecond), now); !void {
		t.Errorf("burst 4: a request that would go out 330 ms after its slot was not booked again")
	}
}

// TestSpreadColdRequests: a process's first coldSends requests of a
// burst-1 bucket go out as booked only within coldSlack of their slot
// (1.25 ms at 20/s), since they are the ones that go out late (code run
// for the first time, new connections) at a fleet's start; later ones
// within lateSlack. A request booked again does not count as sent.
func TestSpreadColdRequests(t *testing.T) {
	strict := fleetrate.Bucket{Key: "{ota}/avail", Limits: []fleetrate.Limit{fleetrate.PerSecond(20, 1)}}
	tk := take{buckets: []fleetrate.Bucket{strict, pauseMarker(strict)}, paced: 1}
	tr := &Transport{}
	now := time.Now()
	for range 3 {
		if _, void := tr.spread(tk, now.Add(-2*time.Millisecond), now); !void {
			t.Fatalf("a process's first request, 2 ms late: not booked again (cold slack 1.25 ms)")
		}
	}
	for i := range coldSends {
		now = now.Add(50 * time.Millisecond)
		if d, void := tr.spread(tk, now.Add(-time.Millisecond), now); d != 0 || void {
			t.Fatalf("cold request %d, 1 ms late: wait %v, void %v; want 0, false", i, d, void)
		}
	}
	now = now.Add(50 * time.Millisecond)
	if d, void := tr.spread(tk, now.Add(-3*time.Millisecond), now); d != 0 || void {
		t.Fatalf("after %d sends, 3 ms late (within lateSlack): wait %v, void %v; want 0, false", coldSends, d, void)
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
		{"strict", []fleetrate.Bucket{b(fleetrate.PerSecond(20, 1))}, false, 50 * time.Millisecond, lateSlack, lateSlack},
		{"strict, cold", []fleetrate.Bucket{b(fleetrate.PerSecond(20, 1))}, true, 50 * time.Millisecond, 1250 * time.Microsecond, 1250 * time.Microsecond},
		{"strict, fast and cold: at least 1 ms", []fleetrate.Bucket{b(fleetrate.PerSecond(4000, 1))}, true, 250 * time.Microsecond, time.Millisecond, time.Millisecond},
		{"strict, slow and cold: at most lateSlack", []fleetrate.Bucket{b(fleetrate.PerSecond(1, 1))}, true, time.Second, lateSlack, lateSlack},
		{"burst 2", []fleetrate.Bucket{b(fleetrate.PerSecond(20, 2))}, false, 50 * time.Millisecond, 50*time.Millisecond + lateSlack, lateSlack},
		{"burst 2, cold: as warm", []fleetrate.Bucket{b(fleetrate.PerSecond(20, 2))}, true, 50 * time.Millisecond, 50*time.Millisecond + lateSlack, lateSlack},
		{"the strictest limit of two buckets", []fleetrate.Bucket{b(fleetrate.PerSecond(20, 3)), b(fleetrate.PerSecond(10, 1), fleetrate.Limit{Name: "minute", Rate: 100.0 / 60, Burst: 50})},
			false, 100 * time.Millisecond, lateSlack, lateSlack},
	} {
		gap, tol, onTime := spacing(c.paced, c.cold)
		if gap != c.gap || tol != c.tolerance || onTime != c.onTime {
			t.Errorf("%s: spacing = %v, %v, %v; want %v, %v, %v", c.name, gap, tol, onTime, c.gap, c.tolerance, c.onTime)
		}
	}
}

// TestLimitRange: what a 429 tells of the limit, from the requests the
// fleet sent at its rate since its last pause.
func TestLimitRange(t *testing.T) {
	resumed := time.Unix(1000, 0)
	for _, c := range []struct {
		name      string
		f, rate   float64
		sent      time.Time
		resumed   time.Time
		low, high float64
		wantSoon  bool
	}{
		{"no pause to count from", 0.8, 8, resumed, time.Time{}, 0, 0.8, false},
		{"sent before the resume", 0.8, 8, resumed.Add(-time.Second), resumed, 0, 0.8, false},
		{"first request after the pause", 0.8, 8, resumed.Add(130 * time.Millisecond), resumed, 0, 0.8, true},
		{"second request", 0.8, 8, resumed.Add(250 * time.Millisecond), resumed, 0, 0.4, false},
		{"fifth request", 0.8, 8, resumed.Add(625 * time.Millisecond), resumed, 0, 0.64, false},
		{"after 8 intervals", 0.8, 8, resumed.Add(time.Second), resumed, 0.8 * (1 - 4.0/7), 0.7, false},
		{"long after", 0.8, 8, resumed.Add(100 * time.Second), resumed, 0.8 * (1 - 4.0/799), 0.799, false},
	} {
		low, high, soon := limitRange(c.f, c.rate, c.sent, c.resumed)
		if soon != c.wantSoon || high < c.high-0.001 || high > c.high+0.001 || low < c.low-0.001 || low > c.low+0.001 {
			t.Errorf("%s: limitRange = %v, %v, %v; want %v, %v, %v", c.name, low, high, soon, c.low, c.high, c.wantSoon)
		}
	}
}

// TestLoweredAfterManyAdmitted: a 429 that came after hundreds of admitted
// requests (send jitter on a strict window, or a limit just under the
// rate) lowers where the climb flattens only to what the admitted
// requests prove the limit is at least, so that a fleet that draws such a
// 429 every minute does not ratchet its rate down; one after a few
// admitted requests still lowers it below them.
func TestLoweredAfterManyAdmitted(t *testing.T) {
	a, _ := Adaptive{}.withDefaults()
	start := time.Unix(1000, 0)
	c := climb{w: 1, start: start}
	now := start.Add(60 * time.Second)
	f := a.factor(c, now)
	resumed := start.Add(-2 * time.Second)
	rate := 19 * f
	low, high, _ := limitRange(f, rate, now, resumed) // about 1,170 admitted
	got := a.lowered(c, now, now.Add(2*time.Second), low, high)
	if got.w < low || got.w > f {
		t.Fatalf("after ~1,170 admitted requests w = %v, want in [%v, %v]", got.w, low, f)
	}
	if to := a.factor(got, now.Add(2*time.Second)); to >= f {
		t.Fatalf("the rate after the 429 = %v, want below %v", to, f)
	}
	low, high, _ = limitRange(f, rate, resumed.Add(400*time.Millisecond), resumed) // about 7 admitted
	if got := a.lowered(c, now, now.Add(2*time.Second), low, high); got.w > high {
		t.Fatalf("after ~7 admitted requests w = %v, want below the bound %v", got.w, high)
	}
}

// TestLoweredKeepsTheMarkersOrder: a climb lowered soon after the last one
// began never starts before it (the markers keep the later start of two,
// so an earlier one would not be what the fleet reads).
func TestLoweredKeepsTheMarkersOrder(t *testing.T) {
	a, _ := Adaptive{}.withDefaults()
	start := time.Unix(1000, 0)
	c := climb{w: 0.7, start: start}
	now := start.Add(3 * time.Second) // near w: a shallow drop
	got := a.lowered(c, now, now.Add(2*time.Second), 0, 1)
	if got.start.Before(start) {
		t.Fatalf("lowered climb starts %v before the last one", start.Sub(got.start))
	}
	if got.w > a.factor(c, now) {
		t.Fatalf("lowered w = %v above the rate that drew the 429 (%v)", got.w, a.factor(c, now))
	}
}

// TestAdmittedEndsTheRow: an answer other than a rate limit ends a row of
// 429s taken as pauses too short, so the next row may again blame the
// pause (a 429 by another process lowered the rate in between; this
// process's count would otherwise carry over and lower it once more).
func TestAdmittedEndsTheRow(t *testing.T) {
	tr := &Transport{}
	tg := Target{Channel: "ota", Endpoint: "avail"}
	key := EndpointBucket(tg.Channel, tg.Endpoint)
	tr.views.setSoon(tr.views.get(key), maxSoon)
	tr.admitted(tg)
	if n := tr.views.get(key).soon; n != 0 {
		t.Fatalf("after an admitted request the row is %d long, want 0", n)
	}
	if n := tr.views.inRow.Load(); n != 0 {
		t.Fatalf("after the row ended %d views count as in a row, want 0", n)
	}
}

// TestSpinLead: only a burst-1 limit's requests wake early to wait out the
// rest of their slot without a timer, by at most maxSpin and at most an
// eighth of the limit's interval.
func TestSpinLead(t *testing.T) {
	bucket := func(ls ...fleetrate.Limit) fleetrate.Bucket { return fleetrate.Bucket{Key: "{ota}/avail", Limits: ls} }
	for _, c := range []struct {
		name  string
		paced []fleetrate.Bucket
		want  time.Duration
	}{
		{"19/s burst 1", []fleetrate.Bucket{bucket(fleetrate.PerSecond(19, 1))}, maxSpin},
		{"1000/s burst 1", []fleetrate.Bucket{bucket(fleetrate.PerSecond(1000, 1))}, 125 * time.Microsecond},
		{"20/s burst 2", []fleetrate.Bucket{bucket(fleetrate.PerSecond(20, 2))}, 0},
		{"endpoint burst 2, credential burst 1", []fleetrate.Bucket{
			bucket(fleetrate.PerSecond(20, 2)), bucket(fleetrate.PerSecond(4000, 1))}, 31250 * time.Nanosecond},
	} {
		if got := spinLead(c.paced); got != c.want {
			t.Errorf("%s: spinLead = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestFirst429CountsFromTheFirstRequest: a 429 after hundreds of admitted
// requests and no pause before it (send jitter on a strict window, the
// most common first 429 there) bounds the limit as one after a pause does:
// the rate drops half as far, not by Decrease, since the process counts
// the requests since its first; a process that sent nothing before it
// knows nothing of the limit and drops by Decrease.
func TestFirst429CountsFromTheFirstRequest(t *testing.T) {
	a, _ := Adaptive{}.withDefaults()
	tr := &Transport{adaptive: a}
	b := fleetrate.Bucket{Key: "{ota}/avail", Limits: []fleetrate.Limit{fleetrate.PerSecond(19, 1)}}
	start := time.Unix(1000, 0)
	now := start.Add(49 * time.Second) // about 930 admitted
	resume := now.Add(2 * time.Second)
	ch, _, ok := tr.lower(&view{began: start}, b, now, now, resume, time.Time{}, false)
	half := 1 - (1-a.Decrease)/2
	if !ok || ch.at < half-0.01 {
		t.Fatalf("first 429 after ~930 admitted: rate %v (ok %v), want about %v (half the drop)", ch.at, ok, half)
	}
	ch, _, ok = tr.lower(&view{}, b, now, now, resume, time.Time{}, false)
	if !ok || ch.at > a.Decrease+0.01 {
		t.Fatalf("first 429 of a process that sent nothing before: rate %v (ok %v), want %v", ch.at, ok, a.Decrease)
	}
}

// TestProvenLimitOutlastsAShortStretch: run H's strict window drew a 429
// 150 ms after a resume (a request 13.6 ms late on the wire, the next on
// time), after a minute that had proven the limit at the rate: the few
// requests since the resume bounded the limit at two thirds of the rate,
// and the fleet paced at 60 % of the documented limit for the rest of the
// run. What the stretch before the pause proved now holds for that one
// 429; a second one after another short stretch shows the limit fell.
func TestProvenLimitOutlastsAShortStretch(t *testing.T) {
	a, _ := Adaptive{}.withDefaults()
	tr := &Transport{adaptive: a}
	b := fleetrate.Bucket{Key: "{ota}/avail", Limits: []fleetrate.Limit{fleetrate.PerSecond(19, 1)}}
	start := time.Unix(1000, 0)
	v := &view{began: start}

	// A long stretch, then a 429 learned from another process's pause.
	end := start.Add(30 * time.Second) // about 570 admitted
	tr.endStretch(v, 19, end)
	if v.proven < 0.99 {
		t.Fatalf("proven after ~570 admitted = %v, want ≥ 0.99", v.proven)
	}
	resumed := end.Add(2 * time.Second)
	v.paused(resumed)
	// The pause ended; the first three requests go out, the third is
	// limited: a short stretch.
	sent := resumed.Add(150 * time.Millisecond)
	ch, _, ok := tr.lower(v, b, sent, sent, sent.Add(2*time.Second), resumed, false)
	if !ok || ch.c.w < 0.99 {
		t.Fatalf("429 150ms after the resume: w = %v (ok %v), want the proven %v", ch.c.w, ok, 0.99)
	}
	half := 1 - (1-a.Decrease)/2
	if ch.at < half-0.01 {
		t.Fatalf("429 150ms after the resume: rate %v, want the half drop %v", ch.at, half)
	}
	if v.proven != 0 {
		t.Fatalf("proven after a short stretch = %v, want 0 (used once)", v.proven)
	}

	// Another short stretch: the limit fell, and the bound from above
	// says so.
	resumed2 := sent.Add(2 * time.Second)
	v.pauseUntil = resumed2
	sent2 := resumed2.Add(150 * time.Millisecond)
	from := a.factor(v.climb, sent2)
	ch, _, ok = tr.lower(v, b, sent2, sent2, sent2.Add(2*time.Second), resumed2, false)
	if !ok || ch.c.w > 0.75*from {
		t.Fatalf("second 429 after a short stretch: w = %v (ok %v), want at most %v", ch.c.w, ok, 0.75*from)
	}
}

// TestEndStretch: a stretch proves the limit only when it was long enough
// to bound it; one that ended during a pause, or at once after it,
// keeps the last proof.
func TestEndStretch(t *testing.T) {
	a, _ := Adaptive{}.withDefaults()
	tr := &Transport{adaptive: a}
	start := time.Unix(1000, 0)
	v := &view{pauseUntil: start, proven: 0.5}
	tr.endStretch(v, 19, start.Add(-time.Second))
	if v.proven != 0.5 {
		t.Fatalf("a stretch that ended during the pause: proven = %v, want 0.5 kept", v.proven)
	}
	tr.endStretch(v, 19, start.Add(50*time.Millisecond))
	if v.proven != 0.5 {
		t.Fatalf("a stretch of one slot: proven = %v, want 0.5 kept", v.proven)
	}
	tr.endStretch(v, 19, start.Add(time.Second)) // 19 sent: low = 1 − 4/18
	if want := 1 - 4.0/18; v.proven < want-0.01 || v.proven > want+0.01 {
		t.Fatalf("a stretch of 19 slots: proven = %v, want %v", v.proven, want)
	}
	none := &view{}
	tr.endStretch(none, 19, start)
	if none.proven != 0 {
		t.Fatalf("no start known: proven = %v, want 0", v.proven)
	}
}
