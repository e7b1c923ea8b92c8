package concurrency

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
	o := Options{Max: 100, Min: 4, Target: 5 * time.Millisecond}
	for _, c := range []struct {
		name      string
		limit     int64
		peak      int64
		saturated bool
		late      float64
		want      int64
	}{
		{"in time, below the limit: unchanged", 50, 10, false, 0, 50},
		{"in time, limit reached: grows by 5 %", 60, 60, false, 0.1, 63},
		{"in time, a call shed: grows at least 1", 10, 9, true, 0, 11},
		{"growth stops at max", 99, 99, true, 0, 100},
		{"half late is in time", 40, 40, true, 0.5, 42},
		{"more than half late: cut by 0.7", 40, 40, true, 0.51, 28},
		{"late below the limit: the peak is cut", 100, 30, false, 1, 21},
		{"never below min", 5, 5, true, 1, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := nextLimit(c.limit, c.peak, c.saturated, c.late, o); got != c.want {
				t.Errorf("nextLimit(%d, peak %d, saturated %v, late %v) = %d, want %d", c.limit, c.peak, c.saturated, c.late, got, c.want)
			}
		})
	}
}

// sharedCPU is a fixed timeline of a CPU shared by the decisions in
// flight: each decision takes cost of the CPU, after a round trip of rtt,
// so with k in flight each takes rtt + k*cost. Callers offer more than it
// decides; every tick admits what the limit allows and releases them
// rtt + k*cost later.
type sharedCPU struct {
	l         *Limiter
	cost, rtt time.Duration
	now       time.Time
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
		took := s.rtt + time.Duration(k)*s.cost
		for range k {
			s.l.Release(s.now, s.now.Add(took))
		}
		admitted += int(k)
		s.now = s.now.Add(max(took, time.Millisecond))
	}
	return admitted, shed
}

// TestLimitFindsTheTarget overloads a shared CPU at 1.3 ms a decision
// (32 buckets a call on one CPU), after a second of one decision at a
// time, from the default cap of 128: within two
// seconds the limit is where the queue is about the 5 ms target, with the
// CPU still busy; and it climbs back to the cap once the decisions are
// cheap.
func TestLimitFindsTheTarget(t *testing.T) {
	t.Parallel()
	l, err := New(Options{Max: 128})
	if err != nil {
		t.Fatal(err)
	}
	s := &sharedCPU{l: l, cost: 1300 * time.Microsecond, now: t0}
	s.run(time.Second, 1) // one at a time: the baseline is 1.3 ms
	s.run(2*time.Second, 200)
	// At 1.3 ms each, 5 in flight queue for 5.2 ms beyond the lone
	// decision's 1.3 ms: the limit settles between 2 and 6 and
	// oscillates there.
	for range 20 {
		s.run(100*time.Millisecond, 200)
		if got := l.Limit(); got < 2 || got > 6 {
			t.Fatalf("limit under overload at %v: %d, want 2 to 6", s.now.Sub(t0), got)
		}
	}
	admitted, shed := s.run(time.Second, 200)
	if admitted == 0 || shed == 0 {
		t.Errorf("a second of overload: %d admitted, %d shed", admitted, shed)
	}
	s.cost = 30 * time.Microsecond // cheap decisions: 128 take 3.8 ms
	s.run(10*time.Second, 200)
	if got := l.Limit(); got != 128 {
		t.Errorf("limit after 10 s of cheap decisions: %d, want the cap, 128", got)
	}
}

// TestDistantStoreIsNoQueue: decisions that each wait 12 ms for a
// distant store, longer than the 5 ms target, with the cap in flight and
// callers shed, do not cut the limit: the fastest decision of a window
// is no slower than the baseline. A stall that delays a third of them
// does not either.
func TestDistantStoreIsNoQueue(t *testing.T) {
	t.Parallel()
	l, err := New(Options{Max: 64})
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	for range 50 {
		for range 64 {
			if !l.Acquire() {
				t.Fatalf("shed at %v with limit %d", now.Sub(t0), l.Limit())
			}
		}
		if l.Acquire() {
			t.Fatal("admitted beyond the cap")
		}
		for i := range 64 {
			took := 12 * time.Millisecond
			if i%3 == 0 {
				took = 40 * time.Millisecond // a stall
			}
			l.Release(now, now.Add(took))
		}
		now = now.Add(40 * time.Millisecond)
	}
	if got := l.Limit(); got != 64 {
		t.Errorf("limit: %d, want the cap, 64", got)
	}
}

// TestStartOverloaded: a service whose first decisions are already
// queued (128 in flight at 1.3 ms each) has no faster decision to learn
// its baseline from; counting it at twice the target, the limit still
// falls, to where decisions take about three times the target.
func TestStartOverloaded(t *testing.T) {
	t.Parallel()
	l, err := New(Options{Max: 128})
	if err != nil {
		t.Fatal(err)
	}
	s := &sharedCPU{l: l, cost: 1300 * time.Microsecond, now: t0}
	s.run(time.Second, 200)
	if got := l.Limit(); got > 16 {
		t.Errorf("limit after a second of overload from the start: %d, want at most 16", got)
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
		if l.Full() {
			t.Fatalf("full with %d in flight of 3", l.InFlight())
		}
		if !l.Acquire() {
			t.Fatalf("shed with %d in flight of 3", l.InFlight())
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
	end := t0.Add(200 * time.Millisecond) // a queue of 40 times the target
	for i, a := range admitted[:10] {
		l.Release(a, end.Add(time.Duration(i)*12*time.Millisecond)) // a window of 108 ms
	}
	if got := l.Limit(); got != 28 {
		t.Fatalf("limit after a late window: %d, want 28 (cut by 0.7)", got)
	}
	for _, a := range admitted[10:] {
		l.Release(a, end.Add(time.Second))
	}
	if got := l.Limit(); got != 28 {
		t.Errorf("limit after late decisions admitted under the old limit: %d, want 28", got)
	}
}
