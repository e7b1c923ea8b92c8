package memstore

import "math/bits"

// table maps bucket keys to entries by the 64-bit hash the store already
// computed to pick the shard, so that a lookup hashes the key once, not
// twice. Entries whose keys share a hash (with a random seed, about never)
// are chained; every lookup compares the full key.
type table struct {
	m     map[uint64]*entry
	n     int   // entries, chained ones included
	bytes int64 // the entries' sizes (entry.size)
}

func newTable() table { return table{m: map[uint64]*entry{}} }

// get returns the entry for key, whose hash is h, or nil.
func (t *table) get(h uint64, key []byte) *entry {
	for e := t.m[h]; e != nil; e = e.next {
		if e.key == string(key) {
			return e
		}
	}
	return nil
}

// put adds e, whose key is absent and hashes to h.
func (t *table) put(h uint64, e *entry) {
	e.hash, e.next = h, t.m[h]
	t.m[h] = e
	t.n++
	t.bytes += int64(e.size)
}

// del removes e, which the table holds, for good: it marks e dead, so that
// a take that found e without the shard's lock (through a snapshot or a
// bound taker) decides nothing on it. The caller holds e.mu.
func (t *table) del(e *entry) {
	e.dead.Store(true)
	head := t.m[e.hash]
	switch {
	case head == e && e.next == nil:
		delete(t.m, e.hash)
	case head == e:
		t.m[e.hash] = e.next
	default:
		for p := head; p != nil; p = p.next {
			if p.next == e {
				p.next = e.next
				break
			}
		}
	}
	e.next = nil
	t.n--
	t.bytes -= int64(e.size)
}

// sample calls f with up to limit entries, starting at a random place
// (Go's map iteration order), until f returns false. f may delete the
// entry it is given.
func (t *table) sample(limit int, f func(e *entry) bool) {
	seen := 0
	for _, head := range t.m {
		for e := head; e != nil; {
			next := e.next
			if !f(e) {
				return
			}
			if seen++; seen >= limit {
				return
			}
			e = next
		}
	}
}

// snapshot is a read-only copy of a table's entries that are alone on
// their hash, read without the shard's lock. It is an open-addressed array
// at most three quarters full, indexed by the top bits of the hash (the
// low bits pick the shard, so they are the same for every key of one
// table); each slot holds its entry's hash, so that probing past other
// entries reads no cache line of theirs.
type snapshot struct {
	shift uint
	slots []slot
}

type slot struct {
	hash uint64
	e    *entry
}

// snapshot returns a snapshot of t. The caller holds t's shard lock.
func (t *table) snapshot() *snapshot {
	size := 8
	for size*3 < 4*len(t.m) {
		size *= 2
	}
	s := &snapshot{shift: uint(64 - bits.TrailingZeros(uint(size))), slots: make([]slot, size)}
	mask := uint64(size - 1)
	for h, e := range t.m {
		if e.next != nil {
			continue // keys that share a hash take the locked path
		}
		i := h >> s.shift
		for s.slots[i].e != nil {
			i = (i + 1) & mask
		}
		s.slots[i] = slot{h, e}
	}
	return s
}

// get returns the entry for key, whose hash is h, or nil. The entry may
// have left the table since; its dead flag says so.
func (s *snapshot) get(h uint64, key []byte) *entry {
	mask := uint64(len(s.slots) - 1)
	for i := h >> s.shift; ; i = (i + 1) & mask {
		// An entry's key never changes, so it is read without its lock.
		if sl := &s.slots[i]; sl.e == nil || sl.hash == h && sl.e.key == string(key) {
			return sl.e
		}
	}
}

// pick fills dst with entries of the snapshot, from the slot where a
// lookup of hash h starts on, looking at no more than 4×len(dst) slots,
// and returns how many it found. It reads the slots alone, contiguous
// memory, not the entries: some may have left their table since.
func (s *snapshot) pick(h uint64, dst []*entry) int {
	mask := uint64(len(s.slots) - 1)
	i, n := h>>s.shift, 0
	for range min(4*len(dst), len(s.slots)) {
		if e := s.slots[i].e; e != nil {
			dst[n] = e
			if n++; n == len(dst) {
				break
			}
		}
		i = (i + 1) & mask
	}
	return n
}
