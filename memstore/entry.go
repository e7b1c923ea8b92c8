package memstore

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetrate/fleetrate/gcra"
	"github.com/fleetrate/fleetrate/inflight"
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
	// to fit beside dead: the entry stays within its 256-byte allocation).
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
	if m > 1 { // the leads of the limits beyond the first
		n += 32 * int64(m-1)
	}
	return n
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
		e.state.Permits = inflight.Set{}    // every lease has ended
		e.state.Quotas = e.state.Quotas[:0] // every window has ended
		return now
	}
	return max(now, e.state.Stamp)
}
