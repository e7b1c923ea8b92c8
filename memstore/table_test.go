package memstore

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/fleetrate/fleetrate"
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
			e := newEntry([]byte(k), fleetrate.BucketState{Stamp: 1, Debts: []int64{5}}, 2)
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
