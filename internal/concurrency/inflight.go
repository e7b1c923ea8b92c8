// Package concurrency bounds the decisions a service has in flight, with a
// limit that adapts to their latency: it falls while decisions take longer
// than a target and climbs back while they do not and the limit is
// reached, between a floor and a hard cap.
//
// A fixed bound cannot fit every decision: 64 decisions of one bucket
// each queue on one CPU for about 3 ms, 64 of 32 buckets each for about
// 58 ms, far past Envoy's 20 ms deadline, and nearly every one of them
// then failed at the caller (docs/OPERATIONS.md, "Failure policy, breaker
// and load shedding"). The limit here is what keeps the queue short,
// found by additive increase and multiplicative decrease (AIMD), as TCP
// finds its congestion window: the calls beyond it are refused at once,
// and those admitted are answered in time.
//
// The signal is the queue: a decision's latency less the baseline, the
// fastest decision of the last minute or so (the store's round trip and
// the work itself; at most twice the target, for a service that starts
// overloaded). A window in which more than half of the decisions queued
// longer than the target cuts the limit. Too many decisions in flight
// delay most of them; a distant store delays the baseline as much; a
// stall of the host or a burst delays some: only the first cuts the
// limit. (The fastest decision of a window, CoDel's signal, stayed fast
// with 26 in flight of 32-bucket decisions: the store's batches answer
// some at once.)
//
// The controller reads time only from its callers (Acquire's admission
// time, Release's end time), so its logic is tested on a fixed timeline.
package concurrency

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Options.
const (
	// DefaultTarget is Options.Target: CoDel's target for a queue. Half
	// of the decisions then take at most the baseline plus 5 ms, within
	// Envoy's 20 ms with room for the slower half, the network, the wait
	// before the service reads a call and the caller.
	DefaultTarget = 5 * time.Millisecond
	// DefaultInterval is Options.Interval.
	DefaultInterval = 100 * time.Millisecond
	// DefaultMin is Options.Min: a handful of decisions are always
	// admitted, so the limit sheds an overload, never a light load on a
	// busy host (other processes' CPU reads as queueing: with two CPU
	// hogs on two cores, 2 callers' decisions queue past the target, and
	// a floor of 1 shed one of them for as long as the hogs ran).
	DefaultMin = 4
	// minSamples is how many decisions a window needs before it moves
	// the limit: fewer say little about the latency, and at so low a
	// rate the limit does not bind.
	minSamples = 10
	// baseMemory is how long the fastest decision stands as the
	// baseline: the baseline is the fastest of the last half to whole of
	// it. After a cut, decisions run with few others, so even a
	// sustained overload renews it.
	baseMemory = time.Minute
	// lateShare is the share of a window's decisions that may queue
	// longer than the target without the limit falling.
	lateShare = 0.5
	// cut is the factor by which a late window cuts the limit.
	cut = 0.7
	// growth is the share by which a window that reached the limit in
	// time raises it (at least 1).
	growth = 0.05
)

// Options configure a Limiter.
type Options struct {
	// Max is the hard cap on decisions in flight. Required, above 0.
	Max int64
	// Target is the queue the limit keeps the median decision under: a
	// window in which more than half of the decisions took longer than
	// the baseline (the fastest of the last minute or so) by more cuts
	// the limit. Zero: DefaultTarget.
	// Negative: the limit does not adapt and stays at Max.
	Target time.Duration
	// Interval is the shortest window of decisions whose latency moves
	// the limit. Zero: DefaultInterval.
	Interval time.Duration
	// Min is the floor of the limit. Zero: DefaultMin, or Max if lower.
	Min int64
}

// Limiter counts the decisions in flight and refuses those beyond its
// limit. It is safe for concurrent use.
type Limiter struct {
	opts     Options
	limit    atomic.Int64
	inFlight atomic.Int64
	// peak is the most in flight in the current window, and saturated
	// says that an Acquire found the limit reached in it.
	peak      atomic.Int64
	saturated atomic.Bool

	mu sync.Mutex
	w  window
	// since is when the limit last changed: decisions admitted before
	// it ran under the old limit and are not samples of the new one.
	since time.Time
	// base is the baseline: the fastest decision since baseStart
	// (baseCur) and in the half of baseMemory before it (basePrev); 0
	// for none.
	baseStart         time.Time
	baseCur, basePrev time.Duration
}

// window is what the decisions released since start tell of the limit.
type window struct {
	start time.Time
	n     int64 // decisions sampled
	late  int64 // of which queued longer than the target
}

// New returns a Limiter, or an error naming the invalid option.
func New(opts Options) (*Limiter, error) {
	if opts.Max <= 0 {
		return nil, fmt.Errorf("inflight: max in flight must be above 0, got %d", opts.Max)
	}
	if opts.Min < 0 || opts.Interval < 0 {
		return nil, fmt.Errorf("inflight: min (%d) and interval (%v) must not be negative", opts.Min, opts.Interval)
	}
	if opts.Target == 0 {
		opts.Target = DefaultTarget
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Min == 0 {
		opts.Min = DefaultMin
	}
	opts.Min = min(opts.Min, opts.Max)
	l := &Limiter{opts: opts}
	l.limit.Store(opts.Max)
	return l, nil
}

// Adaptive reports whether the limit adapts (Options.Target is not
// negative).
func (l *Limiter) Adaptive() bool { return l.opts.Target > 0 }

// Max is the hard cap.
func (l *Limiter) Max() int64 { return l.opts.Max }

// Limit is the current limit on decisions in flight.
func (l *Limiter) Limit() int64 { return l.limit.Load() }

// InFlight is the decisions in flight.
func (l *Limiter) InFlight() int64 { return l.inFlight.Load() }

// Full reports whether the limit is reached: a cheap check before a call
// is read, ahead of Acquire.
func (l *Limiter) Full() bool {
	if l.inFlight.Load() >= l.limit.Load() {
		l.saturated.Store(true)
		return true
	}
	return false
}

// Acquire claims a slot, or reports that the limit is reached. A
// claimed slot is given back with Release or Forget.
func (l *Limiter) Acquire() bool {
	n := l.inFlight.Add(1)
	if n > l.limit.Load() {
		l.inFlight.Add(-1)
		if !l.saturated.Load() {
			l.saturated.Store(true)
		}
		return false
	}
	if n > l.peak.Load() {
		l.peak.Store(n) // a racing smaller store only delays growth a window
	}
	return true
}

// Forget gives back a slot whose decision says nothing of the limit: it
// failed (the store's failures are a circuit breaker's business, and a
// store that times out is not a sign of too many decisions in flight)
// or its caller gave up.
func (l *Limiter) Forget() { l.inFlight.Add(-1) }

// Release gives back a slot claimed at admitted by a decision that ended
// at end, whose latency is a sample of the limit.
func (l *Limiter) Release(admitted, end time.Time) {
	l.inFlight.Add(-1)
	if !l.Adaptive() {
		return
	}
	took := end.Sub(admitted)
	l.mu.Lock()
	defer l.mu.Unlock()
	// The baseline counts for at most twice the target: a service that
	// starts under overload has no faster decision to learn it from.
	base := min(l.baseline(end, took), 2*l.opts.Target)
	if l.w.start.IsZero() {
		l.w.start = end
	}
	if !admitted.Before(l.since) {
		l.w.n++
		if took-base > l.opts.Target {
			l.w.late++
		}
	}
	if end.Sub(l.w.start) < l.opts.Interval || l.w.n < minSamples {
		return
	}
	limit := l.limit.Load()
	next := nextLimit(limit, l.peak.Load(), l.saturated.Load(), float64(l.w.late)/float64(l.w.n), l.opts)
	if next != limit {
		l.limit.Store(next)
		l.since = end
	}
	l.w = window{start: end}
	l.peak.Store(l.inFlight.Load())
	l.saturated.Store(false)
}

// baseline takes in a decision that took took and ended at end, and
// returns the baseline: the fastest decision of the last half to whole
// baseMemory. l.mu is held.
func (l *Limiter) baseline(end time.Time, took time.Duration) time.Duration {
	if l.baseStart.IsZero() || end.Sub(l.baseStart) >= baseMemory/2 {
		l.basePrev, l.baseCur, l.baseStart = l.baseCur, took, end
		if l.basePrev == 0 {
			l.basePrev = took
		}
	}
	l.baseCur = min(l.baseCur, took)
	return min(l.baseCur, l.basePrev)
}

// nextLimit is the limit after a window under limit in which at most
// peak decisions were in flight, saturated if a call found the limit
// reached, and of whose decisions the share late queued longer than the
// target. A late window (a share over lateShare) cuts the limit, or the
// peak if lower, by cut; a window in time that reached the limit raises
// it by growth. The limit stays between opts.Min and opts.Max.
func nextLimit(limit, peak int64, saturated bool, late float64, o Options) int64 {
	if late > lateShare {
		return max(o.Min, int64(float64(min(limit, max(peak, 1)))*cut))
	}
	if saturated || peak >= limit {
		return min(o.Max, limit+max(1, int64(growth*float64(limit))))
	}
	return limit
}
