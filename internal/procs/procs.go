// Package procs sets the Go runtime's processor count (GOMAXPROCS) by the
// process's load: one processor while the process uses less than about
// three quarters of one CPU, and Go's default (the CPUs, or the CPU limit
// of the process's cgroup) as soon as one processor is nearly busy.
//
// A lightly loaded network service spends much of its CPU on the Go
// scheduler rather than on its work: each goroutine that another makes
// runnable (a connection's reader handing a request to a handler, the
// handler its response to a writer) wakes an idle processor's thread,
// which spins looking for work before it sleeps again. With one processor
// those hand-offs are goroutine switches on one thread. fleetrate serve
// measured about 0.7 times the CPU per decision with one processor at a
// single caller (docs/BENCHMARKS.md); a load that needs more than one
// processor gets Go's default back within two samples (the sample it
// starts in, and the first whole one above the busy threshold).
package procs

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Options.
const (
	// DefaultInterval is how often the process's CPU use is sampled.
	DefaultInterval = 100 * time.Millisecond
	// DefaultQuiet is the CPU use (in CPUs, averaged over a sample) under
	// which the process is quiet enough for one processor.
	DefaultQuiet = 0.75
	// DefaultBusy is the CPU use over a sample, at one processor, above
	// which the process gets Go's default processor count back.
	DefaultBusy = 0.85
	// DefaultSettle is how many quiet samples in a row it takes to go down
	// to one processor.
	DefaultSettle = 5
	// MinInterval is the shortest Options.Interval: a sample costs a
	// system call, and a change a stop of the world.
	MinInterval = time.Millisecond
)

// ErrRunning is returned by Start when another governor already runs in
// this process: there is one processor count per process.
var ErrRunning = errors.New("procs: a governor already runs in this process")

// ErrFixed is returned by Start when the GOMAXPROCS environment variable
// is set: the operator chose the count.
var ErrFixed = errors.New("procs: GOMAXPROCS is set in the environment")

// ErrOneCPU is returned by Start when Go's default is already one
// processor: there is nothing to govern.
var ErrOneCPU = errors.New("procs: Go's default is one processor")

// Options tune a governor. The zero value is the defaults.
type Options struct {
	// Interval between samples of the process's CPU use (DefaultInterval
	// when zero; at least MinInterval). Going back to Go's default takes
	// at most two intervals of load.
	Interval time.Duration
	// Quiet is the CPU use, in CPUs averaged over a sample, under which a
	// sample is quiet (DefaultQuiet when zero). It must be below Busy.
	Quiet float64
	// Busy is the CPU use over a sample at one processor above which the
	// governor restores Go's default (DefaultBusy when zero). It must be
	// below 1: one processor's process seldom uses more than one CPU.
	Busy float64
	// Settle is how many quiet samples in a row bring the process down to
	// one processor (DefaultSettle when zero).
	Settle int
	// Logger gets a debug line at each change (none when nil).
	Logger *slog.Logger

	// Hooks for tests: the process's CPU time so far, Go's GOMAXPROCS
	// setting (n < 1 reads it), restoring Go's default, and whether the
	// GOMAXPROCS environment variable is set.
	cpu        func() (time.Duration, error)
	gomaxprocs func(n int) int
	setDefault func()
	fixed      func() bool
}

// running is set while a governor runs in this process.
var running atomic.Bool

// Start governs GOMAXPROCS by the process's CPU use, from a goroutine of
// its own, until stop is called; stop restores Go's default and returns
// once the governor has ended (stop may be called more than once).
//
// Start first sets Go's default (runtime.SetDefaultGOMAXPROCS): a count
// the program set itself is replaced, and stays replaced when Start
// returns ErrOneCPU. It returns at once, governing nothing, with ErrFixed,
// ErrOneCPU or ErrRunning when there is nothing for it to do, with an
// error naming the field when opts is invalid, and with an error when the
// process's CPU time cannot be read.
func Start(opts Options) (stop func(), err error) {
	opts.fill()
	if err := opts.check(); err != nil {
		return nil, err
	}
	if opts.fixed() {
		return nil, ErrFixed
	}
	if !running.CompareAndSwap(false, true) {
		return nil, ErrRunning
	}
	started := false
	defer func() {
		if !started { // every early return, and a hook's panic
			running.Store(false)
		}
	}()
	last, err := opts.cpu()
	if err != nil {
		return nil, fmt.Errorf("procs: reading the process's CPU time: %w", err)
	}
	opts.setDefault()
	if opts.gomaxprocs(0) <= 1 {
		return nil, ErrOneCPU
	}
	quit, done := make(chan struct{}), make(chan struct{})
	started = true
	go func() {
		defer close(done)
		defer running.Store(false)
		defer opts.setDefault()
		opts.govern(quit, last)
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-done
	}, nil
}

// govern samples the CPU every interval until quit closes, from last,
// the CPU time so far.
func (opts *Options) govern(quit <-chan struct{}, last time.Duration) {
	g := governor{quiet: opts.Quiet, busy: opts.Busy, settle: opts.Settle}
	tick := time.NewTicker(opts.Interval)
	defer tick.Stop()
	prev := time.Now()
	for {
		select {
		case <-quit:
			return
		case <-tick.C:
		}
		used, err := opts.cpu()
		// The time of the reading, not the tick's: a tick read late would
		// otherwise divide the CPU of one span by the length of another.
		now := time.Now()
		if err != nil {
			// Unreadable now after a first reading: keep Go's default
			// rather than a count chosen blind.
			if opts.Logger != nil {
				opts.Logger.Warn("processors: Go's default from now on: the process's CPU time cannot be read", "err", err)
			}
			return
		}
		elapsed := now.Sub(prev)
		if elapsed <= 0 || used < last {
			// No time passed, or a CPU time that went back: no sample;
			// the next one spans from the last good reading.
			continue
		}
		cpus := float64(used-last) / float64(elapsed)
		last, prev = used, now
		// Read each time: the runtime follows a cgroup's new CPU limit
		// by itself while at its default.
		n := opts.gomaxprocs(0)
		next := g.next(n, cpus)
		if next == n {
			continue
		}
		if next == 1 {
			opts.gomaxprocs(1)
		} else {
			// Go's default again, with its automatic updates (a cgroup's
			// new CPU limit) that setting a count turned off.
			opts.setDefault()
			next = opts.gomaxprocs(0)
		}
		if opts.Logger != nil {
			opts.Logger.Debug("processors", "from", n, "to", next, "cpus_used", math.Round(cpus*100)/100)
		}
	}
}

func (o *Options) fill() {
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.Quiet == 0 {
		o.Quiet = DefaultQuiet
	}
	if o.Busy == 0 {
		o.Busy = DefaultBusy
	}
	if o.Settle == 0 {
		o.Settle = DefaultSettle
	}
	if o.cpu == nil {
		o.cpu = processCPU
	}
	if o.gomaxprocs == nil {
		o.gomaxprocs = runtime.GOMAXPROCS
	}
	if o.setDefault == nil {
		o.setDefault = runtime.SetDefaultGOMAXPROCS
	}
	if o.fixed == nil {
		o.fixed = func() bool { return os.Getenv("GOMAXPROCS") != "" }
	}
}

func (o *Options) check() error {
	switch {
	case o.Interval < MinInterval:
		return fmt.Errorf("procs: Options.Interval must be at least %v, got %v", MinInterval, o.Interval)
	case !(o.Quiet > 0):
		return fmt.Errorf("procs: Options.Quiet must be above 0, got %v", o.Quiet)
	case !(o.Busy > 0 && o.Busy < 1):
		return fmt.Errorf("procs: Options.Busy must be above 0 and below 1 (one processor's CPU), got %v", o.Busy)
	case o.Quiet >= o.Busy:
		return fmt.Errorf("procs: Options.Quiet (%v) must be below Options.Busy (%v), or the count would swing at every sample", o.Quiet, o.Busy)
	case o.Settle < 0:
		return fmt.Errorf("procs: Options.Settle must not be negative, got %d", o.Settle)
	}
	return nil
}

// governor decides the processor count from one sample to the next.
type governor struct {
	quiet, busy float64
	settle      int
	calm        int // quiet samples in a row at more than one processor
}

// next returns the processor count after a sample in which the process
// used cpus CPUs with n processors: one after settle quiet samples in a
// row, and back to more than one (full, any count above 1 here) after one
// busy sample at one processor.
func (g *governor) next(n int, cpus float64) int {
	if n == 1 {
		if cpus > g.busy {
			return 2 // more than one: Start's governor reads Go's default
		}
		return 1
	}
	if cpus >= g.quiet {
		g.calm = 0
		return n
	}
	g.calm++
	if g.calm < g.settle {
		return n
	}
	g.calm = 0
	return 1
}
