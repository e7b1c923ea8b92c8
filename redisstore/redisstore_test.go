package redisstore_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/storetest"
)

func newStore(t *testing.T, srv *redistest.Server) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(srv.Client(), redisstore.Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv)
	storetest.Run(t, func(*testing.T) fleetrate.Store { return s })
}

func TestTTLIsTimeToFullPlusSlack(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv)
	ctx := context.Background()
	lim := fleetrate.PerSecond(1, 10) // 10 s to fill from empty
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "ttl", Limits: []fleetrate.Limit{lim}}}, N: 4}
	if _, err := s.Take(ctx, req); err != nil {
		t.Fatal(err)
	}
	ttl, err := srv.Client().PTTL(ctx, "ttl").Result()
	if err != nil {
		t.Fatal(err)
	}
	// 4 tokens take 4 s to refill; the slack is 1 s.
	if ttl <= 4*time.Second || ttl > 5*time.Second {
		t.Fatalf("PTTL = %v, want in (4s, 5s]", ttl)
	}
	// A denied take and a peek write nothing.
	req.N = 10
	if res, _ := s.Take(ctx, req); res.Allowed {
		t.Fatal("take of 10 allowed with 6 left")
	}
	if ttl2, _ := srv.Client().PTTL(ctx, "ttl").Result(); ttl2 > ttl {
		t.Fatalf("a denial rewrote the key: PTTL %v then %v", ttl, ttl2)
	}
}

func TestScriptFlushIsInvisible(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv)
	ctx := context.Background()
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "flush", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 5)}}}, N: 1}
	for range 3 {
		if err := srv.Client().ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if res, err := s.Take(ctx, req); err != nil || !res.Allowed {
			t.Fatalf("after SCRIPT FLUSH: %+v, %v", res, err)
		}
	}
}

func TestStoppedRedisIsAnErrorWithinTheTimeout(t *testing.T) {
	srv := redistest.Start(t)
	s, err := redisstore.New(srv.Client(), redisstore.Options{Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := fleetrate.New(s, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := lim.Allow(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	for _, stop := range []struct {
		name      string
		stop, fix func()
	}{
		{"killed", srv.Kill, srv.Restart},
		{"hung", srv.Pause, srv.Resume},
	} {
		t.Run(stop.name, func(t *testing.T) {
			stop.stop()
			defer stop.fix()
			for range 3 {
				start := time.Now()
				res, err := lim.Allow(ctx, "k")
				took := time.Since(start)
				if !errors.Is(err, fleetrate.ErrStoreUnavailable) || res.Allowed {
					t.Fatalf("Allow with Redis %s = %+v, %v; want ErrStoreUnavailable", stop.name, res, err)
				}
				// The bound is the timeout plus scheduling noise, not Redis's.
				if took > 2*time.Second {
					t.Fatalf("Allow took %v with a 100ms timeout", took)
				}
				if err := lim.Wait(ctx, "k"); !errors.Is(err, fleetrate.ErrStoreUnavailable) {
					t.Fatalf("Wait = %v", err)
				}
			}
		})
	}
	if _, err := lim.Allow(ctx, "k"); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
}

func TestAnyGoRedisClient(t *testing.T) {
	srv := redistest.Start(t)
	clients := map[string]redisstore.Client{
		"Client":    redis.NewClient(&redis.Options{Addr: srv.Addr()}),
		"Universal": redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{srv.Addr()}}),
		"Ring":      redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr()}}),
	}
	for name, c := range clients {
		t.Run(name, func(t *testing.T) {
			s, err := redisstore.New(c, redisstore.Options{Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "any:" + name, Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 2)}}}, N: 2}
			if res, err := s.Take(context.Background(), req); err != nil || !res.Allowed {
				t.Fatalf("%+v %v", res, err)
			}
		})
	}
	if _, err := redisstore.New(nil, redisstore.Options{}); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Fatalf("nil client: %v", err)
	}
}

func TestConformanceFolded(t *testing.T) {
	srv := redistest.Start(t)
	s, err := redisstore.New(srv.Client(), redisstore.Options{Timeout: 2 * time.Second, FoldHotKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	storetest.Run(t, func(*testing.T) fleetrate.Store { return s })
}

// TestFoldedKeysWithNULs mixes a one-bucket take on "A\x00B" with a
// two-bucket take on "A" and "B": they must never fold together.
func TestFoldedKeysWithNULs(t *testing.T) {
	srv := redistest.Start(t)
	s, err := redisstore.New(srv.Client(), redisstore.Options{Timeout: 2 * time.Second, FoldHotKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	lim := []fleetrate.Limit{fleetrate.Every(time.Hour, 1000)}
	one := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "A\x00B", Limits: lim}}, N: 1}
	two := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "A", Limits: lim}, {Key: "B", Limits: lim}}, N: 1}
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			req := one
			if i%2 == 1 {
				req = two
			}
			if res, err := s.Take(context.Background(), req); err != nil || !res.Allowed {
				t.Errorf("take %d: %+v %v", i, res, err)
			}
		})
	}
	wg.Wait()
	for _, k := range []string{"A\x00B", "A", "B"} {
		peek := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: k, Limits: lim}}}
		if res, err := s.Take(context.Background(), peek); err != nil || res.Remaining != 900 {
			t.Errorf("bucket %q: %+v %v, want 100 taken", k, res, err)
		}
	}
}

// TestFoldedTakesAreExact sends many concurrent takes at one hot bucket
// through the folding store: exactly the burst is granted, and reservations
// get distinct consecutive slots.
func TestFoldedTakesAreExact(t *testing.T) {
	srv := redistest.Start(t)
	s, err := redisstore.New(srv.Client(), redisstore.Options{Timeout: 2 * time.Second, FoldHotKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lim := fleetrate.Every(time.Hour, 100)
	allow := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "hot", Limits: []fleetrate.Limit{lim}}}, N: 1}
	var granted, denied atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 10 {
				res, err := s.Take(ctx, allow)
				switch {
				case err != nil:
					t.Error(err)
					return
				case res.Allowed:
					granted.Add(1)
				case res.RetryAfter <= 0:
					t.Errorf("denial without retry-after: %+v", res)
				default:
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if granted.Load() != 100 || denied.Load() != 540 {
		t.Fatalf("granted %d denied %d of 640, want exactly 100 granted", granted.Load(), denied.Load())
	}

	// Reservations: 200 concurrent bookings at 1000/s burst 1 get 200
	// distinct slots 1 ms apart (measured on the store's clock).
	resv := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "hot-wait", Limits: []fleetrate.Limit{fleetrate.PerSecond(1000, 1)}}}, N: 1, MaxWait: time.Minute}
	var mu sync.Mutex
	var slots []int64
	for range 200 {
		wg.Go(func() {
			res, err := s.Take(ctx, resv)
			if err != nil || !res.Allowed {
				t.Errorf("%+v %v", res, err)
				return
			}
			mu.Lock()
			slots = append(slots, res.At.UnixNano()+int64(res.Wait))
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(slots)
	for i := 1; i < len(slots); i++ {
		if gap := slots[i] - slots[i-1]; gap < int64(time.Millisecond) {
			t.Fatalf("slots %d and %d are %v apart, want >= 1ms", i-1, i, time.Duration(gap))
		}
	}
}
