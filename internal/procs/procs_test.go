package procs

import (
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestGovernorNext(t *testing.T) {
	g := governor{quiet: 0.75, busy: 0.85, settle: 3}
	steps := []struct {
		n    int
		cpus float64
		want int
	}{
		{4, 0.5, 4}, // quiet 1
		{4, 0.5, 4}, // quiet 2
		{4, 0.9, 4}, // busy: the count starts again
		{4, 0.1, 4}, // quiet 1
		{4, 0.1, 4}, // quiet 2
		{4, 0.74, 1},
		{1, 0.85, 1}, // at the threshold: not above it
		{1, 0.2, 1},
		{1, 0.86, 2}, // above: back to more than one
		{4, 0.75, 4}, // at the quiet threshold: not quiet
		{4, 0.0, 4},
	}
	for i, s := range steps {
		if got := g.next(s.n, s.cpus); got != s.want {
			t.Fatalf("step %d: next(%d, %.2f) = %d, want %d", i, s.n, s.cpus, got, s.want)
		}
	}
}

// fake is a process whose CPU use per sample follows a script, and
// whose GOMAXPROCS settings are recorded.
type fake struct {
	mu      sync.Mutex
	full    int
	n       int
	used    time.Duration
	last    time.Time
	load    func(n int) float64 // CPUs used at n processors
	history []int
}

func (f *fake) options() Options {
	return Options{
		cpu: func() (time.Duration, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			now := time.Now()
			if !f.last.IsZero() {
				f.used += time.Duration(f.load(f.n) * float64(now.Sub(f.last)))
			}
			f.last = now
			return f.used, nil
		},
		gomaxprocs: func(n int) int {
			f.mu.Lock()
			defer f.mu.Unlock()
			prev := f.n
			if n > 0 {
				f.n = n
				f.history = append(f.history, n)
			}
			return prev
		},
		setDefault: func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.n != f.full {
				f.n = f.full
				f.history = append(f.history, f.full)
			}
		},
		fixed: func() bool { return false },
	}
}

func (f *fake) procs() (int, []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n, append([]int(nil), f.history...)
}

func TestGovernFollowsTheLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		demand := 0.0 // CPUs of work at Go's default
		f := &fake{full: 8, n: 8, load: func(n int) float64 {
			mu.Lock()
			defer mu.Unlock()
			if n == 1 {
				return min(demand*0.7, 1) // one processor: less CPU for the same work
			}
			return demand
		}}
		stop, err := Start(f.options())
		if err != nil {
			t.Fatal(err)
		}

		// Each step sets the demand at a sample's middle, sleeps, and
		// reads the count half a sample before the next one.
		step := func(d float64, samples int) int {
			mu.Lock()
			demand = d
			mu.Unlock()
			time.Sleep(time.Duration(samples) * DefaultInterval)
			n, _ := f.procs()
			return n
		}
		time.Sleep(DefaultInterval / 2)

		// Quiet: one processor after DefaultSettle samples, not before.
		if n := step(0.3, DefaultSettle-1); n != 8 {
			t.Fatalf("after %d quiet samples: %d processors, want 8 still", DefaultSettle-1, n)
		}
		if n := step(0.3, 1); n != 1 {
			t.Fatalf("after %d quiet samples: %d processors, want 1", DefaultSettle, n)
		}
		// Busy: one processor saturates. The sample the change falls in
		// is half busy; the first whole busy one gives the default back.
		if n := step(3, 2); n != 8 {
			t.Fatalf("busy at one processor: %d processors, want 8 back after one whole busy sample", n)
		}
		// A load between the thresholds stays where it is.
		if n := step(0.8, 20); n != 8 {
			t.Fatalf("at 0.8 CPUs: %d processors, want 8", n)
		}
		step(0.1, 20)
		stop()
		n, history := f.procs()
		if n != 8 {
			t.Fatalf("after stop: %d processors, want Go's default 8", n)
		}
		if want := []int{1, 8, 1, 8}; !slices.Equal(history, want) {
			t.Fatalf("settings %v, want %v", history, want)
		}
	})
}

func TestGovernRefuses(t *testing.T) {
	f := &fake{full: 8, n: 8, load: func(int) float64 { return 0 }}
	opts := f.options()
	opts.fixed = func() bool { return true }
	if _, err := Start(opts); !errors.Is(err, ErrFixed) {
		t.Fatalf("GOMAXPROCS set: %v, want ErrFixed", err)
	}
	one := &fake{full: 1, n: 1, load: func(int) float64 { return 0 }}
	if _, err := Start(one.options()); !errors.Is(err, ErrOneCPU) {
		t.Fatalf("one CPU: %v, want ErrOneCPU", err)
	}
	if _, h := one.procs(); len(h) != 0 {
		t.Fatalf("one CPU: settings %v, want none", h)
	}
	for _, c := range []struct {
		opts Options
		name string
	}{
		{Options{Interval: -time.Second}, "Interval"},
		{Options{Interval: time.Microsecond}, "Interval must be at least 1ms"},
		{Options{Quiet: -1}, "Quiet"},
		{Options{Quiet: math.NaN()}, "Quiet"},
		{Options{Busy: 1.5}, "Busy"},
		{Options{Busy: 1}, "Busy"},
		{Options{Busy: -0.5}, "Busy"},
		{Options{Busy: math.NaN()}, "Busy"},
		{Options{Quiet: 0.9, Busy: 0.8}, "Quiet (0.9) must be below Options.Busy"},
		{Options{Settle: -2}, "Settle"},
	} {
		_, err := Start(c.opts)
		if err == nil || !strings.Contains(err.Error(), c.name) {
			t.Errorf("Start(%+v) = %v, want an error naming %s", c.opts, err, c.name)
		}
	}
}

func TestGovernOnePerProcess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{full: 4, n: 4, load: func(int) float64 { return 0 }}
		stop, err := Start(f.options())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Start(f.options()); !errors.Is(err, ErrRunning) {
			t.Fatalf("a second governor: %v, want ErrRunning", err)
		}
		stop()
		stop() // twice is fine
		// The first one's end frees the place.
		stop, err = Start(f.options())
		if err != nil {
			t.Fatalf("a governor after the first ended: %v", err)
		}
		stop()
	})
}

func TestGovernStopsOnUnreadableCPU(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{full: 4, n: 4, load: func(int) float64 { return 0 }}
		opts := f.options()
		calls := 0
		read := opts.cpu
		opts.cpu = func() (time.Duration, error) {
			calls++
			if calls > DefaultSettle+1 { // the first reading and the samples that go down to one
				return 0, errors.New("gone")
			}
			return read()
		}
		stop, err := Start(opts)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(DefaultInterval * (DefaultSettle + 2))
		synctest.Wait()
		if n, h := f.procs(); n != 4 || !slices.Equal(h, []int{1, 4}) {
			t.Fatalf("after the CPU time became unreadable: %d processors (settings %v), want one, then Go's default 4", n, h)
		}
		stop()
	})
}

// TestProcessCPUAdvances: the real reading grows as the process works,
// and stays put when read twice in a row with no work between (or grows a
// little), never back.
func TestProcessCPUAdvances(t *testing.T) {
	a, err := processCPU()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	b := a
	for b <= a && time.Now().Before(deadline) {
		if b, err = processCPU(); err != nil {
			t.Fatal(err)
		}
	}
	if b <= a {
		t.Fatalf("10 s of spinning read no more CPU time: %v, then %v", a, b)
	}
}

func TestGovernUnreadableAtStart(t *testing.T) {
	f := &fake{full: 4, n: 4, load: func(int) float64 { return 0 }}
	opts := f.options()
	opts.cpu = func() (time.Duration, error) { return 0, errors.New("no rusage") }
	if _, err := Start(opts); err == nil || !strings.Contains(err.Error(), "no rusage") {
		t.Fatalf("Start with an unreadable CPU time: %v, want its error", err)
	}
	if _, h := f.procs(); len(h) != 0 {
		t.Fatalf("settings %v, want none", h)
	}
	// The place is free again.
	synctest.Test(t, func(t *testing.T) {
		stop, err := Start(f.options())
		if err != nil {
			t.Fatalf("Start after a failed one: %v", err)
		}
		stop()
	})
}

// TestGovernSkipsSamplesThatGoBack: a CPU time that goes back (a thread's
// accounting corrected, a hook's quirk) is no sample, not a quiet one.
func TestGovernSkipsSamplesThatGoBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{full: 4, n: 4, load: func(int) float64 { return 0 }}
		opts := f.options()
		var used time.Duration
		opts.cpu = func() (time.Duration, error) {
			used -= time.Millisecond // always back
			return used, nil
		}
		stop, err := Start(opts)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(DefaultInterval * (DefaultSettle + 5))
		if n, h := f.procs(); n != 4 || len(h) != 0 {
			t.Fatalf("%d processors (settings %v), want Go's default 4 and no change", n, h)
		}
		stop()
	})
}
