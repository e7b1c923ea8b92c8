package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/failsafe"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/internal/harness/schednoise"
	"github.com/fleetrate/fleetrate/lease"
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
	start := time.Now()
	if _, err := s.Take(ctx, req); err != nil {
		t.Fatal(err)
	}
	ttl, err := srv.Client().PTTL(ctx, "ttl").Result()
	if err != nil {
		t.Fatal(err)
	}
	// 4 tokens take 4 s to refill; the slack is 1 s. The key has aged by
	// at most the time since the take began (long on a loaded machine),
	// and Redis rounds TTLs to the millisecond.
	elapsed := time.Since(start)
	if ttl < 5*time.Second-elapsed-time.Millisecond || ttl > 5*time.Second {
		t.Fatalf("PTTL = %v %v after the take began, want in [5s - %[2]v, 5s]", ttl, elapsed)
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
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			stoppedRedisIsAnError(t, redisstore.Options{Timeout: 100 * time.Millisecond, Batch: batch})
		})
	}
}

func stoppedRedisIsAnError(t *testing.T, opts redisstore.Options) {
	srv := redistest.Start(t)
	s, err := redisstore.New(srv.Client(), opts)
	if err != nil {
		t.Fatal(err)
	}
	lim, err := fleetrate.New(s, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// A few tries: on a loaded machine a first dial and script load can
	// pass the test's short timeout, which is not what it tests.
	for range 5 {
		if _, err = lim.Allow(ctx, "k"); err == nil {
			break
		}
	}
	if err != nil {
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
				if _, err := lim.Wait(ctx, "k"); !errors.Is(err, fleetrate.ErrStoreUnavailable) {
					t.Fatalf("Wait = %v", err)
				}
			}
		})
	}
	// Back: a decision succeeds again. The first ones may still fail while
	// the client redials and reloads its scripts (how fast that is, is
	// measured by the recovery tests, not here); within 10 s one succeeds.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := lim.Allow(ctx, "k")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after recovery: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
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
		for _, batch := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/batch=%v", name, batch), func(t *testing.T) {
				s, err := redisstore.New(c, redisstore.Options{Timeout: 2 * time.Second, Batch: batch})
				if err != nil {
					t.Fatal(err)
				}
				key := fmt.Sprintf("any:%s:%v", name, batch)
				req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: key, Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 2)}}}, N: 2}
				if res, err := s.Take(context.Background(), req); err != nil || !res.Allowed {
					t.Fatalf("%+v %v", res, err)
				}
			})
		}
	}
	if _, err := redisstore.New(nil, redisstore.Options{}); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Fatalf("nil client: %v", err)
	}
}

// mode is a named set of store options.
type mode struct {
	name string
	opts redisstore.Options
}

var (
	// sharedModes are the options under which one script call serves
	// several callers; every test of folding runs under each.
	sharedModes = []mode{
		{"FoldHotKeys", redisstore.Options{Timeout: 2 * time.Second, FoldHotKeys: true}},
		{"Batch", redisstore.Options{Timeout: 2 * time.Second, Batch: true}},
	}
	// allModes adds one script call per take.
	allModes = append([]mode{{"Plain", redisstore.Options{Timeout: 2 * time.Second}}}, sharedModes...)
)

// forModes runs f once for each of modes, on a fresh store over an
// emptied server.
func forModes(t *testing.T, srv *redistest.Server, modes []mode, f func(t *testing.T, name string, s *redisstore.Store)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			if err := srv.Client().FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			s, err := redisstore.New(srv.Client(), m.opts)
			if err != nil {
				t.Fatal(err)
			}
			f(t, m.name, s)
		})
	}
}

func TestConformanceShared(t *testing.T) {
	srv := redistest.Start(t)
	forModes(t, srv, sharedModes, func(t *testing.T, _ string, s *redisstore.Store) {
		storetest.Run(t, func(*testing.T) fleetrate.Store { return s })
	})
}

// TestFoldedKeysWithNULs mixes a one-bucket take on "A\x00B" with a
// two-bucket take on "A" and "B": they must never fold together.
func TestFoldedKeysWithNULs(t *testing.T) {
	srv := redistest.Start(t)
	forModes(t, srv, sharedModes, func(t *testing.T, _ string, s *redisstore.Store) {
		foldedKeysWithNULs(t, s)
	})
}

func foldedKeysWithNULs(t *testing.T, s *redisstore.Store) {
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
	forModes(t, srv, sharedModes, func(t *testing.T, _ string, s *redisstore.Store) {
		foldedTakesAreExact(t, s)
	})
}

func foldedTakesAreExact(t *testing.T, s *redisstore.Store) {
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

// TestBatchCallerThatGivesUpIsRefunded holds Redis still while a batched
// take is in flight, lets its caller's context end, and checks that the
// token the script granted meanwhile goes back to the bucket.
func TestBatchCallerThatGivesUpIsRefunded(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	// Every script call that names the bucket, by its arguments: a batch
	// take of it, then the refund.
	var mu sync.Mutex
	var calls []string
	var scripts atomic.Int64
	c.AddHook(redistest.ScriptCounter{N: &scripts})
	c.AddHook(argsHook(func(args []any) {
		if len(args) > 3 && args[3] == "gave-up" {
			mu.Lock()
			calls = append(calls, fmt.Sprint(args[4:]))
			mu.Unlock()
		}
	}))
	// KeepAfterFailover: the test reads the scripts' ARGV, which the
	// failover guard would prefix with the master's replication ID.
	s, err := redisstore.New(c, redisstore.Options{Timeout: 2 * time.Second, Batch: true, KeepAfterFailover: true})
	if err != nil {
		t.Fatal(err)
	}
	lim := []fleetrate.Limit{fleetrate.Every(time.Hour, 5)}
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "gave-up", Limits: lim}}, N: 1}
	srv.Pause()
	// A take that finds no call in flight is sent at once, alone: one is
	// in flight first, so that the next queues for a batch call.
	busy := occupy(t, s, &scripts)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := s.Take(ctx, req)
		done <- err
	}()
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, fleetrate.ErrStoreUnavailable) {
		t.Fatalf("Take with Redis paused = %v, want the caller's own deadline, not an unavailable store", err)
	}
	srv.Resume()
	<-busy
	// The abandoned take runs once Redis resumes, then is refunded.
	peek := fleetrate.Request{Buckets: req.Buckets}
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, err := s.Take(context.Background(), peek)
		if err != nil {
			t.Fatal(err)
		}
		st, ok, err := s.State(context.Background(), "gave-up")
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		seen := slices.Clone(calls)
		mu.Unlock()
		// The batch took one token (one shape with its limits and reserve,
		// then one take of it), and a cancel of its booking of one
		// followed (stamp, the slot's wait, then the limits, the cost of
		// one and the booked debt), whether or not its slot had begun:
		// its caller never saw the grant.
		took := slices.Contains(seen, fmt.Sprint([]any{1, 1, int64(1), int64(0), 1, 1, lim[0].Interval(), lim[0].Burst, int64(0), 1}))
		refunded := slices.ContainsFunc(seen, func(call string) bool {
			f := strings.Fields(strings.Trim(call, "[]"))
			return len(f) == 7 && f[1] == fmt.Sprint(int64(math.MaxInt64)) && f[2] == "1" && f[3] == fmt.Sprint(lim[0].Interval()) && f[4] == fmt.Sprint(lim[0].Burst) && f[5] == "1"
		})
		if res.Remaining == 5 && !ok && took && refunded {
			return // taken and given back: the bucket is full and absent
		}
		if time.Now().After(deadline) {
			t.Fatalf("bucket not refunded: %+v, state %+v %v, took %v refunded %v", res, st, ok, took, refunded)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// occupy starts a take that finds no call in flight (and so is sent at
// once by its caller) and waits until it is sent, as counted by scripts;
// the channel is closed when it returns.
func occupy(t *testing.T, s *redisstore.Store, scripts *atomic.Int64) <-chan struct{} {
	t.Helper()
	n := scripts.Load()
	done := make(chan struct{})
	go func() {
		defer close(done)
		req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "occupied", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}}}}
		_, _ = s.Take(context.Background(), req)
	}()
	for deadline := time.Now().Add(5 * time.Second); scripts.Load() == n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the occupying take was not sent")
		}
	}
	return done
}

// argsHook calls f with the arguments of every command sent alone.
type argsHook func(args []any)

func (f argsHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f argsHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		f(cmd.Args())
		return next(ctx, cmd)
	}
}
func (f argsHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestLimiterAllowThroughBind checks a Limiter's Allow and Peek, which take
// through the store's bound taker, in every mode: the limits apply, the
// result names them as configured, and bad names are errors.
func TestLimiterAllowThroughBind(t *testing.T) {
	srv := redistest.Start(t)
	forModes(t, srv, allModes, func(t *testing.T, name string, s *redisstore.Store) {
		lim := fleetrate.Every(time.Hour, 3).Named("hourly")
		l, err := fleetrate.New(s, fleetrate.Config{Prefix: "bind:" + name + ":", Limits: []fleetrate.Limit{lim}})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for i, want := range []bool{true, true, true, false} {
			res, err := l.Allow(ctx, "k")
			if err != nil || res.Allowed != want || res.Limit != lim || res.Remaining != int64(max(2-i, 0)) {
				t.Fatalf("take %d: %+v, %v; want allowed=%v by %v", i, res, err, want, lim)
			}
		}
		if res, err := l.Peek(ctx, "k"); err != nil || !res.Allowed || res.Remaining != 0 {
			t.Fatalf("peek: %+v, %v", res, err)
		}
		for _, name := range []string{"", strings.Repeat("x", fleetrate.MaxNameLen+1)} {
			if _, err := l.Allow(ctx, name); !errors.Is(err, fleetrate.ErrInvalid) {
				t.Errorf("Allow(%d-byte name) = %v, want ErrInvalid", len(name), err)
			}
		}
		if _, err := l.AllowN(ctx, 4, "k"); !errors.Is(err, fleetrate.ErrBurstExceeded) {
			t.Errorf("AllowN beyond the burst = %v", err)
		}
	})
}

// TestBatchWithoutTimeoutIsStillBounded: a store with no timeout of its
// own (the service's, which bounds each request itself) still bounds the
// batched calls, which belong to no request, by DefaultTimeout.
func TestBatchWithoutTimeoutIsStillBounded(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	var scripts atomic.Int64
	c.AddHook(redistest.ScriptCounter{N: &scripts})
	s, err := redisstore.New(c, redisstore.Options{Timeout: -1, Batch: true})
	if err != nil {
		t.Fatal(err)
	}
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "unbounded", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}}}, N: 1}
	srv.Pause()
	// The take that finds no call in flight is its caller's own, bounded
	// by its context alone (none here): the next one shares a call.
	busy := occupy(t, s, &scripts)
	defer func() { srv.Resume(); <-busy }()
	start := time.Now()
	if _, err := s.Take(context.Background(), req); !errors.Is(err, fleetrate.ErrStoreUnavailable) {
		t.Fatalf("Take with Redis paused and no deadline = %v, want ErrStoreUnavailable", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("took %v; the batch should give up after %v", took, redisstore.DefaultTimeout)
	}
}

// TestBatchDropsTakesAbandonedWhileQueued: a take whose caller gives up
// before its batch is sent is never sent, so it cannot take the token of a
// caller queued behind it.
func TestBatchDropsTakesAbandonedWhileQueued(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	var scripts atomic.Int64 // script calls sent
	c.AddHook(redistest.ScriptCounter{N: &scripts})
	s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second, Batch: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.LoadScripts(context.Background()); err != nil {
		t.Fatal(err)
	}
	sentAtLeast := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); scripts.Load() < n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d script calls sent, want %d", scripts.Load(), n)
			}
		}
	}
	one := func(key string) fleetrate.Request {
		return fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: key, Limits: []fleetrate.Limit{fleetrate.Every(time.Hour, 1)}}}, N: 1}
	}
	srv.Pause()
	// Two takes, one after the other, occupy both calls in flight.
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			if _, err := s.Take(context.Background(), one(fmt.Sprint("busy", i))); err != nil {
				t.Error(err)
			}
		})
		sentAtLeast(int64(i + 1))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := s.Take(ctx, one("contended")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued take = %v, want its deadline", err)
	}
	got := make(chan fleetrate.Result, 1)
	wg.Go(func() {
		res, err := s.Take(context.Background(), one("contended"))
		if err != nil {
			t.Error(err)
		}
		got <- res
	})
	time.Sleep(20 * time.Millisecond) // queued behind the abandoned one
	if n := scripts.Load(); n != 2 {
		t.Fatalf("%d script calls sent while both calls in flight hang, want 2", n)
	}
	srv.Resume()
	wg.Wait()
	if res := <-got; !res.Allowed {
		t.Fatalf("the live caller was denied (%+v): the abandoned take was sent", res)
	}
}

// TestBatchOfManyKeys sends many concurrent takes of 32 buckets each: the
// batches are cut by keys as well as takes, and every take succeeds.
func TestBatchOfManyKeys(t *testing.T) {
	srv := redistest.Start(t)
	s, err := redisstore.New(srv.Client(), redisstore.Options{Timeout: 5 * time.Second, Batch: true})
	if err != nil {
		t.Fatal(err)
	}
	lim := []fleetrate.Limit{fleetrate.Every(time.Hour, 10)}
	var wg sync.WaitGroup
	for g := range 256 {
		wg.Go(func() {
			req := fleetrate.Request{N: 1}
			for b := range 32 {
				req.Buckets = append(req.Buckets, fleetrate.Bucket{Key: fmt.Sprintf("many:%d:%d", g, b), Limits: lim})
			}
			if res, err := s.Take(context.Background(), req); err != nil || !res.Allowed {
				t.Errorf("take %d: %+v, %v", g, res, err)
			}
		})
	}
	wg.Wait()
}

// TestKeyOfAnotherTypeIsAnError: a bucket key that holds a hash is a store
// error in every mode, and the hash is never overwritten.
func TestKeyOfAnotherTypeIsAnError(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	forModes(t, srv, allModes, func(t *testing.T, name string, s *redisstore.Store) {
		key := "wrongtype:" + name
		if err := srv.Client().HSet(ctx, key, "f", "v").Err(); err != nil {
			t.Fatal(err)
		}
		req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: key, Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}}}, N: 1}
		if res, err := s.Take(ctx, req); !errors.Is(err, fleetrate.ErrStoreUnavailable) || res.Allowed {
			t.Fatalf("Take on a hash = %+v, %v; want ErrStoreUnavailable", res, err)
		}
		if typ := srv.Client().Type(ctx, key).Val(); typ != "hash" {
			t.Fatalf("the key is now a %s", typ)
		}
	})
}

// TestMultipleClocks: Cluster and Ring stores report several clocks, so
// that Limiters do not anchor waits to one of them.
func TestMultipleClocks(t *testing.T) {
	for _, tc := range []struct {
		c    redisstore.Client
		want bool
	}{
		{redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), false},
		{redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}), true},
		{redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}}), true},
	} {
		s, err := redisstore.New(tc.c, redisstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.MultipleClocks(); got != tc.want {
			t.Errorf("%T: MultipleClocks() = %v, want %v", tc.c, got, tc.want)
		}
	}
}

// TestHungRedisBoundsEveryDecision freezes redis-server with SIGSTOP while
// 32 goroutines take, in every mode, with either kind of client (one that
// gives up at its context's deadline, one the store must abandon), and
// through a failsafe store: no decision takes longer than the
// store's timeout plus the scheduling noise measured in the same window.
// Takes queued behind a call in flight give up at their own deadline, not
// after that call's.
func TestHungRedisBoundsEveryDecision(t *testing.T) {
	const timeout = 100 * time.Millisecond
	srv := redistest.Start(t)
	clients := map[string]func() *redis.Client{
		"ContextTimeoutEnabled": func() *redis.Client {
			return redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
		},
		"default": func() *redis.Client { return redis.NewClient(&redis.Options{Addr: srv.Addr()}) },
	}
	wrappers := map[string]func(t *testing.T, s fleetrate.Store) fleetrate.Store{
		"": func(_ *testing.T, s fleetrate.Store) fleetrate.Store { return s },
		"+failsafe": func(t *testing.T, s fleetrate.Store) fleetrate.Store {
			fs, err := failsafe.New(s, failsafe.Options{Name: "redis", Policy: failsafe.FailClosed, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			return fs
		},
		"+lease": func(t *testing.T, s fleetrate.Store) fleetrate.Store {
			ls, err := lease.New(s, lease.Options{Tokens: 4})
			if err != nil {
				t.Fatal(err)
			}
			return ls
		},
	}
	for _, m := range allModes {
		for cname, newClient := range clients {
			for wname, wrap := range wrappers {
				t.Run(m.name+wname+"/"+cname, func(t *testing.T) {
					c := newClient()
					t.Cleanup(func() { _ = c.Close() })
					opts := m.opts
					opts.Timeout = timeout
					rs, err := redisstore.New(c, opts)
					if err != nil {
						t.Fatal(err)
					}
					// A lease grants from tokens it leased before Redis hung.
					worst, noise := hungTakes(t, srv, wrap(t, rs), 32, 5*timeout, wname == "+lease")
					bound := timeout + schednoise.Allowance(noise, 50*time.Millisecond)
					if wname == "+lease" {
						// A leased take first waits up to 5 ms for the
						// caller renewing the lease: one more timer, late
						// by up to the noise.
						bound += leaseWait + noise
					}
					t.Logf("slowest decision %v with a %v timeout (scheduling noise %v, bound %v)", worst, timeout, noise, bound)
					if worst > bound {
						t.Errorf("slowest decision on a hung Redis took %v, more than the %v timeout plus %v of measured scheduling noise", worst, timeout, bound-timeout)
					}
				})
			}
		}
	}
}

// leaseWait is how long a leased take waits for the caller renewing its
// bucket's lease before it asks the store itself (lease's own constant).
const leaseWait = 5 * time.Millisecond

// hungTakes pauses srv and runs takes through s from g goroutines for d,
// each on one of a few keys, and returns the slowest take and the worst
// scheduling lateness seen meanwhile. Every take must fail as
// ErrStoreUnavailable, or, when leased, be granted from a lease.
func hungTakes(t *testing.T, srv *redistest.Server, s fleetrate.Store, g int, d time.Duration, leased bool) (worst, noise time.Duration) {
	t.Helper()
	lim := []fleetrate.Limit{fleetrate.PerSecond(1000, 1000)}
	req := func(i int) fleetrate.Request {
		return fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: fmt.Sprintf("hung%d", i%4), Limits: lim}}, N: 1}
	}
	ctx := context.Background()
	for i := range 4 { // dialled, scripts loaded
		// A few tries: on a loaded machine a first dial and script load
		// can pass the test's short timeout, which is not what it tests.
		var err error
		for range 5 {
			if _, err = s.Take(ctx, req(i)); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	srv.Pause()
	defer srv.Resume()
	watch := schednoise.Start()
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for i := range g {
		wg.Go(func() {
			for time.Now().Before(end) {
				start := time.Now()
				res, err := s.Take(ctx, req(i))
				took := time.Since(start)
				if leased && err == nil && res.Allowed {
					// served from a lease
				} else if !errors.Is(err, fleetrate.ErrStoreUnavailable) || res.Allowed {
					t.Errorf("take on a hung Redis = %+v, %v; want ErrStoreUnavailable", res, err)
					return
				}
				mu.Lock()
				worst = max(worst, took)
				mu.Unlock()
				// Callers that fail fast (an open breaker) would otherwise
				// spin and starve the others of the CPU.
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()
	return worst, watch.Stop()
}

// TestWarmDialsAndLoadsBeforeTheFirstDecision: after Warm, as many
// concurrent first takes as connections it opened dial nothing and find
// their script loaded; without it they dial and fall back to EVAL.
func TestWarmDialsAndLoadsBeforeTheFirstDecision(t *testing.T) {
	srv := redistest.Start(t)
	n := 2 * runtime.GOMAXPROCS(0) // what Warm opens when MinIdleConns is unset
	for _, warm := range []bool{true, false} {
		t.Run(fmt.Sprintf("warm=%v", warm), func(t *testing.T) {
			if err := srv.Client().ScriptFlush(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
			if err := srv.Client().FlushAll(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
			c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			var dials, noscript atomic.Int64
			c.AddHook(&startHook{dials: &dials, noscript: &noscript})
			s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if warm {
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				if err := s.Warm(ctx); err != nil {
					t.Fatal(err)
				}
				if got := c.PoolStats().IdleConns; int(got) < n {
					t.Fatalf("%d idle connections after Warm, want %d", got, n)
				}
			}
			before := dials.Load()
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: fmt.Sprintf("warm%d", i), Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}}}, N: 1}
					if res, err := s.Take(t.Context(), req); err != nil || !res.Allowed {
						t.Errorf("first take = %+v, %v", res, err)
					}
				})
			}
			wg.Wait()
			d, ns := dials.Load()-before, noscript.Load()
			t.Logf("%d concurrent first takes: %d dials, %d NOSCRIPT fallbacks", n, d, ns)
			if warm && (d != 0 || ns != 0) {
				t.Errorf("after Warm, the first takes dialled %d times and met NOSCRIPT %d times, want neither", d, ns)
			}
			if !warm && (d == 0 || ns == 0) {
				t.Errorf("without Warm, the first takes dialled %d times and met NOSCRIPT %d times; the test shows nothing", d, ns)
			}
		})
	}
}

// startHook counts a client's dials and its script calls that met
// NOSCRIPT.
type startHook struct{ dials, noscript *atomic.Int64 }

func (h *startHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.dials.Add(1)
		return next(ctx, network, addr)
	}
}

func (h *startHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			h.noscript.Add(1)
		}
		return err
	}
}

func (h *startHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
