package memstore

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/fleetrate/fleetrate/gcra"
)

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
	if live && !e.state.Permits.Empty() && e.expires.Load() > now {
		// Dropping it would free permits still held: more holders than
		// the bound. A bucket holding permits is never evicted.
		ok = false
	}
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
