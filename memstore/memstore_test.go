package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(*testing.T) fleetrate.Store { return memstore.New(memstore.Options{}) })
}

func TestBoundedUnderAMillionKeys(t *testing.T) {
	t.Parallel()
	const maxKeys = 100_000
	s := memstore.New(memstore.Options{MaxKeys: maxKeys, Shards: 16})
	lim := []fleetrate.Limit{fleetrate.Every(time.Hour, 10)} // every bucket stays live
	ctx := context.Background()
	var buf []byte
	for i := range 1_000_000 {
		buf = strconv.AppendInt(buf[:0], int64(i), 10)
		req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Prefix: "p:", Key: string(buf), Limits: lim}}, N: 1}
		if _, err := s.Take(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Len(); n > maxKeys {
		t.Fatalf("%d buckets held after 1,000,000 distinct keys, want at most %d", n, maxKeys)
	}
}

func TestExpiredBucketsAreSwept(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	s := memstore.New(memstore.Options{Clock: func() time.Time { return now }, Shards: 1})
	lim := []fleetrate.Limit{fleetrate.PerSecond(1000, 10)}
	ctx := context.Background()
	for i := range 10_000 {
		req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: strconv.Itoa(i), Limits: lim}}, N: 1}
		if _, err := s.Take(ctx, req); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Millisecond) // each bucket refills 1 ms after its take
	}
	// Only the buckets not yet swept remain; a sweep every 256 writes keeps
	// expired ones from piling up.
	if n := s.Len(); n > 2_000 {
		t.Fatalf("%d buckets held, want expired ones swept", n)
	}
}

func TestKeysArePrefixPlusKey(t *testing.T) {
	t.Parallel()
	s := memstore.New(memstore.Options{})
	lim := []fleetrate.Limit{fleetrate.Every(time.Hour, 1)}
	ctx := context.Background()
	a := fleetrate.Request{Buckets: []fleetrate.Bucket{{Prefix: "fleet:", Key: "x", Limits: lim}}, N: 1}
	b := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "fleet:x", Limits: lim}}, N: 1}
	if res, _ := s.Take(ctx, a); !res.Allowed {
		t.Fatal(res)
	}
	if res, _ := s.Take(ctx, b); res.Allowed {
		t.Fatal("Prefix+Key and the same full Key are different buckets")
	}
	if err := s.Reset(ctx, "fleet:x"); err != nil {
		t.Fatal(err)
	}
	if res, _ := s.Take(ctx, a); !res.Allowed {
		t.Fatal("Reset by full key did not reset the prefixed bucket")
	}
}

// TestBoundTakerMatchesTake drives a bound taker (and now and then Take)
// on one store and Take on another, with one clock, and checks that every
// decision is the same, while keys are reset now and then (the bound
// taker's hot entry among them: it must then take from the bucket's new
// entry, the one Take sees, not the removed one).
func TestBoundTakerMatchesTake(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	viaBind := memstore.New(memstore.Options{Clock: clock, Shards: 4})
	viaTake := memstore.New(memstore.Options{Clock: clock, Shards: 4})
	ctx := context.Background()
	for _, limits := range [][]fleetrate.Limit{
		{fleetrate.PerSecond(1000, 5).Named("second")},
		{fleetrate.PerSecond(700, 3), fleetrate.PerSecond(3, 7)},
		{fleetrate.PerSecond(100, 2), fleetrate.PerSecond(50, 4), fleetrate.Every(time.Minute, 6)},
	} {
		bt, err := viaBind.Bind("p:", limits)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2000 {
			key := strconv.Itoa(i % 7)
			if i%97 == 0 {
				reset := "p:" + strconv.Itoa(i/97%2) // "0" is the hot entry
				if err := viaBind.Reset(ctx, reset); err != nil {
					t.Fatal(err)
				}
				if err := viaTake.Reset(ctx, reset); err != nil {
					t.Fatal(err)
				}
			}
			n := int64(i % 3)
			maxWait := time.Duration(i%4) * time.Millisecond
			req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Prefix: "p:", Key: key, Limits: limits}}, N: n, MaxWait: maxWait}
			var got fleetrate.Result
			var err error
			if i%5 == 0 {
				got, err = viaBind.Take(ctx, req)
			} else {
				got, err = bt.TakeKey(ctx, key, n, maxWait)
			}
			if err != nil {
				t.Fatal(err)
			}
			want, err := viaTake.Take(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%v take %d: bound taker decided\n%+v\nTake decided\n%+v", limits, i, got, want)
			}
			now = now.Add(time.Duration(i%5) * 300 * time.Microsecond)
		}
	}
}

// TestBoundTakerFollowsItsBucket: a bound taker remembers the entry of a
// bucket it took from; once a Reset removes that entry, its takes go to
// the bucket's new one, which Take sees too.
func TestBoundTakerFollowsItsBucket(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	s := memstore.New(memstore.Options{Clock: func() time.Time { return now }})
	ctx := context.Background()
	lim := []fleetrate.Limit{fleetrate.Every(time.Hour, 3)}
	bt, err := s.Bind("p:", lim)
	if err != nil {
		t.Fatal(err)
	}
	take := func(n int64) fleetrate.Result {
		t.Helper()
		res, err := bt.TakeKey(ctx, "a", n, 0)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := take(1); res.Remaining != 2 {
		t.Fatalf("first take: %+v", res)
	}
	if err := s.Reset(ctx, "p:a"); err != nil {
		t.Fatal(err)
	}
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Prefix: "p:", Key: "a", Limits: lim}}, N: 2}
	if res, err := s.Take(ctx, req); err != nil || res.Remaining != 1 {
		t.Fatalf("Take of 2 after the reset: %+v %v", res, err)
	}
	if res := take(1); !res.Allowed || res.Remaining != 0 {
		t.Fatalf("bound take after the reset and a Take of 2: %+v, want the last token", res)
	}
	if res := take(1); res.Allowed {
		t.Fatalf("bound take of an empty bucket: %+v", res)
	}
}

func TestBoundTakerChecksArguments(t *testing.T) {
	t.Parallel()
	s := memstore.New(memstore.Options{})
	ctx := context.Background()
	if _, err := s.Bind("p:", nil); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("Bind without limits: %v", err)
	}
	if _, err := s.Bind("p:", []fleetrate.Limit{fleetrate.PerSecond(0, 1)}); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("Bind with rate 0: %v", err)
	}
	bt, err := s.Bind("p:", []fleetrate.Limit{fleetrate.PerSecond(10, 5), fleetrate.PerSecond(1, 3)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key     string
		n       int64
		maxWait time.Duration
		want    error
	}{
		{"", 1, 0, fleetrate.ErrInvalid},
		{"k", -1, 0, fleetrate.ErrInvalid},
		{"k", 1, -time.Second, fleetrate.ErrInvalid},
		{"k", 1, fleetrate.MaxWaitCap + 1, fleetrate.ErrInvalid},
		{"k", 4, 0, fleetrate.ErrBurstExceeded}, // beyond the smaller burst
	} {
		if res, err := bt.TakeKey(ctx, c.key, c.n, c.maxWait); !errors.Is(err, c.want) || res.Allowed {
			t.Errorf("TakeKey(%q, %d, %v) = %+v, %v; want %v", c.key, c.n, c.maxWait, res, err, c.want)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if res, err := bt.TakeKey(cancelled, "k", 1, 0); err == nil || res.Allowed {
		t.Errorf("cancelled context: %+v, %v", res, err)
	}
	if res, err := bt.TakeKey(ctx, "k", 3, 0); err != nil || !res.Allowed {
		t.Errorf("take of the smaller burst: %+v, %v", res, err)
	}
}

// TestTakeNeverMovesTheStampBack: a take whose clock reading is older than
// the bucket's stamp (two takes applied in the other order than they read
// the clock) is decided at the stamp, so that no interval is refilled
// twice.
func TestTakeNeverMovesTheStampBack(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := memstore.New(memstore.Options{Clock: func() time.Time { return now }})
	l, err := fleetrate.New(s, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1000, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if res, err := l.Allow(ctx, "k"); err != nil || !res.Allowed {
		t.Fatalf("first take: %+v, %v", res, err)
	}
	stamp := now
	now = now.Add(-500 * time.Microsecond) // an older reading applied later
	res, err := l.Allow(ctx, "k")
	if err != nil || res.Allowed || !res.At.Equal(stamp) {
		t.Fatalf("take with an older reading: %+v, %v; want denied at the stamp %v", res, err, stamp)
	}
	// Half an interval after the stamp the token is still not back; a full
	// interval after it, it is.
	now = stamp.Add(500 * time.Microsecond)
	if res, _ := l.Allow(ctx, "k"); res.Allowed {
		t.Fatalf("granted half an interval after the first take: %+v", res)
	}
	now = stamp.Add(time.Millisecond)
	if res, _ := l.Allow(ctx, "k"); !res.Allowed {
		t.Fatalf("denied a full interval after the first take: %+v", res)
	}
}

// TestConcurrentTakesAreExact races many goroutines on a few buckets,
// through the lock-free path of known buckets and the locked path of new
// ones, takes of several buckets, refunds of zero, peeks, and resets of
// other keys (whose inserts run sweeps): every bucket grants exactly its
// burst.
func TestConcurrentTakesAreExact(t *testing.T) {
	s := memstore.New(memstore.Options{Shards: 4})
	ctx := context.Background()
	const burst = 50
	lim := fleetrate.Every(time.Hour, burst)
	l, err := fleetrate.New(s, fleetrate.Config{Limits: []fleetrate.Limit{lim}})
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "b", "c", "d"}
	var granted [4]atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 400 {
				k := (g + i) % len(keys)
				switch i % 7 {
				case 3: // a take of two buckets counts for both
					j := (k + 1) % len(keys)
					if res, err := l.AllowN(ctx, 1, keys[k], keys[j]); err != nil {
						t.Error(err)
					} else if res.Allowed {
						granted[k].Add(1)
						granted[j].Add(1)
					}
				case 5: // churn: other keys come and go
					_, _ = l.Allow(ctx, fmt.Sprintf("churn-%d-%d", g, i))
					_ = l.Reset(ctx, fmt.Sprintf("churn-%d-%d", g, i-7))
					if res, _ := l.Peek(ctx, keys[k]); !res.At.IsZero() {
						_ = l.RefundN(ctx, fleetrate.Result{Allowed: true, N: 1, At: res.At}, 0, keys[k])
					}
				default:
					if res, err := l.Allow(ctx, keys[k]); err != nil {
						t.Error(err)
					} else if res.Allowed {
						granted[k].Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	for i, k := range keys {
		// Demand far exceeds the bursts, so each is spent exactly.
		if got := granted[i].Load(); got != burst {
			t.Errorf("bucket %s granted %d, want its burst %d", k, got, burst)
		}
	}
}
