package fleetrate

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestAnchorNeverEarlyNeverLate drives the anchor with random round trips
// against a store whose clock runs a fixed offset from the local one: every
// slot it computes lies between the true slot and answered + wait, and
// once a fast round trip anchored it, a slow reply no longer delays the
// wake-up by the reply's lateness.
func TestAnchorNeverEarlyNeverLate(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	base := time.Unix(1_800_000_000, 0)
	offset := 2*time.Hour + 123456789*time.Nanosecond // store clock minus local clock
	var a anchor
	now := base
	var helped int
	for i := range 5000 {
		now = now.Add(time.Duration(rng.Int64N(int64(5 * time.Millisecond))))
		start := now
		// The decision happens somewhere in the round trip; the reply may
		// then sit unread for a long time.
		up := time.Duration(rng.Int64N(int64(200 * time.Microsecond)))
		late := time.Duration(rng.Int64N(int64(100 * time.Microsecond)))
		if rng.IntN(10) == 0 {
			late = time.Duration(rng.Int64N(int64(10 * time.Millisecond)))
		}
		decided := start.Add(up)
		answered := decided.Add(late)
		wait := time.Duration(rng.Int64N(int64(50 * time.Millisecond)))
		res := Result{Allowed: true, Wait: wait, At: decided.Add(offset).Truncate(time.Microsecond)}
		got := a.due(start, answered, res)
		trueSlot := decided.Add(wait)
		if got.Before(trueSlot) {
			t.Fatalf("call %d: due %v is %v before the slot", i, got, trueSlot.Sub(got))
		}
		if got.After(answered.Add(wait)) {
			t.Fatalf("call %d: due %v is after answered + wait", i, got)
		}
		if late > time.Millisecond && got.Sub(trueSlot) < late/2 {
			helped++
		}
	}
	if helped == 0 {
		t.Fatal("no slow reply was ever timed from the decision")
	}
}

// TestAnchorClamps checks the bounds: without a store clock the slot counts
// from the answer, and a store clock that jumps (a failover to a host
// whose clock differs) cannot move a slot before start + wait or after
// answered + wait.
func TestAnchorClamps(t *testing.T) {
	base := time.Unix(1_800_000_000, 0)
	var a anchor
	wait := 10 * time.Millisecond
	if got := a.due(base, base.Add(time.Millisecond), Result{Wait: wait}); !got.Equal(base.Add(time.Millisecond + wait)) {
		t.Fatalf("no store clock: %v", got.Sub(base))
	}
	// Anchor with a fast round trip, store clock equal to local.
	a.due(base, base.Add(20*time.Microsecond), Result{At: base.Add(10 * time.Microsecond)})
	start := base.Add(100 * time.Millisecond)
	answered := start.Add(2 * time.Millisecond)
	for _, jump := range []time.Duration{-time.Minute, time.Minute} {
		res := Result{Wait: wait, At: start.Add(time.Millisecond + jump)}
		got := a.due(start, answered, res)
		if got.Before(start.Add(wait)) || got.After(answered.Add(wait)) {
			t.Fatalf("store clock jumped %v: due %v after start, want within [%v, %v]", jump, got.Sub(start), wait, answered.Sub(start)+wait)
		}
	}
	// An anchor older than anchorAge is replaced by the next sample, even
	// a slower one.
	later := base.Add(anchorAge + time.Second)
	a.due(later, later.Add(time.Millisecond), Result{At: later.Add(500 * time.Microsecond)})
	if !a.local.Equal(later.Add(500*time.Microsecond)) || a.rtt != time.Millisecond {
		t.Fatalf("stale anchor kept: local %v rtt %v", a.local.Sub(later), a.rtt)
	}
}

// TestAnchorSkips: degraded results (timed by a local fallback) and stores
// with several clocks count from the answer.
func TestAnchorSkips(t *testing.T) {
	base := time.Unix(1_800_000_000, 0)
	wait := 10 * time.Millisecond
	for _, tc := range []struct {
		name string
		off  bool
		res  Result
	}{
		{"degraded", false, Result{Wait: wait, At: base.Add(time.Millisecond), Degraded: true}},
		{"several clocks", true, Result{Wait: wait, At: base.Add(time.Millisecond)}},
	} {
		a := &anchor{off: tc.off}
		a.due(base.Add(-time.Second), base.Add(-time.Second+20*time.Microsecond), Result{At: base.Add(-time.Second)})
		answered := base.Add(5 * time.Millisecond)
		if got := a.due(base, answered, tc.res); !got.Equal(answered.Add(wait)) {
			t.Errorf("%s: due %v after start, want answered + wait", tc.name, got.Sub(base))
		}
	}
}
