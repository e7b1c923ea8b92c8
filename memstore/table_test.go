package memstore

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/fleetrate/fleetrate/gcra"
)

// TestTableMatchesMap drives a shard table with random puts and deletes,
// most keys sharing a hash with others (as colliding keys would), and
// checks every lookup, the count, and samples that delete what they see,
// against a plain map.
func TestTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	tb := newTable()
	want := map[string]*entry{}
	hashOf := func(k string) uint64 { return uint64(len(k) % 7) } // 7 hashes for 300 keys
	keys := make([]string, 300)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
	}
	for step := range 20000 {
		k := keys[rng.IntN(len(keys))]
		h := hashOf(k)
		got := tb.get(h, []byte(k))
		if got != want[k] {
			t.Fatalf("step %d: get(%q) = %p, want %p", step, k, got, want[k])
		}
		switch {
		case got == nil:
			e := newEntry([]byte(k), gcra.State{Stamp: 1, Debts: []int64{5}}, 2)
			tb.put(h, e)
			want[k] = e
		case rng.IntN(2) == 0:
			tb.del(got)
			delete(want, k)
		}
		if tb.n != len(want) {
			t.Fatalf("step %d: n = %d, want %d", step, tb.n, len(want))
		}
		if step%1000 == 0 {
			tb.sample(50, func(e *entry) bool {
				tb.del(e)
				delete(want, e.key)
				return true
			})
			for k, e := range want {
				if tb.get(hashOf(k), []byte(k)) != e {
					t.Fatalf("step %d: %q lost after a sample", step, k)
				}
			}
		}
	}
}

// TestSnapshotMatchesTable checks a snapshot against the table it copies:
// every key alone on its hash is found, keys that share a hash and absent
// keys are not. The hashes share their low bits, as the keys of one shard
// do, and many share all their bits.
func TestSnapshotMatchesTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 1, 6, 7, 100, 1000} {
		tb := newTable()
		hashOf := map[string]uint64{}
		for i := range n {
			k := fmt.Sprintf("key-%d", i)
			h := rng.Uint64()<<8 | 0x2a
			if i%5 == 4 { // shares the hash of the key before it
				h = hashOf[fmt.Sprintf("key-%d", i-1)]
			}
			hashOf[k] = h
			tb.put(h, newEntry([]byte(k), gcra.State{Stamp: 1, Debts: []int64{5}}, 2))
		}
		s := tb.snapshot()
		if 4*len(tb.m) > 3*len(s.slots) {
			t.Fatalf("n=%d: %d slots for %d hashes: more than three quarters full", n, len(s.slots), len(tb.m))
		}
		for k, h := range hashOf {
			want := tb.get(h, []byte(k))
			if want.next != nil || tb.m[h] != want {
				want = nil // chained: the snapshot leaves it out
			}
			if got := s.get(h, []byte(k)); got != want {
				t.Fatalf("n=%d: snapshot get(%q) = %p, want %p", n, k, got, want)
			}
			if got := s.get(h, []byte(k+"-absent")); got != nil {
				t.Fatalf("n=%d: snapshot found absent key %q", n, k+"-absent")
			}
		}
	}
}
