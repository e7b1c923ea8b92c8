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
	"sync"
	"time"

	"github.com/fleetrate/fleetrate"
)

// Options configure a Store. The zero value of each field means its
// default.
type Options struct {
	// Clock is the store's time source. The default is time.Now.
	Clock func() time.Time
	// Shards is the number of independently locked shards, rounded up to a
	// power of two. The default is 16 × GOMAXPROCS.
	Shards int
	// MaxKeys bounds the number of buckets held. When a shard is full, the
	// bucket closest to refilling among a small sample is dropped, which
	// refills it early: size MaxKeys above your live key count. The default
	// is 1,000,000; a negative value means no bound.
	MaxKeys int
}

// DefaultMaxKeys is the default bound on the number of buckets.
const DefaultMaxKeys = 1_000_000

// sweepEvery is how many writes to a shard pass between incremental sweeps
// of expired buckets; sweepBatch is how many entries a sweep looks at.
const (
	sweepEvery  = 256
	sweepBatch  = 128
	sweepRounds = 8
	evictScan   = 8
)

type entry struct {
	state   fleetrate.BucketState
	expires int64 // µs; the bucket is full from then on
	// inline holds the debts of buckets with up to two limits, so that a
	// decision touches one allocation, not two.
	inline [2]int64
}

func newEntry(st fleetrate.BucketState, exp int64) *entry {
	e := &entry{expires: exp}
	e.state.Stamp = st.Stamp
	if len(st.Debts) <= len(e.inline) {
		e.state.Debts = e.inline[:copy(e.inline[:], st.Debts)]
	} else {
		e.state.Debts = st.Debts
	}
	return e
}

type shard struct {
	mu     sync.Mutex
	m      map[string]*entry
	writes int
	_      [40]byte // keep shards on separate cache lines
}

// Store is an in-memory fleetrate.Store. It is safe for concurrent use.
type Store struct {
	clock    func() time.Time
	seed     maphash.Seed
	shards   []shard
	mask     uint64
	shardCap int
}

var (
	_ fleetrate.Store       = (*Store)(nil)
	_ fleetrate.SingleTaker = (*Store)(nil)
)

// New returns a ready Store.
func New(opts Options) *Store {
	n := opts.Shards
	if n <= 0 {
		n = 16 * runtime.GOMAXPROCS(0)
	}
	n = 1 << bits.Len(uint(n-1))
	s := &Store{
		clock:  opts.Clock,
		seed:   maphash.MakeSeed(),
		shards: make([]shard, n),
		mask:   uint64(n - 1),
	}
	if s.clock == nil {
		s.clock = time.Now
	}
	switch {
	case opts.MaxKeys == 0:
		s.shardCap = max(DefaultMaxKeys/n, 1)
	case opts.MaxKeys > 0:
		s.shardCap = max(opts.MaxKeys/n, 1)
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
	}
	return s
}

func (s *Store) shardOf(key []byte) int {
	return int(maphash.Bytes(s.seed, key) & s.mask)
}

// fullKeys returns each bucket's full key (Prefix + Key).
func fullKeys(bs []fleetrate.Bucket) [][]byte {
	keys := make([][]byte, len(bs))
	for i, b := range bs {
		keys[i] = []byte(b.StoreKey())
	}
	return keys
}

// lock locks the shards holding keys in index order, so that takes across
// several buckets are atomic and deadlock-free, and returns the unlock.
// lock locks the shards holding keys in index order, so that takes across
// several buckets are atomic and deadlock-free. It returns the shards to
// unlock, written into idx.
func (s *Store) lock(keys [][]byte, idx []int) []int {
	for _, k := range keys {
		n := s.shardOf(k)
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

// load returns key's entry (nil when absent) and its live state, or a
// full state when it is absent or expired (reusing an expired entry's
// memory). The state shares its debts with the entry, so the caller must
// save it back. The caller holds the shard's lock.
func (s *Store) load(sh *shard, key []byte, now int64) (*entry, fleetrate.BucketState) {
	e := sh.m[string(key)]
	switch {
	case e == nil:
		return nil, fleetrate.BucketState{}
	case e.expires <= now:
		clear(e.state.Debts)
		return e, fleetrate.BucketState{Stamp: now, Debts: e.state.Debts}
	}
	return e, e.state
}

// save writes st into e, the entry load returned for key, creating it when
// absent, or deletes it when the bucket is full again. The caller holds
// the shard's lock.
func (s *Store) save(sh *shard, key []byte, e *entry, st fleetrate.BucketState) {
	ttl := st.TTL()
	if ttl <= 0 {
		if e != nil {
			delete(sh.m, string(key))
		}
		return
	}
	exp := st.Stamp + int64(ttl/time.Microsecond) + 1
	if e != nil {
		if len(st.Debts) <= len(e.inline) && (len(e.state.Debts) == 0 || &st.Debts[0] != &e.inline[0]) {
			// The limits changed and Elapse made new debts: move them in.
			st.Debts = e.inline[:copy(e.inline[:], st.Debts)]
		}
		e.state, e.expires = st, exp
	} else {
		if s.shardCap > 0 && len(sh.m) >= s.shardCap {
			s.evict(sh, st.Stamp)
		}
		sh.m[string(key)] = newEntry(st, exp)
	}
	if sh.writes++; sh.writes%sweepEvery == 0 {
		s.sweep(sh, st.Stamp)
	}
}

// sweep drops expired buckets from a shard, as Redis expires keys: it
// samples sweepBatch entries (Go's map iteration starts at a random place)
// and samples again while more than a quarter of a sample had expired, up
// to sweepRounds samples.
func (s *Store) sweep(sh *shard, now int64) {
	for range sweepRounds {
		seen, dropped := 0, 0
		for k, e := range sh.m {
			if e.expires <= now {
				delete(sh.m, k)
				dropped++
			}
			if seen++; seen >= sweepBatch {
				break
			}
		}
		if dropped*4 <= seen {
			return
		}
	}
}

// evict makes room in a full shard: it drops every expired bucket in a
// small sample, or else the sampled bucket that refills soonest.
func (s *Store) evict(sh *shard, now int64) {
	var victim string
	soonest, seen, freed := int64(1<<63-1), 0, false
	for k, e := range sh.m {
		if e.expires <= now {
			delete(sh.m, k)
			freed = true
		} else if e.expires < soonest {
			soonest, victim = e.expires, k
		}
		if seen++; seen >= evictScan {
			break
		}
	}
	if !freed && victim != "" {
		delete(sh.m, victim)
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
	if len(req.Buckets) == 1 {
		return s.takeOne(req), nil
	}
	var (
		stateBuf [4]fleetrate.BucketState
		idxBuf   [4]int
	)
	keys := fullKeys(req.Buckets)
	idx := s.lock(keys, idxBuf[:0])
	defer s.unlock(idx)
	now := s.clock().UnixMicro()
	state := stateBuf[:0]
	for _, k := range keys {
		_, st := s.load(&s.shards[s.shardOf(k)], k, now)
		state = append(state, st)
	}
	// Decide refills the loaded debts in place, so the state is saved back
	// even when the decision changed nothing. A bucket's entry is looked up
	// again in case an earlier save in this loop evicted it.
	res, _ := fleetrate.Decide(now, req, state)
	for i, k := range keys {
		sh := &s.shards[s.shardOf(k)]
		s.save(sh, k, sh.m[string(k)], state[i])
	}
	return res, nil
}

// TakeOne implements fleetrate.SingleTaker: Take for one bucket.
func (s *Store) TakeOne(ctx context.Context, b fleetrate.Bucket, n int64, maxWait time.Duration) (fleetrate.Result, error) {
	if err := ctx.Err(); err != nil {
		return fleetrate.Result{}, err
	}
	bs := [1]fleetrate.Bucket{b}
	req := fleetrate.Request{Buckets: bs[:], N: n, MaxWait: maxWait}
	if err := req.Validate(); err != nil {
		return fleetrate.Result{}, err
	}
	return s.takeOne(req), nil
}

// takeOne is Take for one bucket, the common case, without allocating:
// the key is built on the stack and the map is read with it in place.
func (s *Store) takeOne(req fleetrate.Request) fleetrate.Result {
	b := req.Buckets[0]
	var buf [128]byte
	key := append(append(buf[:0], b.Prefix...), b.Key...)
	sh := &s.shards[s.shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.clock().UnixMicro()
	e, st := s.load(sh, key, now)
	state := [1]fleetrate.BucketState{st}
	res, _ := fleetrate.Decide(now, req, state[:])
	s.save(sh, key, e, state[0])
	return res
}

// Refund implements fleetrate.Store.
func (s *Store) Refund(ctx context.Context, buckets []fleetrate.Bucket, n int64) error {
	if n < 0 {
		return fmt.Errorf("%w: refund n must be >= 0, got %d", fleetrate.ErrInvalid, n)
	}
	return s.update(ctx, buckets, func(now int64, b fleetrate.Bucket, st *fleetrate.BucketState) {
		fleetrate.Refund(now, b.Limits, st, n)
	})
}

// Drain implements fleetrate.Store.
func (s *Store) Drain(ctx context.Context, buckets []fleetrate.Bucket, d time.Duration) error {
	if d < 0 || d > fleetrate.MaxWaitCap {
		return fmt.Errorf("%w: drain duration must be between 0 and %v, got %v", fleetrate.ErrInvalid, fleetrate.MaxWaitCap, d)
	}
	return s.update(ctx, buckets, func(now int64, b fleetrate.Bucket, st *fleetrate.BucketState) {
		fleetrate.Drain(now, b.Limits, st, d)
	})
}

func (s *Store) update(ctx context.Context, buckets []fleetrate.Bucket, apply func(int64, fleetrate.Bucket, *fleetrate.BucketState)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := fleetrate.ValidateBuckets(buckets); err != nil {
		return err
	}
	var idxBuf [4]int
	keys := fullKeys(buckets)
	idx := s.lock(keys, idxBuf[:0])
	defer s.unlock(idx)
	now := s.clock().UnixMicro()
	for i, b := range buckets {
		sh := &s.shards[s.shardOf(keys[i])]
		e, st := s.load(sh, keys[i], now)
		apply(now, b, &st)
		s.save(sh, keys[i], e, st)
	}
	return nil
}

// Reset implements fleetrate.Store.
func (s *Store) Reset(ctx context.Context, keys ...string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, k := range keys {
		sh := &s.shards[s.shardOf([]byte(k))]
		sh.mu.Lock()
		delete(sh.m, k)
		sh.mu.Unlock()
	}
	return nil
}

// Len returns the number of buckets held, expired ones included until they
// are swept.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// State returns a copy of the stored state of a bucket, for tests and
// debugging. ok is false when the bucket is absent or expired (full).
func (s *Store) State(_ context.Context, key string) (st fleetrate.BucketState, ok bool, err error) {
	sh := &s.shards[s.shardOf([]byte(key))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, found := sh.m[key]
	if !found || e.expires <= s.clock().UnixMicro() {
		return st, false, nil
	}
	return fleetrate.BucketState{Stamp: e.state.Stamp, Debts: slices.Clone(e.state.Debts)}, true, nil
}
