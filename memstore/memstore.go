// Package memstore is the in-memory fleetrate.Store: the embedded default
// for a single process. It is sharded so that goroutines on different keys
// rarely contend, it evicts buckets once they have refilled (an absent
// bucket is a full one, so eviction changes no decision), and it takes an
// injectable clock for tests.
package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/bits"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/gcra"
)

// Options configure a Store. The zero value of each field means its
// default.
type Options struct {
	// Clock is the store's time source. The default is the wall clock
	// read when the store is made plus the monotonic time elapsed since, as
	// time.Now reads it but at half the cost (one clock read, not two):
	// refill follows elapsed time exactly, as in golang.org/x/time/rate,
	// and a step of the wall clock (an NTP correction) neither refills nor
	// freezes the buckets, though Result.At then differs from time.Now by
	// the step.
	Clock func() time.Time
	// Shards is the number of independently locked shards, rounded up to a
	// power of two. The default is 64 × GOMAXPROCS, so that goroutines
	// on different keys rarely meet on a shard.
	Shards int
	// MaxKeys bounds the number of buckets held. When a shard is full, the
	// bucket closest to refilling among a small sample is dropped, which
	// refills it early: size MaxKeys above your live key count. The default
	// is 1,000,000; a negative value means no bound.
	MaxKeys int
	// MaxBytes bounds the memory the buckets hold, counted as each
	// bucket's key length plus BucketOverhead bytes (its entry, its place
	// in the shard's map and snapshot, and its debts), plus 16 bytes per
	// limit beyond two. It is enforced per shard as MaxKeys is, by the same
	// eviction, so that long keys cannot exhaust memory where MaxKeys
	// alone would let them: a million 4 KB keys are 4 GB. A shard keeps
	// at least the bucket it has just written, so the bound is MaxBytes
	// plus at most one bucket per shard. The default is DefaultMaxBytes
	// (256 MiB); a negative value means no bound.
	MaxBytes int64
}

// DefaultMaxKeys is the default bound on the number of buckets.
const DefaultMaxKeys = 1_000_000

// DefaultMaxBytes is the default bound on the bytes the buckets hold (see
// Options.MaxBytes): 256 MiB, about 700,000 buckets of 40-byte keys
// (BucketOverhead and the key each), so that for ordinary keys it binds a
// little before DefaultMaxKeys, and for long keys well before.
const DefaultMaxBytes = 256 << 20

// BucketOverhead is what Options.MaxBytes counts for one bucket besides
// its key: its entry (a 256-byte allocation on amd64) and what its state
// holds beside it (a limit's leads, 32 bytes: see gcra.Lead), its slot in
// the shard's map and in the shard's snapshot, and the snapshot's slack.
// TestBucketOverheadIsHeapPerBucket measures it.
const BucketOverhead = 340

// Store is an in-memory fleetrate.Store. It is safe for concurrent use.
type Store struct {
	clock    func() time.Time // nil: the monotonic clock from start
	start    time.Time        // when the store was made, with a monotonic reading
	startNs  int64            // start in ns since the Unix epoch
	seed     maphash.Seed
	shards   []shard
	mask     uint64
	shardCap int   // buckets per shard; 0 means no bound
	maxBytes int64 // bytes per shard; 0 means no bound
	waiters  waiters
}

var (
	_ fleetrate.Store          = (*Store)(nil)
	_ fleetrate.Binder         = (*Store)(nil)
	_ fleetrate.PermitNotifier = (*Store)(nil)
	_ fleetrate.MultiTaker     = (*Store)(nil)
)

// ProcessLocal reports true: the buckets live in this process only, so a
// transport over this store has no fleet to tell of its pauses (see
// transport.Announcer) and does not warn that it cannot.
func (s *Store) ProcessLocal() bool { return true }

// New returns a ready Store.
func New(opts Options) *Store {
	n := opts.Shards
	if n <= 0 {
		n = 64 * runtime.GOMAXPROCS(0)
	}
	n = 1 << bits.Len(uint(n-1))
	s := &Store{
		clock:  opts.Clock,
		seed:   maphash.MakeSeed(),
		shards: make([]shard, n),
		mask:   uint64(n - 1),
	}
	if s.clock == nil {
		s.start = time.Now()
		s.startNs = s.start.UnixNano()
	}
	switch {
	case opts.MaxKeys == 0:
		s.shardCap = max(DefaultMaxKeys/n, 1)
	case opts.MaxKeys > 0:
		s.shardCap = max(opts.MaxKeys/n, 1)
	}
	switch {
	case opts.MaxBytes == 0:
		s.maxBytes = max(DefaultMaxBytes/int64(n), 1)
	case opts.MaxBytes > 0:
		s.maxBytes = max(opts.MaxBytes/int64(n), 1)
	}
	for i := range s.shards {
		s.shards[i].t = newTable()
	}
	return s
}

// now returns the store's clock in µs since the Unix epoch.
func (s *Store) now() int64 {
	if s.clock != nil {
		return s.clock().UnixMicro()
	}
	return (s.startNs + int64(time.Since(s.start))) / 1000
}

// hash returns key's hash, which picks its shard and indexes the shard's
// table.
func (s *Store) hash(key []byte) uint64 { return maphash.Bytes(s.seed, key) }

func (s *Store) shardOf(h uint64) *shard { return &s.shards[h&s.mask] }

// fullKeys returns each bucket's full key (Prefix + Key) and its hash.
func (s *Store) fullKeys(bs []fleetrate.Bucket) ([][]byte, []uint64) {
	keys, hs := make([][]byte, len(bs)), make([]uint64, len(bs))
	for i, b := range bs {
		keys[i] = []byte(b.StoreKey())
		hs[i] = s.hash(keys[i])
	}
	return keys, hs
}

// lock locks the shards of the keys hashed to hs in index order, so that
// takes across several buckets are atomic and deadlock-free. It returns
// the shards to unlock, written into idx.
func (s *Store) lock(hs []uint64, idx []int) []int {
	for _, h := range hs {
		n := int(h & s.mask)
		if !slices.Contains(idx, n) {
			idx = append(idx, n)
		}
	}
	slices.Sort(idx)
	for _, i := range idx {
		s.shards[i].mu.Lock()
	}
	return idx
}

func (s *Store) unlock(idx []int) {
	for _, i := range idx {
		s.shards[i].mu.Unlock()
	}
}

// TakeMany implements fleetrate.MultiTaker: a take here costs far less
// than a goroutine, so they are made one after the other.
func (s *Store) TakeMany(ctx context.Context, reqs []fleetrate.Request, res []fleetrate.Result, errs []error) {
	for i := range reqs {
		res[i], errs[i] = s.Take(ctx, reqs[i])
	}
}

// Take implements fleetrate.Store.
func (s *Store) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if err := ctx.Err(); err != nil {
		return fleetrate.Result{}, err
	}
	if err := req.Validate(); err != nil {
		return fleetrate.Result{}, err
	}
	if len(req.Buckets) == 1 && req.Booking == nil && req.Buckets[0].Reserve == 0 && req.Costs == nil && req.Buckets[0].InFlight == 0 && len(req.Buckets[0].Quotas) == 0 {
		var res fleetrate.Result
		b := &req.Buckets[0]
		s.takeOne(b.Prefix, b.Key, b.Limits, req.N, req.MaxWait, &res)
		return res, nil
	}
	var res fleetrate.Result
	s.atomically(req.Buckets, func(now int64, states []gcra.State) bool {
		// As in takeEntry: a take that books nothing writes nothing.
		for i := range states {
			states[i] = states[i].Clone()
		}
		var changed bool
		res, changed = gcra.Decide(now, req, states)
		return changed
	})
	return res, nil
}

// atomically loads the state of every bucket, with the shards of their
// keys locked in index order (so that operations across several buckets
// are atomic and deadlock-free), calls f with the time to decide at (the
// latest of the clock and the states' stamps: see entry.live) and the
// states, and saves them back. f may change the states in place: gcra's
// functions refill them in place, so they are saved even when f decides
// nothing, unless f reports false: then nothing is saved. The entries
// stay locked (and so are never evicted) until they are saved.
func (s *Store) atomically(buckets []fleetrate.Bucket, f func(now int64, states []gcra.State) (save bool)) {
	var (
		stateBuf [4]gcra.State
		entryBuf [4]*entry
		idxBuf   [4]int
	)
	keys, hs := s.fullKeys(buckets)
	idx := s.lock(hs, idxBuf[:0])
	defer s.unlock(idx)
	now := s.now()
	states, entries := stateBuf[:0], entryBuf[:0]
	at := now
	for i, k := range keys {
		e, st, t := s.load(s.shardOf(hs[i]), hs[i], k, now)
		states, entries, at = append(states, st), append(entries, e), max(at, t)
	}
	if !f(at, states) {
		for _, e := range entries {
			if e != nil {
				e.mu.Unlock()
			}
		}
		return
	}
	for i, k := range keys {
		s.save(s.shardOf(hs[i]), hs[i], k, entries[i], states[i])
	}
}

// Bind implements fleetrate.Binder.
func (s *Store) Bind(prefix string, limits []fleetrate.Limit) (fleetrate.BoundTaker, error) {
	if err := fleetrate.ValidateBuckets([]fleetrate.Bucket{{Prefix: prefix, Key: "*", Limits: limits}}); err != nil {
		return nil, err
	}
	t := &bound{s: s, prefix: prefix, limits: slices.Clone(limits), maxN: limits[0].Burst}
	for _, l := range limits {
		t.maxN = min(t.maxN, l.Burst)
	}
	return t, nil
}

// bound is a Store bound to one prefix and one list of validated limits.
type bound struct {
	s      *Store
	prefix string
	limits []fleetrate.Limit
	maxN   int64 // the smallest burst: no take may ask for more
	// hot is the entry of a bucket taken from before, which a take of
	// the same key uses without hashing or looking it up: a Limiter
	// that paces one upstream takes from one key. It is the first entry
	// taken, replaced only once it leaves its table, so that a Limiter
	// over many keys never writes it (that would make the cores fight
	// over its cache line) and only compares one key more.
	hot atomic.Pointer[entry]
}

// TakeKey implements fleetrate.BoundTaker.
func (t *bound) TakeKey(ctx context.Context, key string, n int64, maxWait time.Duration) (res fleetrate.Result, err error) {
	if err := ctx.Err(); err != nil {
		return fleetrate.Result{}, err
	}
	if key == "" || n < 0 || n > t.maxN || maxWait < 0 || maxWait > fleetrate.MaxWaitCap {
		// Let Validate name the invalid argument.
		bs := []fleetrate.Bucket{{Prefix: t.prefix, Key: key, Limits: t.limits}}
		return fleetrate.Result{}, fleetrate.Request{Buckets: bs, N: n, MaxWait: maxWait}.Validate()
	}
	if e := t.hot.Load(); e != nil && e.is(t.prefix, key) && t.s.takeEntry(e, t.limits, n, maxWait, &res) {
		return res, nil
	}
	if e := t.s.takeOne(t.prefix, key, t.limits, n, maxWait, &res); e != nil {
		if h := t.hot.Load(); h == nil || h.dead.Load() {
			t.hot.Store(e)
		}
	}
	return res, nil
}

// takeOne is Take for one bucket, the common case, without allocating:
// the key is built on the stack, the map is read with it in place, and
// the decision is written straight into *res. It returns the bucket's
// entry, or nil when the bucket is full and has none.
func (s *Store) takeOne(prefix, name string, limits []fleetrate.Limit, n int64, maxWait time.Duration, res *fleetrate.Result) *entry {
	var buf [64]byte
	key := append(append(buf[:0], prefix...), name...)
	h := s.hash(key)
	sh := s.shardOf(h)
	if ro := sh.ro.Load(); ro != nil {
		if e := ro.get(h, key); e != nil && s.takeEntry(e, limits, n, maxWait, res) {
			return e
		}
	}
	now := s.now()
	sh.mu.Lock()
	e, st, at := s.load(sh, h, key, now)
	// As in takeEntry: a take that books nothing writes nothing.
	if st = st.Clone(); gcra.DecideOne(at, limits, n, maxWait, &st, res) {
		e = s.save(sh, h, key, e, st)
	} else if e != nil {
		e.mu.Unlock()
	}
	sh.refresh()
	sh.mu.Unlock()
	return e
}

// takeEntry is takeOne for a bucket whose entry e is known, locking only
// e. It reports false, deciding nothing, when e has left its table.
func (s *Store) takeEntry(e *entry, limits []fleetrate.Limit, n int64, maxWait time.Duration, res *fleetrate.Result) bool {
	// Read the clock before locking, to keep the lock short; live decides
	// at the bucket's stamp when a take with a later reading came first.
	now := s.now()
	e.mu.Lock()
	if e.dead.Load() {
		e.mu.Unlock()
		return false
	}
	at := e.elapse(now)
	// A take that books nothing (a peek, a denial) writes nothing, as the
	// Lua scripts write nothing for one: a decision's refill, and its
	// conversion of a bucket written for other limits, are in the terms
	// of the limits that decided, and another configuration reading the
	// bucket next must refill it in its own (see gcra.State.Elapse). One
	// that peeks in turn with another that takes would otherwise refill
	// the bucket at its own pace, for the other to spend.
	if !e.inlined() || e.state.Converts(limits) {
		if st := e.state.Clone(); gcra.DecideOne(at, limits, n, maxWait, &st, res) {
			e.apply(st)
		}
		e.mu.Unlock()
		return true
	}
	// Decide on e.state itself, its debts in e's inline array (a copy of
	// the state in and out cost a third of an Allow), and put the array
	// back if the take booked nothing: it holds no pointer, so keeping it
	// costs less than copying a State.
	inline, stamp, anchor, horizon := e.inline, e.state.Stamp, e.state.Anchor, e.state.Horizon
	if gcra.DecideOne(at, limits, n, maxWait, &e.state, res) {
		e.settle()
	} else {
		e.inline, e.state.Stamp, e.state.Anchor, e.state.Horizon = inline, stamp, anchor, horizon
	}
	e.mu.Unlock()
	return true
}

// Refund implements fleetrate.Store.
func (s *Store) Refund(ctx context.Context, buckets []fleetrate.Bucket, n int64, at time.Time) error {
	if err := fleetrate.ValidateRefund(buckets, n, at); err != nil {
		return err
	}
	stamp := at.UnixMicro()
	return s.update(ctx, buckets, func(now int64, b fleetrate.Bucket, st *gcra.State) {
		gcra.Refund(now, b.Limits, st, n, stamp, b.Reserve)
	})
}

// Cancel implements fleetrate.Store.
func (s *Store) Cancel(ctx context.Context, buckets []fleetrate.Bucket, n int64, b fleetrate.Booking) error {
	if err := fleetrate.ValidateCancel(buckets, n, b); err != nil {
		return err
	}
	wait := gcra.BookedWait(buckets, b.Debts)
	off, i := 0, 0
	return s.update(ctx, buckets, func(now int64, bk fleetrate.Bucket, st *gcra.State) {
		m := len(bk.Limits)
		gcra.Cancel(now, bk.Limits, st, fleetrate.CostOf(n, b.Costs, i), b.Stamp, b.Debts[off:off+m], wait)
		off += m
		i++
	})
}

// Settle implements fleetrate.Store.
func (s *Store) Settle(ctx context.Context, buckets []fleetrate.Bucket, st fleetrate.Settlement) error {
	if err := fleetrate.ValidateSettle(buckets, st); err != nil {
		return err
	}
	at, i := st.At.UnixMicro(), 0
	return s.update(ctx, buckets, func(now int64, b fleetrate.Bucket, state *gcra.State) {
		gcra.Settle(now, b.Limits, state, st.Costs[i], st.Actual[i], at, b.Reserve)
		i++
	})
}

// Drain implements fleetrate.Store.
func (s *Store) Drain(ctx context.Context, buckets []fleetrate.Bucket, d time.Duration) error {
	if d < 0 || d > fleetrate.MaxWaitCap {
		return fmt.Errorf("%w: drain duration must be between 0 and %v, got %v", fleetrate.ErrInvalid, fleetrate.MaxWaitCap, d)
	}
	return s.update(ctx, buckets, func(now int64, b fleetrate.Bucket, st *gcra.State) {
		gcra.Drain(now, b.Limits, st, d, false)
	})
}

// DrainEach implements fleetrate.Store.
func (s *Store) DrainEach(ctx context.Context, drains []fleetrate.Drain) error {
	if err := fleetrate.ValidateDrains(drains); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	buckets := make([]fleetrate.Bucket, len(drains))
	for i, d := range drains {
		buckets[i] = d.Bucket
	}
	s.atomically(buckets, func(now int64, states []gcra.State) bool {
		for i, d := range drains {
			gcra.Drain(now, d.Bucket.Limits, &states[i], d.For, d.Void)
		}
		return true
	})
	return nil
}

func (s *Store) update(ctx context.Context, buckets []fleetrate.Bucket, apply func(int64, fleetrate.Bucket, *gcra.State)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := fleetrate.ValidateBuckets(buckets); err != nil {
		return err
	}
	s.atomically(buckets, func(now int64, states []gcra.State) bool {
		for i, b := range buckets {
			apply(now, b, &states[i])
		}
		return true
	})
	return nil
}

// Reset implements fleetrate.Store.
func (s *Store) Reset(ctx context.Context, keys ...string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, k := range keys {
		h := s.hash([]byte(k))
		sh := s.shardOf(h)
		sh.mu.Lock()
		if e := sh.t.get(h, []byte(k)); e != nil {
			e.mu.Lock()
			sh.t.del(e)
			e.mu.Unlock()
		}
		sh.mu.Unlock()
	}
	return nil
}

// Bytes returns the bytes counted against Options.MaxBytes for the
// buckets held, expired ones included until they are swept.
func (s *Store) Bytes() int64 {
	var n int64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.t.bytes
		sh.mu.Unlock()
	}
	return n
}

// Len returns the number of buckets held, expired ones included until they
// are swept.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.t.n
		sh.mu.Unlock()
	}
	return n
}

// State returns a copy of the stored state of a bucket, for tests and
// debugging. ok is false when the bucket is absent or expired (full).
func (s *Store) State(_ context.Context, key string) (st gcra.State, ok bool, err error) {
	h := s.hash([]byte(key))
	sh := s.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.t.get(h, []byte(key))
	if e == nil {
		return st, false, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.expires.Load() <= s.now() {
		return st, false, nil
	}
	return e.state.Clone(), true, nil
}
