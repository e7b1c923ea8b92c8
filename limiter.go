package fleetrate

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"
)

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
	// inFlight bounds the buckets of the default limits; permitTTL is
	// the lease of every permit the limiter takes.
	inFlight  int64
	permitTTL time.Duration
	// quotas are the calendar quotas of the buckets of the default
	// limits.
	quotas  []Quota
	permits permitCounts
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
		store:     store,
		prefix:    cfg.Prefix,
		limits:    compileLimits(cfg.Limits),
		named:     make(map[string]namedBucket, len(cfg.Buckets)),
		maxWait:   cfg.MaxWait,
		now:       cfg.Clock,
		classes:   slices.Clone(cfg.Priorities),
		inFlight:  cfg.InFlight,
		permitTTL: cfg.PermitTTL,
		quotas:    slices.Clone(cfg.Quotas),
	}
	if l.permitTTL == 0 {
		l.permitTTL = DefaultPermitTTL
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
	if l.inFlight == 0 && len(l.quotas) == 0 {
		// A bound take has no permit nor quota: buckets with an in-flight
		// bound or quotas take through requests.
		l.bound = l.bind(binder, l.limits)
	}
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
	nb := namedBucket{Bucket: Bucket{Prefix: l.prefix, Key: b.Name, Limits: compileLimits(b.Limits), InFlight: b.InFlight, Quotas: slices.Clone(b.Quotas)}}
	if b.InFlight == 0 && len(b.Quotas) == 0 {
		nb.taker = l.bind(binder, nb.Limits)
	}
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
	return Bucket{Prefix: l.prefix, Key: name, Limits: l.limits, InFlight: l.inFlight, Quotas: l.quotas}, nil
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
	l.lowestReserves(*bs)
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
