// Package failsafe wraps a shared fleetrate.Store (Redis) with a failure
// policy and a circuit breaker, so that a limiter keeps deciding, the way
// its operator chose, when the store fails.
//
// A limiter sits in front of every call, so a dead store must cost almost
// nothing: after FailureThreshold consecutive failures the breaker opens
// and calls stop reaching the store for CoolOff; then one call probes it,
// and a success closes the breaker again. A failed call that began before
// the store's latest answer does not count: the store was answering while
// it waited, so its timeout says the caller was slow (a herd of callers
// starved of CPU after an outage), not that the store is down. While the store is unavailable
// the Policy decides:
//
//   - FailOpen allows every take and marks the result Degraded;
//   - FailClosed returns the store's error (wrapping
//     fleetrate.ErrStoreUnavailable), never a plain denial;
//   - LocalFallback decides on an in-memory bucket whose limits are the
//     shared ones divided by FleetSize, so that the fleet as a whole stays
//     near the shared allowance (its in-flight bound and calendar quotas
//     too; a quota's local count starts afresh, so an outage may admit
//     one more count of it in its window).
//
// Invalid requests (fleetrate.ErrInvalid, ErrBurstExceeded) and the
// caller's own cancellation pass through untouched and do not count as
// store failures.
package failsafe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/promreg"
	"github.com/fleetrate/fleetrate/memstore"
)

// Policy is what a Store does when the shared store fails.
type Policy int

const (
	// FailOpen allows, and counts it.
	FailOpen Policy = iota
	// FailClosed returns the store error: the caller denies, and knows why.
	FailClosed
	// LocalFallback decides on a local in-memory bucket at the shared
	// limits divided by Options.FleetSize.
	LocalFallback
)

// String returns the policy's configuration name, such as "fail_open".
func (p Policy) String() string {
	switch p {
	case FailOpen:
		return "fail_open"
	case FailClosed:
		return "fail_closed"
	case LocalFallback:
		return "local_fallback"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// ParsePolicy parses "fail_open", "fail_closed" or "local_fallback".
func ParsePolicy(s string) (Policy, error) {
	for _, p := range []Policy{FailOpen, FailClosed, LocalFallback} {
		if s == p.String() {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: failure policy %q: want fail_open, fail_closed or local_fallback", fleetrate.ErrInvalid, s)
}

// ErrCircuitOpen is wrapped, together with fleetrate.ErrStoreUnavailable,
// by the errors of calls that the open breaker kept from the store.
var ErrCircuitOpen = errors.New("failsafe: circuit open")

// Defaults applied when an Options field is zero.
const (
	DefaultFailureThreshold = 5
	DefaultCoolOff          = 100 * time.Millisecond
)

// Options configure a Store. The zero value of each field means its
// default.
type Options struct {
	// Name labels logs and metrics, e.g. "redis". Default "store".
	Name string
	// Policy is what to do while the store fails. Default FailOpen.
	Policy Policy
	// FleetSize is the expected number of processes sharing the store;
	// LocalFallback divides every rate and burst by it (burst at least 1).
	// Default 1.
	FleetSize int
	// Fallback is the local store for LocalFallback. Default: a new
	// memstore.
	Fallback fleetrate.Store
	// FailureThreshold is how many consecutive failures open the breaker:
	// failed calls, each begun after the store's latest answer (see the
	// package doc). Default DefaultFailureThreshold (5).
	FailureThreshold int
	// CoolOff is how long the open breaker keeps calls from the store
	// before one probe. Default DefaultCoolOff (100 ms). It bounds how
	// long after the store is back its decisions resume: with 500 ms,
	// callers came back up to 500 ms after Redis; a probe costs one call,
	// bounded by the store's timeout, per cool-off.
	CoolOff time.Duration
	// Logger receives the switch-over and switch-back. Default
	// slog.Default().
	Logger *slog.Logger
	// Registerer, when set, receives the metrics: fleetrate_breaker_open,
	// fleetrate_store_failures_total and fleetrate_degraded_decisions_total,
	// labelled by store.
	Registerer prometheus.Registerer
	// Clock is the breaker's time source. Default time.Now.
	Clock func() time.Time
	// EmptyAfterOutage makes every bucket start empty, rather than full,
	// after the store was unavailable: a restarted Redis without
	// persistence has lost every bucket, and an absent bucket is a full
	// one, so the fleet could spend one extra burst. For RecoveryWindow
	// after the breaker closes again, the first take of each bucket first
	// drains it (one extra round trip), so it refills from empty. If the
	// outage was only a network fault, this gives up tokens the fleet still
	// had: it errs on the side of the upstream.
	EmptyAfterOutage bool
	// RecoveryWindow is how long after an outage EmptyAfterOutage applies;
	// buckets first used later have had time to refill anyway. Default
	// DefaultRecoveryWindow (1 minute).
	RecoveryWindow time.Duration
}

// DefaultRecoveryWindow is the default Options.RecoveryWindow.
const DefaultRecoveryWindow = time.Minute

const (
	closed int32 = iota
	open
	probing
)

// Store is a fleetrate.Store with a failure policy and a circuit breaker.
// It is safe for concurrent use.
type Store struct {
	primary  fleetrate.Store
	fallback fleetrate.Store
	opts     Options

	state     atomic.Int32
	failures  atomic.Int32
	openUntil atomic.Int64 // unix ns
	answered  atomic.Int64 // unix ns: when the store last answered a call

	gauge    prometheus.Gauge
	failed   prometheus.Counter
	degraded prometheus.Counter

	// Buckets drained since the last outage, for EmptyAfterOutage; nil
	// when no outage is recent. recovered is zero until the breaker closes.
	recMu     sync.Mutex
	recovered time.Time
	emptied   map[string]bool
}

var _ fleetrate.Store = (*Store)(nil)

// New wraps primary.
func New(primary fleetrate.Store, opts Options) (*Store, error) {
	if primary == nil {
		return nil, fmt.Errorf("%w: failsafe: primary store must not be nil", fleetrate.ErrInvalid)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Store{primary: primary, fallback: opts.Fallback, opts: opts}
	if s.fallback == nil && opts.Policy == LocalFallback {
		s.fallback = memstore.New(memstore.Options{})
	}
	if err := s.newMetrics(); err != nil {
		return nil, err
	}
	return s, nil
}

// withDefaults checks o and gives each zero field its default.
func (o Options) withDefaults() (Options, error) {
	if o.Policy < FailOpen || o.Policy > LocalFallback {
		return o, fmt.Errorf("%w: failsafe: policy: unknown %d", fleetrate.ErrInvalid, o.Policy)
	}
	switch {
	case o.FleetSize < 0:
		return o, fmt.Errorf("%w: failsafe: fleet size must not be negative, got %d", fleetrate.ErrInvalid, o.FleetSize)
	case o.FailureThreshold < 0:
		return o, fmt.Errorf("%w: failsafe: failure threshold must not be negative, got %d", fleetrate.ErrInvalid, o.FailureThreshold)
	case o.CoolOff < 0:
		return o, fmt.Errorf("%w: failsafe: cool-off must not be negative, got %v", fleetrate.ErrInvalid, o.CoolOff)
	}
	if o.RecoveryWindow < 0 {
		return o, fmt.Errorf("%w: failsafe: recovery window must not be negative, got %v", fleetrate.ErrInvalid, o.RecoveryWindow)
	}
	o.Name = cmp.Or(o.Name, "store")
	o.FleetSize = cmp.Or(o.FleetSize, 1)
	o.FailureThreshold = cmp.Or(o.FailureThreshold, DefaultFailureThreshold)
	o.CoolOff = cmp.Or(o.CoolOff, DefaultCoolOff)
	o.RecoveryWindow = cmp.Or(o.RecoveryWindow, DefaultRecoveryWindow)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	return o, nil
}

// newMetrics makes s's metrics and registers them with s.opts.Registerer
// when there is one.
func (s *Store) newMetrics() error {
	opts := s.opts
	labels := prometheus.Labels{"store": opts.Name}
	s.gauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fleetrate_breaker_open", Help: "1 while the circuit breaker keeps calls from the shared store.", ConstLabels: labels,
	})
	s.failed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fleetrate_store_failures_total", Help: "Calls the shared store failed to answer.", ConstLabels: labels,
	})
	s.degraded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fleetrate_degraded_decisions_total", Help: "Takes decided by the failure policy instead of the shared store.",
		ConstLabels: prometheus.Labels{"store": opts.Name, "policy": opts.Policy.String()},
	})
	if opts.Registerer == nil {
		return nil
	}
	var err error
	if s.gauge, err = promreg.Register(opts.Registerer, s.gauge); err == nil {
		if s.failed, err = promreg.Register(opts.Registerer, s.failed); err == nil {
			s.degraded, err = promreg.Register(opts.Registerer, s.degraded)
		}
	}
	if err != nil {
		return fmt.Errorf("failsafe: registering metrics: %w", err)
	}
	return nil
}

// Open reports whether the breaker currently keeps calls from the store.
func (s *Store) Open() bool { return s.state.Load() != closed }

// Unwrap returns the primary store, so that callers can find what it
// offers beyond fleetrate.Store (such as transport's Announcer).
func (s *Store) Unwrap() fleetrate.Store { return s.primary }

// allow reports whether this call may reach the primary store, claiming
// the single probe when the cool-off is over.
func (s *Store) allow() bool {
	switch s.state.Load() {
	case closed:
		return true
	case open:
		if s.opts.Clock().UnixNano() < s.openUntil.Load() {
			return false
		}
		return s.state.CompareAndSwap(open, probing)
	}
	return false // another call is probing
}

func (s *Store) succeeded() {
	s.answered.Store(s.opts.Clock().UnixNano())
	s.failures.Store(0)
	if s.state.Swap(closed) != closed {
		s.gauge.Set(0)
		s.opts.Logger.Info("fleetrate store recovered; circuit closed", "store", s.opts.Name)
		if s.opts.EmptyAfterOutage {
			s.recMu.Lock()
			s.recovered = s.opts.Clock()
			s.recMu.Unlock()
		}
	}
}

// toEmpty returns the buckets of req that must be drained before their
// first take after an outage, and marks them done.
func (s *Store) toEmpty(bs []fleetrate.Bucket) []fleetrate.Bucket {
	if !s.opts.EmptyAfterOutage {
		return nil
	}
	s.recMu.Lock()
	defer s.recMu.Unlock()
	if s.emptied == nil {
		return nil
	}
	if !s.recovered.IsZero() && s.opts.Clock().Sub(s.recovered) > s.opts.RecoveryWindow {
		s.emptied = nil // the window is over; free the set
		return nil
	}
	var out []fleetrate.Bucket
	for _, b := range bs {
		if k := b.StoreKey(); !s.emptied[k] {
			s.emptied[k] = true
			out = append(out, b)
		}
	}
	return out
}

// failedWith counts a failed call that began at start (unix ns) and opens
// the breaker when the failures say the store is down. A call that began
// before the store's latest answer does not count towards opening it: the
// store answered another call while this one waited (see the package
// doc). The caller gets its error either way.
func (s *Store) failedWith(err error, start int64) {
	s.failed.Inc()
	st := s.state.Load()
	if st == closed && start < s.answered.Load() {
		return
	}
	n := s.failures.Add(1)
	if st == probing || (st == closed && n >= int32(s.opts.FailureThreshold)) {
		s.openUntil.Store(s.opts.Clock().Add(s.opts.CoolOff).UnixNano())
		if s.state.Swap(open) == closed {
			if s.opts.EmptyAfterOutage {
				// From the probe on, every bucket's first take drains it.
				s.recMu.Lock()
				s.recovered, s.emptied = time.Time{}, map[string]bool{}
				s.recMu.Unlock()
			}
			s.gauge.Set(1)
			s.opts.Logger.Warn("fleetrate store unavailable; circuit open",
				"store", s.opts.Name, "policy", s.opts.Policy.String(), "failures", n, "cool_off", s.opts.CoolOff, "err", err)
		}
	}
}

// storeFailure reports whether err is the store's fault, as opposed to an
// invalid request or the caller's cancellation.
func storeFailure(ctx context.Context, err error) bool {
	if err == nil || errors.Is(err, fleetrate.ErrInvalid) || errors.Is(err, fleetrate.ErrBurstExceeded) {
		return false
	}
	if ctx.Err() != nil {
		// The caller gave up (cancelled, or its own deadline passed): its
		// choice, not an outage. A hung store is seen by the store's own
		// timeout, which should be shorter than callers' deadlines.
		return false
	}
	return true
}

// call runs f against the primary store through the breaker. It returns
// whether the store answered (ok) and the error to report when it did not.
func (s *Store) call(ctx context.Context, f func() error) (ok bool, err error) {
	if !s.allow() {
		return false, fmt.Errorf("%w: %w (%s)", fleetrate.ErrStoreUnavailable, ErrCircuitOpen, s.opts.Name)
	}
	start := s.opts.Clock().UnixNano()
	err = f()
	if !storeFailure(ctx, err) {
		if s.state.Load() == probing && err != nil {
			s.state.CompareAndSwap(probing, open) // the probe proved nothing
		} else {
			s.succeeded()
		}
		return true, err
	}
	s.failedWith(err, start)
	return false, err
}

// Take implements fleetrate.Store.
func (s *Store) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	var res fleetrate.Result
	ok, err := s.call(ctx, func() (err error) {
		if drain := s.toEmpty(req.Buckets); len(drain) > 0 {
			if err := s.primary.Drain(ctx, drain, 0); err != nil {
				s.recMu.Lock()
				for _, b := range drain {
					delete(s.emptied, b.StoreKey())
				}
				s.recMu.Unlock()
				return err
			}
		}
		res, err = s.primary.Take(ctx, req)
		return err
	})
	if ok {
		return res, err
	}
	return s.degrade(ctx, req, err)
}

// degrade answers req by the policy, the store having failed with err.
func (s *Store) degrade(ctx context.Context, req fleetrate.Request, err error) (fleetrate.Result, error) {
	switch s.opts.Policy {
	case FailClosed:
		if verr := req.Validate(); verr != nil {
			return fleetrate.Result{}, verr // a bad request is refused for what it is
		}
		return fleetrate.Result{}, err
	case LocalFallback:
		res, ferr := s.fallback.Take(ctx, s.scale(req))
		if ferr != nil {
			return fleetrate.Result{}, errors.Join(err, ferr)
		}
		res.Degraded = true
		s.degraded.Inc()
		return res, nil
	}
	if verr := req.Validate(); verr != nil {
		return fleetrate.Result{}, verr
	}
	s.degraded.Inc()
	l := req.Buckets[0].Limits[0]
	return fleetrate.Result{Allowed: true, N: req.N, Limit: l, At: s.opts.Clock(), Degraded: true}, nil
}

// scale divides every limit by the fleet size for the local fallback.
func (s *Store) scale(req fleetrate.Request) fleetrate.Request {
	if s.opts.FleetSize == 1 {
		return req
	}
	out := req
	out.Buckets = make([]fleetrate.Bucket, len(req.Buckets))
	for i, b := range req.Buckets {
		n := fleetrate.CostOf(req.N, req.Costs, i)
		b.Limits = s.scaleLimits(b.Limits, n)
		b.InFlight, b.PermitReserve = s.scaleInFlight(b.InFlight), s.scalePermitReserve(b)
		b.Quotas = s.scaleQuotas(b.Quotas, n)
		out.Buckets[i] = b
	}
	return out
}

// scaleInFlight is a bucket's in-flight bound for the local fallback: the
// shared bound divided by FleetSize, at least 1.
func (s *Store) scaleInFlight(bound int64) int64 {
	if bound == 0 || s.opts.FleetSize == 1 {
		return bound
	}
	return max(bound/int64(s.opts.FleetSize), 1)
}

// scalePermitReserve is b's permit reserve (its priority class) for the
// local fallback: divided by FleetSize as its bound is, rounded up, and
// below the local bound.
func (s *Store) scalePermitReserve(b fleetrate.Bucket) int64 {
	if b.PermitReserve == 0 || s.opts.FleetSize == 1 {
		return b.PermitReserve
	}
	fs := int64(s.opts.FleetSize)
	return min((b.PermitReserve+fs-1)/fs, s.scaleInFlight(b.InFlight)-1)
}

// scaleQuotas are a bucket's calendar quotas for the local fallback: each
// count divided by FleetSize, at least the take's cost n and 1 (as for
// limits' bursts). The local bucket does not know
// what the shared store counted in the window, so during an outage the
// fleet admits at most one more count of each quota in its window.
func (s *Store) scaleQuotas(qs []fleetrate.Quota, n int64) []fleetrate.Quota {
	if len(qs) == 0 || s.opts.FleetSize == 1 {
		return qs
	}
	out := make([]fleetrate.Quota, len(qs))
	for i, q := range qs {
		q.Count = max(q.Count/int64(s.opts.FleetSize), n, 1)
		out[i] = q
	}
	return out
}

func (s *Store) scaleLimits(limits []fleetrate.Limit, n int64) []fleetrate.Limit {
	if s.opts.FleetSize == 1 {
		return limits
	}
	out := make([]fleetrate.Limit, len(limits))
	for i, l := range limits {
		// A fresh Limit with only the scaled fields.
		l = fleetrate.Limit{Name: l.Name, Rate: l.Rate / float64(s.opts.FleetSize), Burst: max(l.Burst/int64(s.opts.FleetSize), n, 1)}
		// Keep the local bucket valid: its fill time may not exceed the
		// bound a shared limit respects.
		if l.Validate() != nil {
			// The most tokens that fill within MaxFillTime at the
			// interval of whole µs such a long limit has
			// (fleetrate.CoarseFillTime).
			iv := fleetrate.Limit{Rate: l.Rate, Burst: 1}.Interval()
			l.Burst = max(int64(fleetrate.MaxFillTime)/((iv+999)/1000*1000), 1)
		}
		out[i] = l
	}
	return out
}

func (s *Store) localBuckets(bs []fleetrate.Bucket) []fleetrate.Bucket {
	out := make([]fleetrate.Bucket, len(bs))
	for i, b := range bs {
		b.Limits = s.scaleLimits(b.Limits, 0)
		b.InFlight, b.PermitReserve = s.scaleInFlight(b.InFlight), s.scalePermitReserve(b)
		b.Quotas = s.scaleQuotas(b.Quotas, 0)
		out[i] = b
	}
	return out
}

// Refund implements fleetrate.Store. Under LocalFallback a failed refund
// goes to the local bucket; otherwise the store's error is returned.
func (s *Store) Refund(ctx context.Context, buckets []fleetrate.Bucket, n int64, at time.Time) error {
	ok, err := s.call(ctx, func() error { return s.primary.Refund(ctx, buckets, n, at) })
	if ok || s.opts.Policy != LocalFallback {
		return err
	}
	return s.fallback.Refund(ctx, s.localBuckets(buckets), n, at)
}

// Cancel implements fleetrate.Store. A booking is the primary store's, so
// a failed cancel is not passed to the local bucket (whose bookings are
// its own): the tokens stay booked, which keeps every bound.
func (s *Store) Cancel(ctx context.Context, buckets []fleetrate.Bucket, n int64, b fleetrate.Booking) error {
	_, err := s.call(ctx, func() error { return s.primary.Cancel(ctx, buckets, n, b) })
	return err
}

// Drain implements fleetrate.Store. Under LocalFallback a failed drain
// pauses the local bucket; otherwise the store's error is returned.
func (s *Store) Drain(ctx context.Context, buckets []fleetrate.Bucket, d time.Duration) error {
	ok, err := s.call(ctx, func() error { return s.primary.Drain(ctx, buckets, d) })
	if ok || s.opts.Policy != LocalFallback {
		return err
	}
	return s.fallback.Drain(ctx, s.localBuckets(buckets), d)
}

// Reset implements fleetrate.Store.
func (s *Store) Reset(ctx context.Context, keys ...string) error {
	_, err := s.call(ctx, func() error { return s.primary.Reset(ctx, keys...) })
	if s.fallback != nil {
		_ = s.fallback.Reset(ctx, keys...)
	}
	return err
}

// MultipleClocks implements fleetrate.MultiClock for the primary store.
func (s *Store) MultipleClocks() bool {
	mc, ok := s.primary.(fleetrate.MultiClock)
	return ok && mc.MultipleClocks()
}

var _ fleetrate.MultiTaker = (*Store)(nil)

// TakeMany implements fleetrate.MultiTaker: the takes reach the primary
// store together, through the breaker as one call (a store failure of
// any fails the call), and each that the store failed is answered by the
// policy, as Take answers it. With EmptyAfterOutage each goes through
// Take, which drains a bucket before its first take after an outage.
func (s *Store) TakeMany(ctx context.Context, reqs []fleetrate.Request, res []fleetrate.Result, errs []error) {
	if s.opts.EmptyAfterOutage {
		fleetrate.TakeEach(ctx, s, reqs, res, errs)
		return
	}
	called := false
	ok, err := s.call(ctx, func() error {
		called = true
		if err := fleetrate.TakeMany(ctx, s.primary, reqs, res, errs); err != nil {
			return err // in every errs[i] too
		}
		for _, err := range errs {
			if storeFailure(ctx, err) {
				return err
			}
		}
		return nil
	})
	if ok {
		return
	}
	for i := range reqs {
		switch {
		case !called: // the breaker kept the takes from the store
			res[i], errs[i] = s.degrade(ctx, reqs[i], err)
		case storeFailure(ctx, errs[i]):
			res[i], errs[i] = s.degrade(ctx, reqs[i], errs[i])
		}
	}
}
