package memstore_test

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
)

// takeNew takes one token from n never-seen buckets whose keys are pad
// plus a number, that stay live for an hour.
func takeNew(t testing.TB, s *memstore.Store, n int, pad string) {
	t.Helper()
	lim := []fleetrate.Limit{fleetrate.Every(time.Hour, 10)}
	ctx := context.Background()
	for i := range n {
		req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Prefix: pad, Key: strconv.Itoa(i), Limits: lim}}, N: 1}
		if _, err := s.Take(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBoundedInBytes floods a store with long keys, few enough that
// MaxKeys never binds: MaxBytes does, within one bucket per shard.
func TestBoundedInBytes(t *testing.T) {
	t.Parallel()
	const (
		maxBytes = 4 << 20
		shards   = 16
		keyLen   = 4096
	)
	s := memstore.New(memstore.Options{MaxBytes: maxBytes, Shards: shards})
	takeNew(t, s, 20_000, strings.Repeat("k", keyLen)) // 80 MB of keys offered
	bucket := int64(memstore.BucketOverhead + keyLen + 5)
	if got, limit := s.Bytes(), int64(maxBytes)+shards*bucket; got > limit {
		t.Fatalf("%d bytes counted after 20,000 keys of 4 KB, want at most MaxBytes plus a bucket a shard, %d", got, limit)
	}
	if got, least := s.Bytes(), int64(maxBytes)-shards*bucket; got < least {
		t.Errorf("%d bytes counted, want the store nearly full (%d): eviction freed too much", got, least)
	}
	if n := s.Len(); int64(n) > int64(maxBytes)/bucket+shards {
		t.Errorf("%d buckets held, more than fit in %d bytes", n, maxBytes)
	}
}

// TestBytesFollowBuckets: the count goes up with new buckets and back to
// zero when they are reset or refill and are swept.
func TestBytesFollowBuckets(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	s := memstore.New(memstore.Options{Clock: func() time.Time { return now }, Shards: 4})
	ctx := context.Background()
	lim := []fleetrate.Limit{fleetrate.PerSecond(10, 10)}
	three := []fleetrate.Limit{fleetrate.PerSecond(10, 10), fleetrate.PerSecond(5, 5), fleetrate.PerSecond(1, 2)}
	take := func(key string, lim []fleetrate.Limit) {
		t.Helper()
		if _, err := s.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: key, Limits: lim}}, N: 1}); err != nil {
			t.Fatal(err)
		}
	}
	take("abc", lim)
	if got, want := s.Bytes(), int64(memstore.BucketOverhead+3); got != want {
		t.Fatalf("one bucket of a 3-byte key: %d bytes, want %d", got, want)
	}
	take("defg", three)
	if got, want := s.Bytes(), int64(2*memstore.BucketOverhead+3+4+3*16+2*32); got != want {
		t.Fatalf("and one of a 4-byte key and three limits: %d bytes, want %d", got, want)
	}
	if err := s.Reset(ctx, "abc", "defg"); err != nil {
		t.Fatal(err)
	}
	if got := s.Bytes(); got != 0 {
		t.Fatalf("after resetting both: %d bytes, want 0", got)
	}
	take("abc", lim)
	now = now.Add(time.Second) // full again: the next take of it deletes it
	take("abc", []fleetrate.Limit{fleetrate.PerSecond(10, 10)})
	if got := s.Bytes(); got != int64(memstore.BucketOverhead+3) {
		t.Fatalf("after a refill and a take: %d bytes", got)
	}
}

// TestBucketOverheadIsHeapPerBucket measures the heap a bucket takes
// besides its key, with the key cap and the shards' snapshots in use, and
// checks that BucketOverhead counts it within a quarter: MaxBytes is
// then a bound on memory, not a guess.
func TestBucketOverheadIsHeapPerBucket(t *testing.T) {
	// Not parallel: it reads the process's heap.
	const n = 200_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := memstore.New(memstore.Options{Shards: 16, MaxBytes: -1})
	pad := "p:" // keys "p:0" to "p:199999": 3 to 8 bytes, one 8- or 16-byte allocation each
	takeNew(t, s, n, pad)
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := float64(after.HeapAlloc-before.HeapAlloc) / n
	var keys int64
	for i := range n {
		keys += int64(len(pad) + len(strconv.Itoa(i)))
	}
	counted := float64(s.Bytes()) / n
	t.Logf("heap per bucket %.0f bytes, counted %.0f (BucketOverhead %d, keys %.1f bytes on average)", heap, counted, memstore.BucketOverhead, float64(keys)/n)
	if counted < 0.75*heap || counted > 1.25*heap {
		t.Errorf("MaxBytes counts %.0f bytes a bucket, the heap holds %.0f: adjust BucketOverhead", counted, heap)
	}
	runtime.KeepAlive(s)
}
