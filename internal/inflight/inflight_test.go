package inflight

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

func TestNewRejectsBadOptions(t *testing.T) {
	t.Parallel()
	for _, o := range []Options{{}, {Max: -1}, {Max: 8, Min: -1}, {Max: 8, Interval: -time.Second}} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v): no error", o)
		}
	}
	l, err := New(Options{Max: 2, Min: 3})
	if err != nil {
		t.Fatal(err)
	}
	if l.opts.Min != 2 || l.opts.Target != DefaultTarget || l.opts.Interval != DefaultInterval || l.Limit() != 2 {
		t.Errorf("defaults: %+v, limit %d", l.opts, l.Limit())
	}
}

func TestNextLimit(t *testing.T) {
	t.Parallel()
	o := Options{Max: 100, Min: 4, Target: 10 * time.Millisecond}
	win := func(n, over int64, mean time.Duration) window {
		return window{n: n, over: over, total: time.Duration(n) * mean}
	}
	for _, c := range []struct {
		name      string
		limit     int64
		peak      int64
		saturated bool
		w         window
		want      int64
	}{
		{"in time, below the limit: unchanged", 50, 10, false, win(100, 0, time.Millisecond), 50},
		{"in time, limit reached: grows by 5 %", 60, 60, false, win(100, 0, time.Millisecond), 63},
		{"in time, a call shed: grows at least 1", 10, 9, true, win(100, 10, time.Millisecond), 11},
		{"growth stops at max", 99, 99, true, win(100, 0, time.Millisecond), 100},
		{"a tenth late is in time", 40, 40, true, win(100, 10, 20*time.Millisecond), 42},
		{"late at 2x the target: halved", 40, 40, true, win(100, 50, 20*time.Millisecond), 20},
		{"late at 10x: halved, no more", 40, 40, true, win(100, 50, 100*time.Millisecond), 20},
		{"barely late: cut by a tenth", 40, 40, true, win(100, 50, 10500*time.Microsecond), 36},
		{"late below the limit: the peak is cut", 100, 30, false, win(100, 50, 20*time.Millisecond), 15},
		{"never below min", 6, 6, true, win(100, 90, 50*time.Millisecond), 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := nextLimit(c.limit, c.peak, c.saturated, c.w, o); got != c.want {
				t.Errorf("nextLimit(%d, peak %d, saturated %v, %+v) = %d, want %d", c.limit, c.peak, c.saturated, c.w, got, c.want)
			}
		})
	}
}

// sharedCPU is a fixed timeline of a CPU shared by the decisions in
// flight: each decision takes cost of the CPU, so with k in flight each
// takes k*cost. Callers offer more than it decides; every tick admits
// what the limit allows and releases them k*cost later.
type sharedCPU struct {
	l    *Limiter
	cost time.Duration
	now  time.Time
}

// run offers offered calls per tick for d and returns the decisions
// admitted, those shed and the latest limit.
func (s *sharedCPU) run(d time.Duration, offered int) (admitted, shed int) {
	end := s.now.Add(d)
	for s.now.Before(end) {
		var k int64
		for range offered {
			if s.l.Acquire() {
				k++
			} else {
				shed++
			}
		}
		took := time.Duration(k) * s.cost
		for range k {
			s.l.Release(s.now, s.now.Add(took))
		}
		admitted += int(k)
		s.now = s.now.Add(max(took, time.Millisecond))
	}
	return admitted, shed
}

// TestLimitFindsTheTarget overloads a shared CPU at 1.3 ms a decision
// (32 buckets a call on one CPU) from the default cap of 128: within two
// seconds the limit is where decisions take no longer than the target,
// with the CPU still busy; when the overload ends it stays, and it climbs
// back to the cap once the decisions are cheap.
func TestLimitFindsTheTarget(t *testing.T) {
	t.Parallel()
	l, err := New(Options{Max: 128})
	if err != nil {
		t.Fatal(err)
	}
	s := &sharedCPU{l: l, cost: 1300 * time.Microsecond, now: t0}
	s.run(2*time.Second, 200)
	// At 1.3 ms each, 7 in flight take 9.1 ms: the limit settles
	// between 3 and 8 and oscillates there.
	for range 20 {
		s.run(100*time.Millisecond, 200)
		if got := l.Limit(); got < 3 || got > 8 {
			t.Fatalf("limit under overload at %v: %d, want 3 to 8", s.now.Sub(t0), got)
		}
	}
	admitted, shed := s.run(time.Second, 200)
	if admitted == 0 || shed == 0 {
		t.Errorf("a second of overload: %d admitted, %d shed", admitted, shed)
	}
	s.cost = 50 * time.Microsecond // cheap decisions: 128 take 6.4 ms
	s.run(10*time.Second, 200)
	if got := l.Limit(); got != 128 {
		t.Errorf("limit after 10 s of cheap decisions: %d, want the cap, 128", got)
	}
}

// TestLimitHoldsWhenNotReached: a store slower than the target, with the
// limit never reached, cuts the limit to the peak in flight, not below
// what the callers use: a slow store is not overload.
func TestLimitHoldsWhenNotReached(t *testing.T) {
	t.Parallel()
	l, err := New(Options{Max: 64, Target: 10 * time.Millisecond, Min: 2})
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	for range 50 {
		for range 20 {
			if !l.Acquire() {
				t.Fatalf("shed at %v with limit %d", now.Sub(t0), l.Limit())
			}
			l.Release(now, now.Add(12*time.Millisecond))
			now = now.Add(12 * time.Millisecond)
		}
	}
	if got := l.Limit(); got != 2 {
		t.Errorf("limit: %d, want the floor (one in flight at a time, each late)", got)
	}
	// One at a time is still admitted: the floor is above what is used.
	if !l.Acquire() {
		t.Error("a lone call is shed")
	}
}

// TestFixedLimit: a negative target keeps the limit at the cap.
func TestFixedLimit(t *testing.T) {
	t.Parallel()
	l, err := New(Options{Max: 3, Target: -1})
	if err != nil {
		t.Fatal(err)
	}
	s := &sharedCPU{l: l, cost: 100 * time.Millisecond, now: t0}
	if _, shed := s.run(5*time.Second, 5); shed == 0 || l.Limit() != 3 {
		t.Errorf("fixed: shed %d, limit %d; want sheds at limit 3", shed, l.Limit())
	}
	for range 3 {
		if l.Full() || !l.Acquire() {
			t.Fatalf("full or shed with %d in flight of 3", l.InFlight())
		}
	}
	if !l.Full() || l.Acquire() {
		t.Errorf("not full, or admitted, with %d in flight of 3", l.InFlight())
	}
}

// TestSamplesOfTheOldLimitIgnored: decisions admitted before the limit
// changed do not move it again.
func TestSamplesOfTheOldLimitIgnored(t *testing.T) {
	t.Parallel()
	l, err := New(Options{Max: 40, Min: 1})
	if err != nil {
		t.Fatal(err)
	}
	var admitted []time.Time
	for i := range 40 {
		if !l.Acquire() {
			t.Fatal("shed below the limit")
		}
		admitted = append(admitted, t0.Add(time.Duration(i)*time.Microsecond))
	}
	end := t0.Add(200 * time.Millisecond) // each 20 times the target
	for i, a := range admitted[:10] {
		l.Release(a, end.Add(time.Duration(i)*12*time.Millisecond)) // a window of 108 ms
	}
	if got := l.Limit(); got != 20 {
		t.Fatalf("limit after a late window: %d, want 20 (halved)", got)
	}
	for _, a := range admitted[10:] {
		l.Release(a, end.Add(time.Second))
	}
	if got := l.Limit(); got != 20 {
		t.Errorf("limit after late decisions admitted under the old limit: %d, want 20", got)
	}
}
