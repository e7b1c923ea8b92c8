package fleetrate

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults applied by New when a Config field is zero.
const (
	// DefaultPrefix namespaces every store key.
	DefaultPrefix = "fleetrate:"
	// DefaultMaxWait bounds how long Wait and Reserve may book ahead.
	DefaultMaxWait = 5 * time.Second
	// MaxNameLen is the longest bucket name a Limiter accepts. Callers that
	// key buckets by client input (API keys, IPs) should hash it first, as
	// httplimit does.
	MaxNameLen = 512
	// refundTimeout bounds the best-effort refund after a cancelled wait.
	refundTimeout = time.Second
)

// BucketConfig gives a named bucket its own limits, e.g. one bucket per
// (channel, endpoint) of an upstream API.
type BucketConfig struct {
	// Name identifies the bucket, e.g. "booking_com/availability". The
	// store key is Config.Prefix + Name. To keep buckets that are taken
	// together on one Redis Cluster slot, give them a common {hash tag}:
	// "{booking_com}/availability" and "{booking_com}".
	Name string
	// Limits are enforced together.
	Limits []Limit
	// Priorities are the classes of takes below the top one on this
	// bucket (see Priority and WithPriority). When empty, the bucket has
	// Config.Priorities.
	Priorities []Priority
}

// Config configures a Limiter. The zero value of each field means its
// default.
type Config struct {
	// Prefix is prepended to every bucket name to form the store key.
	// The default is DefaultPrefix ("fleetrate:").
	Prefix string
	// Limits apply to every name that has no entry in Buckets, e.g. one
	// bucket per API key. When empty, only the names in Buckets are valid.
	Limits []Limit
	// Buckets are named buckets with limits of their own.
	Buckets []BucketConfig
	// Priorities are the classes of takes below the top one (see Priority
	// and WithPriority) on every bucket that configures none of its own.
	// None by default: every take is of one class.
	Priorities []Priority
	// MaxWait is the longest Wait and Reserve may book ahead; a longer wait
	// fails at once with a *BackpressureError. The default is
	// DefaultMaxWait (5 s).
	MaxWait time.Duration
	// Clock is used only to turn the absolute time given to DrainUntil
	// into a duration. Decisions use the store's clock. Default time.Now.
	Clock func() time.Time
}

// Validate checks the configuration, naming the failing field and value.
func (c Config) Validate() error {
	if len(c.Limits) == 0 && len(c.Buckets) == 0 {
		return fmt.Errorf("%w: config: limits or buckets must be set", ErrInvalid)
	}
	if len(c.Limits) > 0 {
		if err := validateLimits("limits", c.Limits); err != nil {
			return fmt.Errorf("%w: config: %w", ErrInvalid, err)
		}
	}
	if c.MaxWait < 0 || c.MaxWait > MaxWaitCap {
		return fmt.Errorf("%w: config: max wait must be between 0 and %v, got %v", ErrInvalid, MaxWaitCap, c.MaxWait)
	}
	if err := validatePriorities("priorities", c.Priorities, c.Limits); err != nil {
		return fmt.Errorf("%w: config: %w", ErrInvalid, err)
	}
	seen := make(map[string]bool, len(c.Buckets))
	for i, b := range c.Buckets {
		if err := validateName(b.Name); err != nil {
			return fmt.Errorf("%w: config: buckets[%d].name: %w", ErrInvalid, i, err)
		}
		if seen[b.Name] {
			return fmt.Errorf("%w: config: buckets[%d].name: duplicate %q", ErrInvalid, i, b.Name)
		}
		seen[b.Name] = true
		if err := validateLimits(fmt.Sprintf("buckets[%d] %q limits", i, b.Name), b.Limits); err != nil {
			return fmt.Errorf("%w: config: %w", ErrInvalid, err)
		}
		field, ps := fmt.Sprintf("buckets[%d] %q priorities", i, b.Name), b.Priorities
		if len(ps) == 0 {
			field, ps = fmt.Sprintf("priorities (of buckets[%d] %q)", i, b.Name), c.Priorities
		}
		if err := validatePriorities(field, ps, b.Limits); err != nil {
			return fmt.Errorf("%w: config: %w", ErrInvalid, err)
		}
	}
	return nil
}

// validName reports whether name may name a bucket; validateName says why
// not.
func validName(name string) bool { return name != "" && len(name) <= MaxNameLen }

func validateName(name string) error {
	if validName(name) {
		return nil
	}
	switch {
	case name == "":
		return fmt.Errorf("name must not be empty")
	case len(name) > MaxNameLen:
		return fmt.Errorf("name must be at most %d bytes, got %d", MaxNameLen, len(name))
	}
	return nil
}

// Limiter takes tokens from shared buckets kept in a Store. Every method is
// one store round trip (Wait adds only a local sleep), and a Limiter is safe
// for concurrent use by any number of goroutines. Processes that build
// Limiters with the same Config over the same store share the buckets.
type Limiter struct {
	store   Store
	prefix  string
	limits  []Limit
	named   map[string]namedBucket
	maxWait time.Duration
	now     func() time.Time
	scratch sync.Pool  // of *[]Bucket, reused across calls
	bound   BoundTaker // the store's taker for the default limits, if any
	clock   anchor     // times booked slots from the store's decisions
	// classes are the priority classes of the buckets of the default
	// limits; classNames names every class of any bucket; prioritized is
	// set when there is one.
	classes     []Priority
	classNames  map[string]bool
	prioritized bool
}

// namedBucket is a configured bucket and, when the store is a Binder, its
// bound taker.
type namedBucket struct {
	Bucket
	taker   BoundTaker
	classes []Priority
}

// errZeroLimiter is what a Limiter that New did not make answers.
var errZeroLimiter = fmt.Errorf("%w: the Limiter is a zero value: make one with fleetrate.New", ErrInvalid)

// New returns a Limiter over store, or an error naming the invalid field.
func New(store Store, cfg Config) (*Limiter, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store must not be nil", ErrInvalid)
	}
	if v := reflect.ValueOf(store); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, fmt.Errorf("%w: store must not be nil (a nil %T)", ErrInvalid, store)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &Limiter{
		store:   store,
		prefix:  cfg.Prefix,
		limits:  compileLimits(cfg.Limits),
		named:   make(map[string]namedBucket, len(cfg.Buckets)),
		maxWait: cfg.MaxWait,
		now:     cfg.Clock,
		classes: slices.Clone(cfg.Priorities),
	}
	if l.prefix == "" {
		l.prefix = DefaultPrefix
	}
	if l.maxWait == 0 {
		l.maxWait = DefaultMaxWait
	}
	if l.now == nil {
		l.now = time.Now
	}
	if mc, ok := store.(MultiClock); ok && mc.MultipleClocks() {
		l.clock.off = true
	}
	binder, _ := store.(Binder)
	l.bound = l.bind(binder, l.limits)
	l.classNames = map[string]bool{}
	for _, p := range l.classes {
		l.classNames[p.Name] = true
	}
	for _, b := range cfg.Buckets {
		l.addBucket(binder, b)
	}
	l.prioritized = len(l.classNames) > 0
	l.scratch.New = func() any { s := make([]Bucket, 0, 4); return &s }
	return l, nil
}

// bind returns binder's taker for limits under the limiter's prefix, or
// nil without a binder or limits. A store that refuses to bind is left to
// refuse each take instead.
func (l *Limiter) bind(binder Binder, limits []Limit) BoundTaker {
	if binder == nil || len(limits) == 0 {
		return nil
	}
	t, err := binder.Bind(l.prefix, limits)
	if err != nil {
		return nil
	}
	return t
}

// addBucket registers the configured bucket b, with its priority classes
// (the limiter's when it names none).
func (l *Limiter) addBucket(binder Binder, b BucketConfig) {
	nb := namedBucket{Bucket: Bucket{Prefix: l.prefix, Key: b.Name, Limits: compileLimits(b.Limits)}}
	nb.taker = l.bind(binder, nb.Limits)
	nb.classes = slices.Clone(b.Priorities)
	if len(nb.classes) == 0 {
		nb.classes = l.classes
	}
	for _, p := range nb.classes {
		l.classNames[p.Name] = true
	}
	l.named[b.Name] = nb
}

// taker returns the bound taker for a take from the named bucket, or nil
// when the store is no Binder or the name is invalid (the general path
// then reports the error).
func (l *Limiter) taker(name string) BoundTaker {
	if len(l.named) > 0 {
		if nb, ok := l.named[name]; ok {
			return nb.taker
		}
	}
	if !validName(name) {
		return nil
	}
	return l.bound
}

// Store returns the limiter's store.
func (l *Limiter) Store() Store { return l.store }

// Prefix returns the prefix of every store key of the limiter's buckets.
func (l *Limiter) Prefix() string { return l.prefix }

// MaxWait returns the configured max wait.
func (l *Limiter) MaxWait() time.Duration { return l.maxWait }

// Bucket resolves a name to its store key and limits.
func (l *Limiter) Bucket(name string) (Bucket, error) {
	b, err := l.bucket(name)
	if err != nil {
		return Bucket{}, err
	}
	ls := make([]Limit, len(b.Limits))
	for i, x := range b.Limits {
		ls[i] = x.plain()
	}
	b.Limits = ls
	return b, nil
}

// bucket is Bucket without copying: its limits are the Limiter's own
// compiled ones and must not reach the caller.
func (l *Limiter) bucket(name string) (Bucket, error) {
	if len(l.named) > 0 {
		if nb, ok := l.named[name]; ok {
			return nb.Bucket, nil
		}
	}
	if err := validateName(name); err != nil {
		return Bucket{}, fmt.Errorf("%w: bucket %w", ErrInvalid, err)
	}
	if len(l.limits) == 0 {
		return Bucket{}, fmt.Errorf("%w: unknown bucket %q (no default limits configured)", ErrInvalid, name)
	}
	return Bucket{Prefix: l.prefix, Key: name, Limits: l.limits}, nil
}

// buckets resolves names into a pooled slice; the caller gives it back
// with release once the store no longer needs it.
func (l *Limiter) buckets(names []string) (*[]Bucket, error) {
	if l.store == nil {
		return nil, errZeroLimiter
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: at least one bucket name is required", ErrInvalid)
	}
	bs := l.scratch.Get().(*[]Bucket)
	for _, n := range names {
		b, err := l.bucket(n)
		if err != nil {
			l.release(bs)
			return nil, err
		}
		*bs = append(*bs, b)
	}
	return bs, nil
}

func (l *Limiter) release(bs *[]Bucket) {
	clear(*bs)
	*bs = (*bs)[:0]
	l.scratch.Put(bs)
}

// take asks the store for n tokens now, of ctx's priority class (see
// classify); the store validates the request. The caller releases the
// returned buckets.
func (l *Limiter) take(ctx context.Context, n int64, names []string) (Result, *[]Bucket, error) {
	bs, err := l.buckets(names)
	if err != nil {
		return Result{}, nil, err
	}
	if _, err = l.classify(ctx, *bs, 0); err != nil {
		return Result{}, bs, err
	}
	res, err := l.store.Take(ctx, Request{Buckets: *bs, N: n})
	res.Limit.strip()
	return res, bs, err
}

// topClass reports whether a take under ctx is of the top class on every
// bucket, so that it may use a bound taker.
func (l *Limiter) topClass(ctx context.Context) bool {
	if !l.prioritized && !priorityUsed.Load() {
		return true
	}
	return PriorityFrom(ctx) == "" // else classify reports a class no bucket has
}

// errNilContext is what every call given a nil context returns, rather
// than panicking in the store.
var errNilContext = fmt.Errorf("%w: ctx is nil (give context.Background() or a request's context)", ErrInvalid)

// takeNow is take for the calls that keep nothing.
func (l *Limiter) takeNow(ctx context.Context, n int64, names []string) (res Result, err error) {
	if ctx == nil {
		return Result{}, errNilContext
	}
	if len(names) == 1 && l.topClass(ctx) {
		if t := l.taker(names[0]); t != nil {
			res, err = t.TakeKey(ctx, names[0], n, 0)
			res.Limit.strip() // in case the store passed back its bound limit
			return res, err
		}
	}
	res, bs, err := l.take(ctx, n, names)
	if bs != nil {
		l.release(bs)
	}
	return res, err
}

// Allow takes one token from the named bucket if it has one now. A denial
// is a Result with Allowed false; an error means the store failed.
func (l *Limiter) Allow(ctx context.Context, name string) (res Result, err error) {
	if ctx == nil {
		return Result{}, errNilContext
	}
	if t := l.taker(name); t != nil && l.topClass(ctx) {
		// takeNow's bound path, inline on the hottest path.
		res, err = t.TakeKey(ctx, name, 1, 0)
		res.Limit.strip()
		return res, err
	}
	return l.AllowN(ctx, 1, name)
}

// AllowN takes n tokens now from every named bucket, all or nothing. It
// never blocks beyond the store's round trip.
func (l *Limiter) AllowN(ctx context.Context, n int64, names ...string) (Result, error) {
	return l.takeNow(ctx, n, names)
}

// Peek reports the state of the named buckets without consuming: Allowed
// is false only when they are in debt (drained or booked ahead).
func (l *Limiter) Peek(ctx context.Context, names ...string) (Result, error) {
	return l.takeNow(ctx, 0, names)
}

// Reservation is a booking of tokens that the holder may use after Delay.
type Reservation struct {
	// Result is the store's decision; Result.Wait is the booked delay.
	Result Result
	l      *Limiter
	bs     []Bucket
	n      int64
	due    time.Time
	booked Booking
	// done is set once Cancel has given the booking back (or is doing
	// so): Cancel is safe to call from several goroutines, such as Sleep's
	// when its context ends and the holder's own.
	done atomic.Bool
}

// Delay returns how long from now the holder must wait before acting.
func (r *Reservation) Delay() time.Duration {
	return max(time.Until(r.due), 0)
}

// Due returns when, on this process's clock, the booked slot begins: the
// store's decision plus the booked wait, placed by the limiter's clock
// anchor (never before the slot).
func (r *Reservation) Due() time.Time { return r.due }

// Booking returns where the take left each limit of each bucket: the
// store's clock and every debt, in bucket order (see Request.Booking).
func (r *Reservation) Booking() Booking { return r.booked }

// Cancel gives the booked tokens back, as x/time/rate's Cancel does for a
// reservation whose time to act has not come: each limit of each bucket
// gets them back only when nothing was booked on it after this
// reservation, because a later booking's slot was computed from them and
// giving them back would grant that slot twice. So cancelling the latest
// reservation frees its tokens; cancelling one with later reservations
// behind it leaves them booked (they are used by no one, and the bucket's
// bound holds). It differs from x/time/rate in two ways: a limit gets all
// n tokens back or none (x/time/rate restores the part later reservations
// did not count against), and once the slot has begun nothing goes back,
// on the store's clock, as x/time/rate restores nothing after its time to
// act: the holder may have acted. Call it when the reservation will not
// be used, before its slot (Sleep does, when its context ends); for a
// grant taken at once and not used, use Limiter.Refund. A second call
// does nothing, and calls from several goroutines are safe.
func (r *Reservation) Cancel(ctx context.Context) error {
	if r == nil || r.n == 0 || !r.done.CompareAndSwap(false, true) {
		return nil
	}
	err := r.l.store.Cancel(ctx, r.bs, r.n, r.booked)
	if err != nil {
		r.done.Store(false) // not given back: a later call may try again
	}
	return err
}

// giveBack cancels the reservation, best effort, even once ctx has ended.
func (r *Reservation) giveBack(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refundTimeout)
	defer cancel()
	_ = r.Cancel(rctx)
}

// Sleep blocks until the booked slot begins. A slot that begins after
// ctx's deadline is given back at once and fails with a
// *BackpressureError; if ctx ends during the sleep the booking is given
// back (see Cancel) and ctx's error is returned.
func (r *Reservation) Sleep(ctx context.Context) error {
	if r == nil {
		return fmt.Errorf("%w: reservation is nil", ErrInvalid)
	}
	if dl, ok := ctx.Deadline(); ok && r.due.After(dl) {
		// The max wait counted from the request, the slot from the
		// store's decision, which came later: on this process's clock the
		// slot begins after the deadline, so the wait cannot be honoured.
		r.giveBack(ctx)
		return &BackpressureError{RetryAfter: r.Result.Wait, MaxWait: max(time.Until(dl), 0), Result: r.Result}
	}
	d := time.Until(r.due)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		r.giveBack(ctx)
		return ctx.Err()
	}
}

// Reserve books one token from the named bucket. See ReserveN.
func (l *Limiter) Reserve(ctx context.Context, name string) (*Reservation, error) {
	return l.ReserveN(ctx, 1, name)
}

// ReserveN books n tokens from every named bucket, now or up to the max
// wait in the future (or the horizon of ctx's priority class, when
// shorter: see WithPriority), in one round trip. When the wait would be longer,
// nothing is booked and the error is a *BackpressureError. n larger than a
// burst fails at once with ErrBurstExceeded.
func (l *Limiter) ReserveN(ctx context.Context, n int64, names ...string) (*Reservation, error) {
	return l.reserve(ctx, n, l.maxWait, names)
}

// reserve is ReserveN with a max wait.
func (l *Limiter) reserve(ctx context.Context, n int64, maxWait time.Duration, names []string) (*Reservation, error) {
	if ctx == nil {
		return nil, errNilContext
	}
	bs, err := l.buckets(names)
	if err != nil {
		return nil, err
	}
	defer l.release(bs)
	return l.book(ctx, Request{Buckets: slices.Clone(*bs), N: n, MaxWait: maxWait})
}

// Book books req, a store request built by the caller, as ReserveN books
// named buckets: with the limiter's clock anchor (Reservation.Due), ctx's
// priority class applied to every bucket (its reserve set, the max wait
// cut to its horizon) and cancels that give back only what no later
// booking relies on. It is for callers that take buckets with limits of
// their own beside the limiter's, such as transport's adapted rates and
// pause markers: take buckets from Limiter.Bucket and change their limits,
// or add buckets under a key no configured bucket uses. req.MaxWait is
// the longest wait to book (0: only now), at most the limiter's max wait;
// req.Booking is ignored (see Reservation.Booking).
func (l *Limiter) Book(ctx context.Context, req Request) (*Reservation, error) {
	if ctx == nil {
		return nil, errNilContext
	}
	if req.MaxWait > l.maxWait {
		return nil, fmt.Errorf("%w: max wait %v exceeds the limiter's max wait %v", ErrInvalid, req.MaxWait, l.maxWait)
	}
	req.Buckets = slices.Clone(req.Buckets)
	return l.book(ctx, req)
}

// book takes req's buckets, which the reservation keeps, under ctx's
// priority class.
func (l *Limiter) book(ctx context.Context, req Request) (*Reservation, error) {
	if l.store == nil {
		return nil, errZeroLimiter
	}
	var err error
	if req.MaxWait, err = l.classify(ctx, req.Buckets, req.MaxWait); err != nil {
		return nil, err
	}
	r := &Reservation{l: l, n: req.N}
	req.Booking = &r.booked
	start := time.Now()
	res, err := l.store.Take(ctx, req)
	// The wait counts from the store's decision, which happened between
	// start and the answer: the anchor places it (see anchor).
	answered := time.Now()
	res.Limit.strip()
	if err != nil {
		return nil, err
	}
	if !res.Allowed {
		return nil, &BackpressureError{RetryAfter: res.RetryAfter, MaxWait: req.MaxWait, Result: res}
	}
	r.Result, r.bs, r.due = res, req.Buckets, l.clock.due(start, answered, res)
	return r, nil
}

// Wait blocks until one token of the named bucket is granted, and returns
// the store's decision. See WaitN.
func (l *Limiter) Wait(ctx context.Context, name string) (Result, error) {
	return l.WaitN(ctx, 1, name)
}

// WaitN reserves n tokens from every named bucket with a max wait of the
// smallest of the configured max wait, ctx's deadline and the horizon of
// ctx's priority class (see WithPriority), then sleeps
// exactly the booked delay. Waiters are served in booking (FIFO) order and
// never poll. A wait that would exceed the bound fails at once with a
// *BackpressureError; so does a slot that, placed on this process's clock,
// would begin after ctx's deadline (the booking is then given back at
// once). If ctx ends during the sleep the booking is cancelled (see
// Reservation.Cancel) and ctx's error is returned. The longest WaitN
// blocks is the max wait, or less when ctx's deadline is sooner, plus the
// store's round trips.
func (l *Limiter) WaitN(ctx context.Context, n int64, names ...string) (Result, error) {
	if ctx == nil {
		return Result{}, errNilContext
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	maxWait := l.maxWait
	if dl, ok := ctx.Deadline(); ok {
		maxWait = max(min(maxWait, time.Until(dl)), 0)
	}
	r, err := l.reserve(ctx, n, maxWait, names)
	if err != nil {
		return Result{}, err
	}
	if err := r.Sleep(ctx); err != nil {
		return Result{}, err
	}
	return r.Result, nil
}

// Refund gives back the tokens of grant, the Result of an Allow (or
// AllowN) from the named buckets whose work was not done. See RefundN.
func (l *Limiter) Refund(ctx context.Context, grant Result, names ...string) error {
	return l.RefundN(ctx, grant, grant.N, names...)
}

// RefundN gives back n of the tokens of grant, a take from the named
// buckets that was granted at once (Allow, AllowN) and not all used: the
// tokens an LLM call estimated and did not spend, an Allow whose work
// failed. Each limit gets back what time has not refilled since the grant
// (grant.At), so refund promptly: a bucket that the grant emptied refills
// meanwhile, and tokens given back after it would have been full again
// would be granted twice. Nothing goes back while a slot is booked ahead
// on a limit or it is drained, for the same reason (see Store.Refund). A
// booking made ahead (Reserve, Wait) is given back with its Cancel.
func (l *Limiter) RefundN(ctx context.Context, grant Result, n int64, names ...string) error {
	if ctx == nil {
		return errNilContext
	}
	if n < 0 || n > grant.N {
		return fmt.Errorf("%w: refund n must be between 0 and the grant's n (%d), got %d", ErrInvalid, grant.N, n)
	}
	if !grant.Allowed {
		return fmt.Errorf("%w: refund grant: a denied take took nothing to give back", ErrInvalid)
	}
	bs, err := l.buckets(names)
	if err != nil {
		return err
	}
	defer l.release(bs)
	for i := range *bs {
		// The reserve of the bucket's lowest class: its bookings lie
		// ahead while the bucket holds less than that (see Store.Refund).
		for _, p := range l.classesOf((*bs)[i].Key) {
			(*bs)[i].Reserve = max((*bs)[i].Reserve, p.Reserve)
		}
	}
	return l.store.Refund(ctx, *bs, n, grant.At)
}

// Drain empties every named bucket for d: no tokens are granted for d, and
// then the buckets refill from empty, so a fleet resumes smoothly rather
// than in a burst. The outbound transport drains on a 429's Retry-After.
func (l *Limiter) Drain(ctx context.Context, d time.Duration, names ...string) error {
	if ctx == nil {
		return errNilContext
	}
	if d < 0 || d > MaxWaitCap {
		return fmt.Errorf("%w: drain duration must be between 0 and %v, got %v", ErrInvalid, MaxWaitCap, d)
	}
	bs, err := l.buckets(names)
	if err != nil {
		return err
	}
	defer l.release(bs)
	return l.store.Drain(ctx, *bs, d)
}

// DrainUntil drains the named buckets until t, read on the limiter's clock.
// A time in the past drains nothing beyond emptying the buckets now.
func (l *Limiter) DrainUntil(ctx context.Context, t time.Time, names ...string) error {
	if l.store == nil {
		return errZeroLimiter
	}
	now := l.now()
	d := t.Sub(now)
	if d > MaxWaitCap {
		return fmt.Errorf("%w: drain until %v: at most %v from now (%v)", ErrInvalid, t, MaxWaitCap, now)
	}
	return l.Drain(ctx, max(d, 0), names...)
}

// Reset deletes the named buckets, leaving them full.
func (l *Limiter) Reset(ctx context.Context, names ...string) error {
	if ctx == nil {
		return errNilContext
	}
	bs, err := l.buckets(names)
	if err != nil {
		return err
	}
	defer l.release(bs)
	keys := make([]string, len(*bs))
	for i, b := range *bs {
		keys[i] = b.StoreKey()
	}
	return l.store.Reset(ctx, keys...)
}
