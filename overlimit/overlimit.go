// Package overlimit is a fleetrate.Store wrapper that remembers denials:
// once the store has said that a bucket cannot give n tokens before time
// t, a take of at least n tokens from it before t is denied at once,
// without a round trip to the store. Hot keys that are over their limit,
// the ones that flood a shared store with takes it will refuse, then cost
// the store nothing until they can pass again. It is what
// envoyproxy/ratelimit's LOCAL_CACHE_SIZE_IN_BYTES does for its fixed
// windows, for token buckets: there a key over its limit is cached until
// the end of its window; here a bucket is cached until the store's own
// retry-after for the cost it denied.
//
// What it changes: a denial it answers is one the store would have given,
// as long as nothing gives tokens back to the bucket meanwhile. Refunds,
// cancels and resets made through this wrapper forget the bucket's
// denial; those made by another process (or another wrapper) are not
// seen, so until the cached time a take may be denied that the store
// would now grant. Denials may be conservative; a grant is never made
// that the store would refuse, because every grant comes from the store.
// A cached denial spends nothing, as a store's denial does not.
package overlimit

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
)

// Options configure a Store. The zero value of each field means its
// default.
type Options struct {
	// MaxBytes bounds the memory the cached denials take, counted as each
	// bucket's key length plus EntryOverhead bytes, plus 16 a limit. When
	// it is full, the denial that ends soonest among a few sampled is
	// dropped. The default is 1 MiB, some 5,000 keys of 64 bytes.
	MaxBytes int64
	// Clock is the cache's time source, used only to measure elapsed
	// time. The default is the monotonic clock.
	Clock func() time.Time
	// Registerer, when set, receives the cache's metrics:
	// fleetrate_overlimit_cache_hits_total and _misses_total (see Stats),
	// fleetrate_overlimit_cache_entries and _bytes.
	Registerer prometheus.Registerer
}

// DefaultMaxBytes is the default of Options.MaxBytes.
const DefaultMaxBytes = 1 << 20

// EntryOverhead is what Options.MaxBytes counts for a cached denial
// besides its key and limits.
const EntryOverhead = 160

// maxShards is the most independently locked parts of the cache; a
// small cache has fewer, so that each holds at least minShardBytes.
const (
	maxShards     = 32
	minShardBytes = 8 << 10
)

// evictScan is how many denials a full shard samples for one to drop.
const evictScan = 4

// Stats are the cache's counters since it was made.
type Stats struct {
	// Hits counts takes denied from the cache, without calling the store.
	Hits uint64
	// Misses counts takes that went to the store: no denial was cached
	// for them, or it had ended, or it was for a larger cost or other
	// limits. Peeks (N 0) are neither.
	Misses uint64
	// Entries and Bytes are the denials held now and the bytes counted
	// for them.
	Entries int
	Bytes   int64
}

// Store wraps a fleetrate.Store with a cache of its denials. It is safe
// for concurrent use.
type Store struct {
	next     fleetrate.Store
	clock    func() time.Time
	start    time.Time
	seed     maphash.Seed
	shards   []shard
	mask     uint64
	maxBytes int64 // per shard
	hits     atomic.Uint64
	misses   atomic.Uint64
	// gen counts the calls that give tokens back. A denial is cached only
	// if none began while the store decided it: it might predate one.
	gen atomic.Uint64
}

type shard struct {
	mu    sync.Mutex
	m     map[string]*denial
	bytes int64
}

// denial is what the store said of one bucket: it could not give need
// tokens (the take's cost plus the bucket's reserve) before until.
type denial struct {
	until  int64 // ns on the cache's clock
	need   int64
	limits []limitKey
	size   int64
	res    fleetrate.Result // the store's answer
	asked  int64            // ns on the cache's clock, when the store was asked
}

// limitKey is what identifies a limit, without the Limit's cached fields.
type limitKey struct {
	rate  float64
	burst int64
}

var _ fleetrate.Store = (*Store)(nil)

// New returns next wrapped with a cache of its denials. It panics, as
// prometheus.MustRegister does, when Options.Registerer already holds the
// cache's metrics.
func New(next fleetrate.Store, opts Options) *Store {
	if next == nil {
		next = nilStore{}
	}
	s := &Store{next: next, clock: opts.Clock, seed: maphash.MakeSeed()}
	if s.clock == nil {
		s.clock = time.Now
	}
	s.start = s.clock()
	total := opts.MaxBytes
	if total <= 0 {
		total = DefaultMaxBytes
	}
	n := maxShards
	for n > 1 && total/int64(n) < minShardBytes {
		n /= 2
	}
	s.shards, s.mask = make([]shard, n), uint64(n-1)
	s.maxBytes = max(total/int64(n), 1)
	for i := range s.shards {
		s.shards[i].m = map[string]*denial{}
	}
	if opts.Registerer != nil {
		s.register(opts.Registerer)
	}
	return s
}

func (s *Store) register(r prometheus.Registerer) {
	counter := func(name, help string, v *atomic.Uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "fleetrate", Subsystem: "overlimit_cache", Name: name, Help: help},
			func() float64 { return float64(v.Load()) })
	}
	gauge := func(name, help string, f func(Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "fleetrate", Subsystem: "overlimit_cache", Name: name, Help: help},
			func() float64 { return f(s.Stats()) })
	}
	r.MustRegister(
		counter("hits_total", "Takes denied from the over-limit cache, without a store call.", &s.hits),
		counter("misses_total", "Takes the over-limit cache sent to the store.", &s.misses),
		gauge("entries", "Denials the over-limit cache holds.", func(st Stats) float64 { return float64(st.Entries) }),
		gauge("bytes", "Bytes counted for the denials the over-limit cache holds.", func(st Stats) float64 { return float64(st.Bytes) }),
	)
}

// now returns the cache's clock, in ns since it was made.
func (s *Store) now() int64 { return int64(s.clock().Sub(s.start)) }

func (s *Store) shardOf(key []byte) *shard {
	return &s.shards[maphash.Bytes(s.seed, key)&s.mask]
}

// MultipleClocks implements fleetrate.MultiClock for the wrapped store.
func (s *Store) MultipleClocks() bool {
	mc, ok := s.next.(fleetrate.MultiClock)
	return ok && mc.MultipleClocks()
}

// Unwrap returns the store whose denials s caches, so that callers can
// find what it offers beyond fleetrate.Store: a transport over a Limiter
// on s finds the store's Announcer through it and keeps telling the fleet
// of its pauses (see transport.Announcer). It is not nil when New was
// given a nil store: it is then a store whose every call fails.
func (s *Store) Unwrap() fleetrate.Store { return s.next }

// Take implements fleetrate.Store. A take of N > 0 tokens is denied at
// once when a bucket of it has a cached denial that has not ended, for
// the same limits and a cost (N plus the bucket's Reserve) no larger than
// the take's, and that would still not have ended after the take's
// MaxWait. Otherwise the store decides, and its denial is cached.
func (s *Store) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if req.N <= 0 || req.Permit.ID != "" || quotas(req) {
		// A peek, a take with costs by bucket, or one of a permit: a
		// permit's denial ends when a holder releases, which no
		// retry-after foretells. A take with calendar quotas reports
		// their use, which a cached denial would not.
		return s.next.Take(ctx, req)
	}
	if err := req.Validate(); err != nil {
		return fleetrate.Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return fleetrate.Result{}, err
	}
	asked := s.now()
	if res, ok := s.lookup(req, asked); ok {
		s.hits.Add(1)
		return res, nil
	}
	s.misses.Add(1)
	gen := s.gen.Load()
	res, err := s.next.Take(ctx, req)
	if err == nil && !res.Allowed && res.RetryAfter > 0 && res.Bucket >= 0 && res.Bucket < len(req.Buckets) {
		s.remember(req, res, asked, gen)
	}
	return res, err
}

// quotas reports whether a bucket of req has calendar quotas.
func quotas(req fleetrate.Request) bool {
	for i := range req.Buckets {
		if len(req.Buckets[i].Quotas) > 0 {
			return true
		}
	}
	return false
}

// key writes b's full store key into buf.
func key(buf []byte, b *fleetrate.Bucket) []byte {
	return append(append(buf[:0], b.Prefix...), b.Key...)
}

func limitKeys(ls []fleetrate.Limit) []limitKey {
	ks := make([]limitKey, len(ls))
	for i, l := range ls {
		ks[i] = limitKey{l.Rate, l.Burst}
	}
	return ks
}

func sameLimits(ks []limitKey, ls []fleetrate.Limit) bool {
	if len(ks) != len(ls) {
		return false
	}
	for i, l := range ls {
		if ks[i] != (limitKey{l.Rate, l.Burst}) {
			return false
		}
	}
	return true
}

// lookup returns the denial of req the cache knows at now, if any.
func (s *Store) lookup(req fleetrate.Request, now int64) (fleetrate.Result, bool) {
	var buf [128]byte
	for i := range req.Buckets {
		b := &req.Buckets[i]
		k := key(buf[:0], b)
		sh := s.shardOf(k)
		sh.mu.Lock()
		d := sh.m[string(k)]
		if d == nil {
			sh.mu.Unlock()
			continue
		}
		if d.until <= now {
			sh.drop(string(k), d) // ended
			sh.mu.Unlock()
			continue
		}
		denied := d.until-now > int64(req.MaxWait) && req.N+b.Reserve >= d.need && sameLimits(d.limits, b.Limits)
		var res fleetrate.Result
		if denied {
			res = d.result(now, i, req.N)
		}
		sh.mu.Unlock()
		if denied {
			return res, true
		}
	}
	return fleetrate.Result{}, false
}

// result is the denial d answers at now for the take of n tokens whose
// bucket i it is: the store's answer with its times moved on by the time
// elapsed since the store was asked, and a retry-after until d ends, a
// lower bound of the store's.
func (d *denial) result(now int64, i int, n int64) fleetrate.Result {
	el := time.Duration(now - d.asked)
	res := d.res
	res.N, res.Bucket = n, i
	res.RetryAfter = time.Duration(d.until - now)
	res.ResetAfter = max(res.ResetAfter-el, res.RetryAfter)
	// The next token is as much nearer (0 if it has come: then nothing is
	// known of the one after), so that RateLimit's "t", read from it,
	// never reaches past it.
	res.NextToken = max(res.NextToken-el, 0)
	res.At = res.At.Add(el)
	return res
}

// remember caches the store's denial res of req, asked at asked (before
// the store decided, so that the cached end is never later than the
// store's) when the generation was gen.
func (s *Store) remember(req fleetrate.Request, res fleetrate.Result, asked int64, gen uint64) {
	b := &req.Buckets[res.Bucket]
	var buf [128]byte
	k := key(buf[:0], b)
	d := &denial{
		until:  asked + int64(res.RetryAfter),
		need:   req.N + b.Reserve,
		limits: limitKeys(b.Limits),
		size:   EntryOverhead + int64(len(k)) + 16*int64(len(b.Limits)),
		res:    res,
		asked:  asked,
	}
	sh := s.shardOf(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s.gen.Load() != gen {
		return // tokens were given back meanwhile, maybe to this bucket
	}
	if old := sh.m[string(k)]; old != nil {
		sh.drop(string(k), old)
	}
	for sh.bytes+d.size > s.maxBytes && len(sh.m) > 0 {
		sh.evict(asked)
	}
	if d.size > s.maxBytes {
		return // larger than a shard: not cached
	}
	sh.m[string(k)] = d
	sh.bytes += d.size
}

func (sh *shard) drop(k string, d *denial) {
	delete(sh.m, k)
	sh.bytes -= d.size
}

// evict drops every ended denial among evictScan sampled, or else the one
// that ends soonest.
func (sh *shard) evict(now int64) {
	var (
		victim string
		vd     *denial
		seen   int
	)
	for k, d := range sh.m {
		if d.until <= now {
			sh.drop(k, d)
		} else if vd == nil || d.until < vd.until {
			victim, vd = k, d
		}
		if seen++; seen == evictScan {
			break
		}
	}
	if vd != nil && sh.m[victim] == vd {
		sh.drop(victim, vd)
	}
}

// giveBack runs f, which gives tokens back to the buckets of keys, and
// then drops their cached denials. The generation changes first, so that
// no denial the store decided before f ran is cached after it.
func (s *Store) giveBack(f func() error, keys ...string) error {
	s.gen.Add(1)
	err := f()
	s.forget(keys...)
	return err
}

// forget drops the cached denials of the buckets of keys.
func (s *Store) forget(keys ...string) {
	for _, k := range keys {
		sh := s.shardOf([]byte(k))
		sh.mu.Lock()
		if d := sh.m[k]; d != nil {
			sh.drop(k, d)
		}
		sh.mu.Unlock()
	}
}

func storeKeys(buckets []fleetrate.Bucket) []string {
	keys := make([]string, len(buckets))
	for i, b := range buckets {
		keys[i] = b.StoreKey()
	}
	return keys
}

// Refund implements fleetrate.Store; it forgets the buckets' denials.
func (s *Store) Refund(ctx context.Context, buckets []fleetrate.Bucket, n int64, at time.Time) error {
	return s.giveBack(func() error { return s.next.Refund(ctx, buckets, n, at) }, storeKeys(buckets)...)
}

// Cancel implements fleetrate.Store; it forgets the buckets' denials.
func (s *Store) Cancel(ctx context.Context, buckets []fleetrate.Bucket, n int64, b fleetrate.Booking) error {
	return s.giveBack(func() error { return s.next.Cancel(ctx, buckets, n, b) }, storeKeys(buckets)...)
}

// Drain implements fleetrate.Store. A drain only takes tokens, so the
// cached denials stay true.
func (s *Store) Drain(ctx context.Context, buckets []fleetrate.Bucket, d time.Duration) error {
	return s.next.Drain(ctx, buckets, d)
}

// Settle implements fleetrate.Store; it forgets the buckets' denials
// (a settle may give tokens back).
func (s *Store) Settle(ctx context.Context, buckets []fleetrate.Bucket, st fleetrate.Settlement) error {
	return s.giveBack(func() error { return s.next.Settle(ctx, buckets, st) }, storeKeys(buckets)...)
}

// Release implements fleetrate.Store.
func (s *Store) Release(ctx context.Context, buckets []fleetrate.Bucket, id string) (int, error) {
	return s.next.Release(ctx, buckets, id)
}

// Renew implements fleetrate.Store.
func (s *Store) Renew(ctx context.Context, buckets []fleetrate.Bucket, p fleetrate.Permit) (int, error) {
	return s.next.Renew(ctx, buckets, p)
}

// DrainEach implements fleetrate.Store; a void drain may give tokens
// back, so it forgets the buckets' denials.
func (s *Store) DrainEach(ctx context.Context, drains []fleetrate.Drain) error {
	keys := make([]string, len(drains))
	for i, d := range drains {
		keys[i] = d.Bucket.StoreKey()
	}
	return s.giveBack(func() error { return s.next.DrainEach(ctx, drains) }, keys...)
}

// Reset implements fleetrate.Store; it forgets the buckets' denials.
func (s *Store) Reset(ctx context.Context, keys ...string) error {
	return s.giveBack(func() error { return s.next.Reset(ctx, keys...) }, keys...)
}

// Stats returns the cache's counters.
func (s *Store) Stats() Stats {
	st := Stats{Hits: s.hits.Load(), Misses: s.misses.Load()}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Entries += len(sh.m)
		st.Bytes += sh.bytes
		sh.mu.Unlock()
	}
	return st
}

// errNilStore is what every call of a Store that New was given no store
// for answers.
var errNilStore = fmt.Errorf("%w: overlimit: the wrapped store is nil (give New a store)", fleetrate.ErrInvalid)

// nilStore stands for the nil store New was given: every call is an error.
type nilStore struct{}

func (nilStore) Take(context.Context, fleetrate.Request) (fleetrate.Result, error) {
	return fleetrate.Result{}, errNilStore
}
func (nilStore) Refund(context.Context, []fleetrate.Bucket, int64, time.Time) error {
	return errNilStore
}
func (nilStore) Cancel(context.Context, []fleetrate.Bucket, int64, fleetrate.Booking) error {
	return errNilStore
}
func (nilStore) Drain(context.Context, []fleetrate.Bucket, time.Duration) error { return errNilStore }
func (nilStore) DrainEach(context.Context, []fleetrate.Drain) error             { return errNilStore }
func (nilStore) Settle(context.Context, []fleetrate.Bucket, fleetrate.Settlement) error {
	return errNilStore
}
func (nilStore) Release(context.Context, []fleetrate.Bucket, string) (int, error) {
	return 0, errNilStore
}
func (nilStore) Renew(context.Context, []fleetrate.Bucket, fleetrate.Permit) (int, error) {
	return 0, errNilStore
}
func (nilStore) Reset(context.Context, ...string) error { return errNilStore }
