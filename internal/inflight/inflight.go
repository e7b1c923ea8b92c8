// Package inflight bounds the decisions a service has in flight, with a
// limit that adapts to their latency: it falls while decisions take longer
// than a target and climbs back while they do not and the limit is
// reached, between a floor and a hard cap.
//
// A fixed bound cannot fit every decision: 64 decisions of one bucket
// each queue on one CPU for about 3 ms, 64 of 32 buckets each for about
// 58 ms, far past Envoy's 20 ms deadline, and nearly every one of them
// then failed at the caller (docs/OPERATIONS.md, "Failure policy, breaker
// and load shedding"). The limit here is what keeps queueing delay under the
// target, found by additive increase and multiplicative decrease (AIMD),
// as TCP finds its congestion window: the calls beyond it are refused at
// once, and those admitted are answered in time.
//
// The controller reads time only from its callers (Acquire's admission
// time, Release's end time), so its logic is tested on a fixed timeline.
package inflight

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Options.
const (
	// DefaultTarget is Options.Target: half of Envoy's 20 ms rate-limit
	// deadline, which leaves the other half for the network, the wait
	// before the service reads a call, and the caller.
	DefaultTarget = 10 * time.Millisecond
	// DefaultInterval is Options.Interval.
	DefaultInterval = 100 * time.Millisecond
	// DefaultMin is Options.Min: a few decisions in flight keep a CPU
	// and a store connection busy.
	DefaultMin = 1
	// minSamples is how many decisions a window needs before it moves
	// the limit: fewer say little about the latency, and at so low a
	// rate the limit does not bind.
	minSamples = 10
	// overShare is the share of a window's decisions that may take longer
	// than the target without the limit falling (about its p90).
	overShare = 0.1
	// Bounds of the factor by which a late window cuts the limit: the
	// cut is the target over the window's mean latency, at most halving
	// and at least a tenth.
	minCut, maxCut = 0.5, 0.9
	// growth is the share by which a window that reached the limit in
	// time raises it (at least 1).
	growth = 0.05
)

// Options configure a Limiter.
type Options struct {
	// Max is the hard cap on decisions in flight. Required, above 0.
	Max int64
	// Target is the decision latency the limit keeps under: a window in
	// which more than a tenth of the decisions took longer cuts the
	// limit. Zero: DefaultTarget. Negative: the limit does not adapt and
	// stays at Max.
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
}

// window is what the decisions released since start tell of the limit.
type window struct {
	start time.Time
	n     int64         // decisions sampled
	over  int64         // of which took longer than the target
	total time.Duration // their summed latency
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

// Acquire claims a slot, or reports that the limit is reached. A claimed
// slot is given back with Release.
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
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w.start.IsZero() {
		l.w.start = end
	}
	if !admitted.Before(l.since) {
		took := end.Sub(admitted)
		l.w.n++
		l.w.total += took
		if took > l.opts.Target {
			l.w.over++
		}
	}
	if end.Sub(l.w.start) < l.opts.Interval || l.w.n < minSamples {
		return
	}
	limit := l.limit.Load()
	next := nextLimit(limit, l.peak.Load(), l.saturated.Load(), l.w, l.opts)
	if next != limit {
		l.limit.Store(next)
		l.since = end
	}
	l.w = window{start: end}
	l.peak.Store(l.inFlight.Load())
	l.saturated.Store(false)
}

// nextLimit is the limit after a window of decisions w, under limit, in
// which at most peak were in flight, and saturated if a call found the
// limit reached. A late window (more than a tenth of its decisions over
// the target) cuts the limit, or the peak if lower, by the target over
// the mean latency (between minCut and maxCut); a window in time that
// reached the limit raises it by growth. The limit stays between
// opts.Min and opts.Max.
func nextLimit(limit, peak int64, saturated bool, w window, o Options) int64 {
	if float64(w.over) > overShare*float64(w.n) {
		mean := w.total / time.Duration(w.n)
		cut := min(maxCut, max(minCut, float64(o.Target)/float64(mean)))
		return max(o.Min, int64(float64(min(limit, max(peak, 1)))*cut))
	}
	if saturated || peak >= limit {
		return min(o.Max, limit+max(1, int64(growth*float64(limit))))
	}
	return limit
}
