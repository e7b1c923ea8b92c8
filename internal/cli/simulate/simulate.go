// Package simulate plays the same client traffic through a fixed-window
// counter and through fleetrate's token bucket, second by second on a
// simulated clock, to show the two faults of fixed windows that the bucket
// avoids:
//
//   - cron-driven clients stampede at every :00, and a fixed window lets
//     the whole stampede through at once (and, once it is exhausted, tells
//     every refused client to come back at the next :00);
//   - a client can spend a whole quota just before a window boundary and a
//     whole quota again just after it: twice the quota in a short span.
//
// The token bucket side is the real thing: a fleetrate.Limiter over a
// memstore whose clock is the simulation's. The fixed window exists only
// here, as the comparison.
//
// RunMonth plays a month instead (month.go): customers' traffic through a
// calendar quota with a smoothing bucket, a fixed window of the month, a
// bare bucket refilled at the month's average rate and the quota alone,
// to show what a plan's customer sees: a quota spent early comes back on
// the 1st, and smoothing keeps a fixed window's double quota off the
// boundary.
package simulate

import (
	"container/heap"
	"context"
	"fmt"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/headers"
	"github.com/fleetrate/fleetrate/memstore"
)

// Defaults applied by Run when a Config field is zero. They match the
// example message service: 600 requests a minute, which the token bucket
// enforces as 10/s with a burst of 20.
const (
	DefaultDuration     = 3 * time.Minute
	DefaultWindow       = time.Minute
	DefaultQuota        = 600
	DefaultBurst        = 20
	DefaultCronClients  = 10
	DefaultCronBatch    = 100
	DefaultBoundary     = time.Minute
	DefaultBoundarySpan = 10 * time.Second
	DefaultSpan         = 20 * time.Second
)

// MaxEvents bounds the requests (first tries and retries) one run may
// simulate, so that no configuration can run for long.
const MaxEvents = 5_000_000

// Config describes the traffic and the two limiters. The zero value of
// each field means its default.
type Config struct {
	// Duration is how long the simulation runs, from 12:00:00. The
	// default is 3 minutes; at most 1 hour.
	Duration time.Duration
	// Window is the fixed window's length; windows start at 12:00:00. The
	// default is 1 minute.
	Window time.Duration
	// Quota is the fixed window's quota per client per window. The
	// default is 600.
	Quota int64
	// Rate is the token bucket's refill rate per second. The default is
	// Quota/Window, the same long-run rate as the fixed window.
	Rate float64
	// Burst is the token bucket's capacity. The default is 20.
	Burst int64
	// CronClients is the number of clients that fire a batch at every
	// minute's :00 and retry refused requests after Retry-After. The
	// default is 10; -1 means none.
	CronClients int
	// CronBatch is the number of requests each cron client fires at every
	// :00. The default is 100.
	CronBatch int
	// Boundary is the window boundary the boundary client straddles: it
	// sends Quota requests evenly in the BoundarySpan before it and Quota
	// more in the BoundarySpan after it, retrying nothing. The default is
	// 1 minute (12:01:00); -1 means no boundary client.
	Boundary time.Duration
	// BoundarySpan is the default 10 seconds.
	BoundarySpan time.Duration
	// Span is the length of the sliding span in which the most admitted
	// requests are reported. The default is 20 seconds.
	Span time.Duration
}

func (c Config) withDefaults() Config {
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Quota == 0 {
		c.Quota = DefaultQuota
	}
	if c.Rate == 0 && c.Window > 0 {
		c.Rate = float64(c.Quota) / c.Window.Seconds()
	}
	if c.Burst == 0 {
		c.Burst = DefaultBurst
	}
	if c.CronClients == 0 {
		c.CronClients = DefaultCronClients
	}
	if c.CronBatch == 0 {
		c.CronBatch = DefaultCronBatch
	}
	if c.Boundary == 0 {
		c.Boundary = DefaultBoundary
	}
	if c.BoundarySpan == 0 {
		c.BoundarySpan = DefaultBoundarySpan
	}
	if c.Span == 0 {
		c.Span = DefaultSpan
	}
	return c
}

// Validate checks the configuration after defaults, naming the offending
// field and value.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Duration < time.Second || c.Duration > time.Hour:
		return fmt.Errorf("simulate: duration must be between 1s and 1h, got %v", c.Duration)
	case c.Window < time.Second || c.Window > c.Duration:
		return fmt.Errorf("simulate: window must be between 1s and the duration %v, got %v", c.Duration, c.Window)
	case c.Window%time.Second != 0:
		return fmt.Errorf("simulate: window must be whole seconds, got %v", c.Window)
	case c.Quota < 1 || c.Quota > 1_000_000:
		return fmt.Errorf("simulate: quota must be between 1 and 1000000, got %d", c.Quota)
	case c.CronClients < -1 || c.CronClients > 1000:
		return fmt.Errorf("simulate: cron clients must be between 0 and 1000, got %d", c.CronClients)
	case c.CronBatch < 1 || c.CronBatch > 100_000:
		return fmt.Errorf("simulate: cron batch must be between 1 and 100000, got %d", c.CronBatch)
	case c.Boundary != -1 && (c.Boundary < 0 || c.Boundary > c.Duration):
		return fmt.Errorf("simulate: boundary must be within the duration %v (or -1 for none), got %v", c.Duration, c.Boundary)
	case c.BoundarySpan < time.Second || c.BoundarySpan > c.Window:
		return fmt.Errorf("simulate: boundary span must be between 1s and the window %v, got %v", c.Window, c.BoundarySpan)
	case c.Span < time.Second || c.Span > c.Duration:
		return fmt.Errorf("simulate: span must be between 1s and the duration %v, got %v", c.Duration, c.Span)
	}
	minutes := int64((c.Duration + time.Minute - 1) / time.Minute)
	if n := minutes*int64(max(c.CronClients, 0))*int64(c.CronBatch) + 2*c.Quota; n > MaxEvents {
		return fmt.Errorf("simulate: %d requests before any retry, more than %d; use fewer cron clients, a smaller batch or a shorter duration", n, MaxEvents)
	}
	if err := fleetrate.PerSecond(c.Rate, c.Burst).Validate(); err != nil {
		return fmt.Errorf("simulate: token bucket: %w", err)
	}
	return nil
}

// Stats are one limiter's results.
type Stats struct {
	// Name is "fixed window" or "token bucket".
	Name string
	// Admitted and Rejected count requests, retries included.
	Admitted, Rejected int
	// PerSecond[i] is the number of requests admitted in second i.
	PerSecond []int
	// PeakPerSecond is the largest PerSecond value; PeakSecond its index.
	PeakPerSecond, PeakSecond int
	// MaxInSpan is the most requests admitted in any Span, all clients
	// together; MaxInSpanAt is when that span starts.
	MaxInSpan   int
	MaxInSpanAt time.Duration
	// BoundaryPerSecond and BoundaryMaxInSpan are the same for the
	// boundary client alone: the double-quota fault shows here.
	BoundaryPerSecond []int
	BoundaryMaxInSpan int
	// BoundaryAdmitted counts the boundary client's admitted requests.
	BoundaryAdmitted int
}

// Report is the outcome of a run.
type Report struct {
	// Config is the configuration with defaults applied.
	Config Config
	// Fixed and Bucket are the two limiters' results.
	Fixed, Bucket Stats
}

// Per formats a period for people: "minute", "hour", or "30s".
func Per(d time.Duration) string {
	switch d {
	case time.Second:
		return "second"
	case time.Minute:
		return "minute"
	case time.Hour:
		return "hour"
	}
	return d.String()
}

// BucketBound returns the most requests a token bucket can admit to one
// client in any span of length d: Burst + Rate × d.
func (c Config) BucketBound(d time.Duration) float64 {
	c = c.withDefaults()
	return float64(c.Burst) + c.Rate*d.Seconds()
}

// limiter is one side of the comparison: it decides a request of a client
// at an offset from the start, and for a refusal says when to retry.
type limiter interface {
	decide(client string, at time.Duration) (ok bool, retryAfter time.Duration, err error)
}

// fixedWindow counts requests per client in windows aligned to the start.
type fixedWindow struct {
	window time.Duration
	quota  int64
	counts map[string]*windowCount
}

type windowCount struct {
	index int64
	n     int64
}

func (f *fixedWindow) decide(client string, at time.Duration) (bool, time.Duration, error) {
	idx := int64(at / f.window)
	c := f.counts[client]
	if c == nil {
		c = &windowCount{index: idx}
		f.counts[client] = c
	}
	if c.index != idx {
		c.index, c.n = idx, 0
	}
	if c.n < f.quota {
		c.n++
		return true, 0, nil
	}
	return false, time.Duration(idx+1)*f.window - at, nil
}

// tokenBucket is fleetrate itself over a memstore on the simulated clock.
type tokenBucket struct {
	now   time.Time
	start time.Time
	lim   *fleetrate.Limiter
}

func newTokenBucket(start time.Time, rate float64, burst int64) (*tokenBucket, error) {
	tb := &tokenBucket{now: start, start: start}
	store := memstore.New(memstore.Options{Clock: func() time.Time { return tb.now }, Shards: 1})
	lim, err := fleetrate.New(store, fleetrate.Config{Prefix: "simulate:", Limits: []fleetrate.Limit{fleetrate.PerSecond(rate, burst)}})
	if err != nil {
		return nil, err
	}
	tb.lim = lim
	return tb, nil
}

func (t *tokenBucket) decide(client string, at time.Duration) (bool, time.Duration, error) {
	t.now = t.start.Add(at)
	res, err := t.lim.Allow(context.Background(), client)
	if err != nil {
		return false, 0, err
	}
	return res.Allowed, res.RetryAfter, nil
}

// event is one request: a first try or a retry.
type event struct {
	at     time.Duration
	seq    int
	client string
	retry  bool
}

// queue orders events by time, then by the order they were made; it
// implements heap.Interface.
type queue []event

// Len implements heap.Interface.
func (q queue) Len() int { return len(q) }

// Less implements heap.Interface.
func (q queue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}

// Swap implements heap.Interface.
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }

// Push implements heap.Interface.
func (q *queue) Push(x any) { *q = append(*q, x.(event)) }

// Pop implements heap.Interface.
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

const boundaryClient = "boundary"

// Start is the simulated wall-clock time of offset 0: 12:00:00.
var Start = time.Date(2026, 1, 5, 12, 0, 0, 0, time.UTC)

// Run simulates the traffic of cfg through both limiters.
func Run(cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	tb, err := newTokenBucket(Start, cfg.Rate, cfg.Burst)
	if err != nil {
		return nil, err
	}
	fw := &fixedWindow{window: cfg.Window, quota: cfg.Quota, counts: map[string]*windowCount{}}
	rep := &Report{Config: cfg}
	if rep.Fixed, err = play(cfg, "fixed window", fw, MaxEvents); err != nil {
		return nil, err
	}
	if rep.Bucket, err = play(cfg, "token bucket", tb, MaxEvents); err != nil {
		return nil, err
	}
	return rep, nil
}

// initial returns the first tries of every client.
func initial(cfg Config) queue {
	var q queue
	seq := 0
	add := func(at time.Duration, client string) {
		q = append(q, event{at: at, seq: seq, client: client})
		seq++
	}
	if cfg.CronClients > 0 {
		for minute := time.Duration(0); minute < cfg.Duration; minute += time.Minute {
			for c := range cfg.CronClients {
				name := fmt.Sprintf("cron-%02d", c+1)
				for range cfg.CronBatch {
					add(minute, name)
				}
			}
		}
	}
	if cfg.Boundary >= 0 {
		for i := range cfg.Quota {
			// Evenly spread, computed exactly so that every second of the
			// span gets the same share.
			off := time.Duration(i * int64(cfg.BoundarySpan) / cfg.Quota)
			if at := cfg.Boundary - cfg.BoundarySpan + off; at >= 0 {
				add(at, boundaryClient)
			}
			if at := cfg.Boundary + off; at < cfg.Duration {
				add(at, boundaryClient)
			}
		}
	}
	return q
}

// play runs the traffic through one limiter. Refused cron requests are
// retried after Retry-After as a client reads it: whole seconds, rounded
// up. Requests due after the end are dropped.
func play(cfg Config, name string, lim limiter, maxEvents int) (Stats, error) {
	q := initial(cfg)
	heap.Init(&q)
	seq := len(q)
	secs := int(cfg.Duration / time.Second)
	st := Stats{Name: name, PerSecond: make([]int, secs), BoundaryPerSecond: make([]int, secs)}
	var all, boundary []time.Duration
	for events := 0; q.Len() > 0; events++ {
		if events >= maxEvents {
			return st, fmt.Errorf("simulate: more than %d requests with retries; use fewer cron clients, a smaller batch or a shorter duration", maxEvents)
		}
		e := heap.Pop(&q).(event)
		ok, retry, err := lim.decide(e.client, e.at)
		if err != nil {
			return st, fmt.Errorf("simulate: %s: %w", name, err)
		}
		if !ok {
			st.Rejected++
			if e.client != boundaryClient {
				next := e.at + time.Duration(headers.DelaySeconds(retry))*time.Second
				if next < cfg.Duration {
					heap.Push(&q, event{at: next, seq: seq, client: e.client, retry: true})
					seq++
				}
			}
			continue
		}
		st.Admitted++
		sec := int(e.at / time.Second)
		st.PerSecond[sec]++
		all = append(all, e.at)
		if e.client == boundaryClient {
			st.BoundaryPerSecond[sec]++
			st.BoundaryAdmitted++
			boundary = append(boundary, e.at)
		}
	}
	for i, n := range st.PerSecond {
		if n > st.PeakPerSecond {
			st.PeakPerSecond, st.PeakSecond = n, i
		}
	}
	st.MaxInSpan, st.MaxInSpanAt = maxInSpan(all, cfg.Span)
	st.BoundaryMaxInSpan, _ = maxInSpan(boundary, cfg.Span)
	return st, nil
}

// maxInSpan returns the most times in any half-open span [t, t+d) and the
// start of the first such span; times must be sorted. The best span
// always starts at one of the times.
func maxInSpan(times []time.Duration, d time.Duration) (int, time.Duration) {
	best, at, j := 0, time.Duration(0), 0
	for i := range times {
		for j < len(times) && times[j] < times[i]+d {
			j++
		}
		if j-i > best {
			best, at = j-i, times[i]
		}
	}
	return best, at
}
