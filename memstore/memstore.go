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
	"math"
	"math/bits"
	"runtime"
	"slices"
	"sync"
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
// Options.MaxBytes): 256 MiB, above what a million buckets of keys up to
// about 50 bytes need, so that MaxKeys binds first for ordinary keys and
// MaxBytes for long ones.
const DefaultMaxBytes = 256 << 20

// BucketOverhead is what Options.MaxBytes counts for one bucket besides
// its key: its entry (a 144-byte allocation on amd64), its slot in the
// shard's map and in the shard's snapshot, and the snapshot's slack.
// TestBucketOverheadIsHeapPerBucket measures it.
const BucketOverhead = 208

// sweepEvery is how many new buckets a shard takes in between incremental
// sweeps of expired buckets; sweepBatch is how many entries a sweep looks
// at. evictScan is how many buckets an eviction samples (see evict), as
// Redis's maxmemory-samples;
// evictTries bounds the evictions one new bucket makes to get its shard
// within its bounds.
const (
	sweepEvery  = 256
	sweepBatch  = 128
	sweepRounds = 8
	evictScan   = 5
	evictTries  = 8
)

type entry struct {
	// The fields a sample for eviction or a sweep reads come first, within
	// 32 bytes, so that looking at an entry costs one cache line, and
	// eviction reads expires without locking: only the entry it drops is
	// locked.
	next    *entry       // the next entry whose key has the same hash
	expires atomic.Int64 // µs; the bucket is full from then on. Written under mu
	// mu guards state and expires, and dead is set only under it (dead
	// is atomic so that a bound taker may glance at it unlocked). The
	// fast path of a take holds only mu; every other path holds its
	// shard's lock first.
	mu   sync.Mutex
	dead atomic.Bool // removed from its shard's table (set by table.del)
	// size is the bytes counted against Options.MaxBytes (capped at 2 GiB,
	// to fit beside dead: the entry stays a 144-byte allocation).
	size  int32
	key   string
	hash  uint64
	state gcra.State
	// inline holds the debts (and then the fills) of buckets with up to two
	// limits, so that a decision touches one allocation, not three.
	inline [4]int64
}

// keepInline moves e.state's debts and fills into e's inline array when
// they fit and are not there yet.
func (e *entry) keepInline() {
	st := &e.state
	m := len(st.Debts)
	if m == 0 || 2*m > len(e.inline) || len(st.Fills) != m || e.inlined() {
		return
	}
	var tmp [4]int64
	copy(tmp[:m], st.Debts)
	copy(tmp[m:], st.Fills)
	e.inline = tmp
	st.Debts, st.Fills = e.inline[:m:m], e.inline[m:2*m:2*m]
}

// inlined reports whether e's debts and fills are in its inline array.
func (e *entry) inlined() bool {
	m := len(e.state.Debts)
	return m > 0 && 2*m <= len(e.inline) && len(e.state.Fills) == m &&
		&e.state.Debts[0] == &e.inline[0] && &e.state.Fills[0] == &e.inline[m]
}

// is reports whether e is the entry of the bucket prefix+name.
func (e *entry) is(prefix, name string) bool {
	return len(e.key) == len(prefix)+len(name) && e.key[len(prefix):] == name && e.key[:len(prefix)] == prefix
}

func newEntry(key []byte, st gcra.State, exp int64) *entry {
	e := &entry{key: string(key), size: int32(min(bucketBytes(len(key), len(st.Debts)), math.MaxInt32))}
	e.expires.Store(exp)
	e.state = st
	e.keepInline()
	return e
}

// bucketBytes is what Options.MaxBytes counts for a bucket with a key of
// keyLen bytes and m limits.
func bucketBytes(keyLen, m int) int64 {
	n := int64(BucketOverhead + keyLen)
	if m > 2 { // debts and fills out of the entry's inline array
		n += 16 * int64(m)
	}
	return n
}

type shard struct {
	mu      sync.Mutex
	t       table
	inserts int
	// ro is a snapshot of t (entries alone on their hash) that takes read
	// without the shard's lock: a take of a known bucket then writes one
	// cache line, its entry's, not two. misses counts the takes that had
	// to lock the shard since ro was taken; enough of them retake it.
	ro     atomic.Pointer[snapshot]
	misses int
	// Pad shards to 128 bytes: CPUs fetch cache lines in pairs, and a
	// shard written by one core must not slow down its neighbours.
	_ [128 - 56]byte
}

// refresh retakes sh's snapshot once the takes that missed it number a
// quarter of the shard (at least 8), so that the copies cost O(1) per take
// over time. The caller holds sh's lock.
func (sh *shard) refresh() {
	if sh.misses++; sh.misses < max(8, sh.t.n/4) {
		return
	}
	sh.misses = 0
	sh.ro.Store(sh.t.snapshot())
}

// apply writes st, the state of a live entry after a take, back into e,
// keeping its debts inline. The caller holds e.mu.
func (e *entry) apply(st gcra.State) {
	e.state = st
	e.settle()
}

// settle keeps e.state's debts inline after a decision on it in place
// (when the limits changed, Elapse made new debts: it moves them in) and
// records when the bucket is full again. The caller holds e.mu.
func (e *entry) settle() {
	e.keepInline()
	e.expires.Store(expiry(e.state))
}

// expiry is when a bucket in state st is full again, in µs: from then on
// it is as good as absent.
func expiry(st gcra.State) int64 {
	exp := st.Stamp
	if ttl := st.TTL(); ttl > 0 {
		exp += int64(ttl/time.Microsecond) + 1
	}
	// An anchored state is not full before its horizon (see
	// gcra.State.Horizon).
	return max(exp, st.Horizon)
}

// live returns e's state, or a full state when it has expired (reusing
// its memory), and the time to decide at: now, or the state's stamp when
// that is later (a take that read the clock after this one applied
// first), so that the stamp never moves back, which would count the time
// between the two readings twice. Every path of a decision goes through
// it. The caller holds e.mu.
func (e *entry) live(now int64) (gcra.State, int64) {
	at := e.elapse(now)
	return e.state, at
}

// elapse is live for a decision on e.state in place: it empties the debts
// of an expired e (a full bucket converts to full) and returns the time to
// decide at.
func (e *entry) elapse(now int64) int64 {
	if e.expires.Load() <= now {
		clear(e.state.Debts)
		e.state.Stamp, e.state.Anchor, e.state.Horizon = now, 0, 0
		return now
	}
	return max(now, e.state.Stamp)
}

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
}

var (
	_ fleetrate.Store  = (*Store)(nil)
	_ fleetrate.Binder = (*Store)(nil)
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

// load returns key's entry (nil when absent), locked, its live state (a
// full one when it is absent or expired, reusing an expired entry's
// memory) and the time to decide at (see entry.live). The state shares its
// debts with the entry, so the caller must save it back, which unlocks the
// entry. The caller holds the shard's lock.
func (s *Store) load(sh *shard, h uint64, key []byte, now int64) (*entry, gcra.State, int64) {
	e := sh.t.get(h, key)
	if e == nil {
		return nil, gcra.State{}, now
	}
	e.mu.Lock()
	st, at := e.live(now)
	return e, st, at
}

// save writes st into e, the entry load returned (locked) for key (hash
// h), and unlocks it; it creates the entry when absent, and deletes it when
// the bucket is full again. It returns the bucket's entry, or nil when it
// has none. The caller holds the shard's lock.
func (s *Store) save(sh *shard, h uint64, key []byte, e *entry, st gcra.State) *entry {
	exp := expiry(st)
	if exp <= st.Stamp {
		if e != nil {
			sh.t.del(e)
			e.mu.Unlock()
		}
		return nil
	}
	if e != nil {
		e.apply(st)
		e.mu.Unlock()
		return e
	}
	e = newEntry(key, st, exp)
	s.makeRoom(sh, h, st.Stamp, int64(e.size))
	sh.t.put(h, e)
	// Only new buckets grow a shard, so only they pay for sweeps: a shard
	// of busy buckets is never scanned.
	if sh.inserts++; sh.inserts%sweepEvery == 0 {
		s.sweep(sh, st.Stamp)
	}
	return e
}

// makeRoom evicts buckets from sh until it can take a new one, whose key
// hashes to h, of size bytes within MaxKeys and MaxBytes, or until
// evictTries evictions freed nothing more. At the key cap it evicts two
// buckets from one sample, so that every other new bucket finds room
// without sampling: eviction's cost is mostly the sample's cache misses.
// The caller holds sh's lock.
func (s *Store) makeRoom(sh *shard, h uint64, now, size int64) {
	for range evictTries {
		overKeys := s.shardCap > 0 && sh.t.n >= s.shardCap
		overBytes := s.maxBytes > 0 && sh.t.bytes+size > s.maxBytes
		if !overKeys && !overBytes || sh.t.n == 0 {
			return
		}
		n := 1
		if overKeys && !overBytes && sh.t.n > 2 {
			n = 2
		}
		if !s.evict(sh, h, now, n) {
			return
		}
	}
}

// sweep drops expired buckets from a shard, as Redis expires keys: it
// samples sweepBatch entries (Go's map iteration starts at a random place)
// and samples again while more than a quarter of a sample had expired, up
// to sweepRounds samples. It reads expiries without locking and locks
// only the entries it drops.
func (s *Store) sweep(sh *shard, now int64) {
	for range sweepRounds {
		seen, dropped := 0, 0
		sh.t.sample(sweepBatch, func(e *entry) bool {
			if e.expires.Load() <= now && drop(sh, e, now, false) {
				dropped++
			}
			seen++
			return true
		})
		if dropped*4 <= seen {
			return
		}
	}
}

// drop removes e from sh when it has expired by now, or in any case when
// live is set, and reports whether it did. An entry in use (locked by a
// take of several buckets) is left alone. The caller holds sh's lock.
func drop(sh *shard, e *entry, now int64, live bool) bool {
	if !e.mu.TryLock() {
		return false
	}
	ok := live || e.expires.Load() <= now // a take may have extended it
	if ok {
		sh.t.del(e)
	}
	e.mu.Unlock()
	return ok
}

// evict makes room in a full shard: it drops the n (1 or 2) sampled
// buckets that refill soonest (expired ones, if any), among evictScan. It
// reports whether it dropped any.
//
// Eviction is what a flood of new keys pays on every take, so it touches
// as little memory as it can. The sample is the entries of evictScan
// slots of the shard's snapshot from where the new bucket's key, hashed
// to h, was just looked up in it: memory in cache, at a random place (the
// hash is seeded). Buckets made since the snapshot was taken are not
// candidates; they are the youngest. Without a snapshot big enough, it
// samples the map. The candidates' expiries are read without locking, in
// a loop of independent loads whose cache misses overlap, and only the
// victims are locked.
func (s *Store) evict(sh *shard, h uint64, now int64, n int) bool {
	var cands [evictScan]*entry
	if ro := sh.ro.Load(); ro != nil {
		if got := ro.pick(h, cands[:]); got == evictScan && dropSoonest(sh, cands[:got], now, n) {
			return true
		}
	}
	// No snapshot, a small one, or one whose sample had left the table.
	got := 0
	sh.t.sample(evictScan, func(e *entry) bool { cands[got] = e; got++; return true })
	return dropSoonest(sh, cands[:got], now, n)
}

// dropSoonest drops, of cands, the n entries still in sh's table that
// expire first, and reports whether it dropped any. The caller holds sh's
// lock.
func dropSoonest(sh *shard, cands []*entry, now int64, n int) bool {
	var exps [evictScan]int64
	for i, e := range cands {
		exps[i] = e.expires.Load()
		if e.dead.Load() { // gone from the table since the snapshot
			exps[i] = math.MaxInt64
		}
	}
	dropped := false
	for range n {
		victim := -1
		for i, exp := range exps[:len(cands)] {
			if exp < math.MaxInt64 && (victim < 0 || exp < exps[victim]) {
				victim = i
			}
		}
		if victim < 0 {
			break
		}
		exps[victim] = math.MaxInt64
		dropped = drop(sh, cands[victim], now, true) || dropped
	}
	return dropped
}

// Take implements fleetrate.Store.
func (s *Store) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if err := ctx.Err(); err != nil {
		return fleetrate.Result{}, err
	}
	if err := req.Validate(); err != nil {
		return fleetrate.Result{}, err
	}
	if len(req.Buckets) == 1 && req.Booking == nil && req.Buckets[0].Reserve == 0 {
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
	off := 0
	return s.update(ctx, buckets, func(now int64, bk fleetrate.Bucket, st *gcra.State) {
		m := len(bk.Limits)
		gcra.Cancel(now, bk.Limits, st, n, b.Stamp, b.Debts[off:off+m], wait)
		off += m
	})
}

// Drain implements fleetrate.Store.
func (s *Store) Drain(ctx context.Context, buckets []fleetrate.Bucket, d time.Duration) error {
	if d < 0 || d > fleetrate.MaxWaitCap {
		return fmt.Errorf("%w: drain duration must be between 0 and %v, got %v", fleetrate.ErrInvalid, fleetrate.MaxWaitCap, d)
	}
	return s.update(ctx, buckets, func(now int64, b fleetrate.Bucket, st *gcra.State) {
		gcra.Drain(now, b.Limits, st, d)
	})
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
