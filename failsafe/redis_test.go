package failsafe_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/failsafe"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/internal/harness/schednoise"
	"github.com/fleetrate/fleetrate/redisstore"
)

const storeTimeout = 100 * time.Millisecond

// warm dials and loads the scripts before the first decision, as a
// service should (Store.Warm): on a loaded machine a cold first take can
// pass the test's short timeout, which is not what the tests check.
func warm(t *testing.T, rs *redisstore.Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
}

func redisLimiter(t *testing.T, srv *redistest.Server, policy failsafe.Policy) (*fleetrate.Limiter, *failsafe.Store) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	rs, err := redisstore.New(c, redisstore.Options{Timeout: storeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	fs, err := failsafe.New(rs, failsafe.Options{
		Name: "redis", Policy: policy, FleetSize: 2, CoolOff: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := fleetrate.New(fs, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1000, 100)}})
	if err != nil {
		t.Fatal(err)
	}
	return lim, fs
}

type sample struct {
	took time.Duration
	res  fleetrate.Result
	err  error
	at   time.Time
}

// drive runs 8 goroutines of Allow until stop is closed.
func drive(lim *fleetrate.Limiter, stop <-chan struct{}) func() []sample {
	var mu sync.Mutex
	var out []sample
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				res, err := lim.Allow(context.Background(), fmt.Sprintf("k%d", (g+i)%4))
				s := sample{took: time.Since(start), res: res, err: err, at: start}
				mu.Lock()
				out = append(out, s)
				mu.Unlock()
				time.Sleep(time.Millisecond)
			}
		})
	}
	return func() []sample { wg.Wait(); return out }
}

func p99(ss []sample) time.Duration {
	d := make([]time.Duration, len(ss))
	for i, s := range ss {
		d[i] = s.took
	}
	slices.Sort(d)
	return d[len(d)*99/100]
}

// TestRedisKilledMidRun kills redis-server with SIGKILL while the limiter
// runs, restarts it, and checks each policy.
func TestRedisKilledMidRun(t *testing.T) {
	for _, policy := range []failsafe.Policy{failsafe.FailOpen, failsafe.FailClosed, failsafe.LocalFallback} {
		t.Run(policy.String(), func(t *testing.T) {
			srv := redistest.Start(t)
			lim, fs := redisLimiter(t, srv, policy)
			stop := make(chan struct{})
			watch := schednoise.Start()
			collect := drive(lim, stop)
			time.Sleep(200 * time.Millisecond)
			// Kill waits for the process to exit: calls started before it
			// returns may still have been answered by Redis.
			srv.Kill()
			killed := time.Now()
			time.Sleep(700 * time.Millisecond)
			if !fs.Open() {
				t.Error("breaker did not open while Redis was down")
			}
			// The restarted server answers before Restart returns: a call
			// counts as made during the outage only if it ended before
			// the restart began.
			restarting := time.Now()
			srv.Restart()
			back := time.Now()
			time.Sleep(1200 * time.Millisecond)
			close(stop)
			samples := collect()
			// Bounds on wall-clock durations allow for the scheduling
			// noise of a loaded machine, measured during the run.
			slack := schednoise.Allowance(watch.Stop(), 50*time.Millisecond)

			var during []sample
			var recoveredAt time.Time
			for _, s := range samples {
				switch {
				case s.at.After(killed.Add(10*time.Millisecond)) && s.at.Add(s.took).Before(restarting):
					during = append(during, s)
				case s.at.After(back) && s.err == nil && !s.res.Degraded && recoveredAt.IsZero():
					recoveredAt = s.at
				}
			}
			if len(during) < 20 {
				t.Fatalf("only %d decisions while Redis was down", len(during))
			}
			// Decisions while Redis is down stay within the store timeout:
			// once the breaker is open they do not reach Redis at all.
			if p := p99(during); p > storeTimeout+slack {
				t.Errorf("p99 decision time while Redis was down: %v, want within the %v timeout (+%v measured noise)", p, storeTimeout, slack)
			}
			for _, s := range during {
				switch policy {
				case failsafe.FailOpen:
					if s.err != nil || !s.res.Allowed || !s.res.Degraded {
						t.Fatalf("fail open during outage: %+v %v", s.res, s.err)
					}
				case failsafe.FailClosed:
					if !errors.Is(s.err, fleetrate.ErrStoreUnavailable) || s.res.Allowed {
						t.Fatalf("fail closed during outage: %+v %v", s.res, s.err)
					}
				case failsafe.LocalFallback:
					if s.err != nil || !s.res.Degraded {
						t.Fatalf("local fallback during outage: %+v %v", s.res, s.err)
					}
				}
			}
			if recoveredAt.IsZero() {
				t.Fatal("decisions never came back from Redis after the restart")
			}
			if d := recoveredAt.Sub(back); d > time.Second+slack {
				t.Errorf("decisions came back %v after Redis, want within 1s (+%v measured noise)", d, slack)
			}
			t.Logf("%s: %d decisions during the outage, p99 %v; back on Redis %v after restart",
				policy, len(during), p99(during), recoveredAt.Sub(back).Round(time.Millisecond))
		})
	}
}

// TestRedisHung freezes redis-server with SIGSTOP: calls time out within
// the bound and the breaker opens.
func TestRedisHung(t *testing.T) {
	srv := redistest.Start(t)
	lim, fs := redisLimiter(t, srv, failsafe.FailClosed)
	ctx := context.Background()
	if _, err := lim.Allow(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	defer srv.Resume()
	watch := schednoise.Start()
	var worst time.Duration
	for range 10 {
		start := time.Now()
		_, err := lim.Allow(ctx, "k")
		worst = max(worst, time.Since(start))
		if !errors.Is(err, fleetrate.ErrStoreUnavailable) {
			t.Fatalf("hung Redis: %v", err)
		}
	}
	if !fs.Open() {
		t.Fatal("breaker did not open on a hung Redis")
	}
	if slack := schednoise.Allowance(watch.Stop(), 50*time.Millisecond); worst > storeTimeout+slack {
		t.Errorf("slowest call on a hung Redis took %v, want within the %v timeout (+%v measured noise)", worst, storeTimeout, slack)
	}
}

// TestRedisOutOfMemory fills a Redis with maxmemory 1mb and noeviction: a
// take that must write fails as a store error, and the policy decides.
func TestRedisOutOfMemory(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory", "1mb", "--maxmemory-policy", "noeviction")
	ctx := context.Background()
	c := srv.Client()
	junk := strings.Repeat("x", 10_000)
	for i := 0; ; i++ {
		if err := c.Set(ctx, fmt.Sprintf("junk:%d", i), junk, 0).Err(); err != nil {
			if !strings.Contains(err.Error(), "OOM") {
				t.Fatal(err)
			}
			break
		}
		if i > 10_000 {
			t.Fatal("maxmemory never reached")
		}
	}
	closed, _ := redisLimiter(t, srv, failsafe.FailClosed)
	res, err := closed.Allow(ctx, "oom")
	if !errors.Is(err, fleetrate.ErrStoreUnavailable) || res.Allowed || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("fail closed on OOM: %+v %v", res, err)
	}
	open, _ := redisLimiter(t, srv, failsafe.FailOpen)
	if res, err := open.Allow(ctx, "oom"); err != nil || !res.Allowed || !res.Degraded {
		t.Fatalf("fail open on OOM: %+v %v", res, err)
	}
	// A peek writes nothing, so Redis still answers it.
	if res, err := closed.Peek(ctx, "oom"); err != nil || !res.Allowed {
		t.Fatalf("peek on OOM: %+v %v", res, err)
	}
}

// TestEmptyAfterOutage restarts Redis, losing every bucket: with
// EmptyAfterOutage the buckets start empty and refill at their rate, so
// the fleet does not spend an extra burst. The Redis store's own guard
// (redisstore.Options.EmptyAfterFailover, its default) would empty them
// too: it is turned off here, to see failsafe's option alone.
func TestEmptyAfterOutage(t *testing.T) {
	for _, empty := range []bool{false, true} {
		t.Run(fmt.Sprintf("EmptyAfterOutage=%v", empty), func(t *testing.T) {
			srv := redistest.Start(t)
			c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
			t.Cleanup(func() { _ = c.Close() })
			rs, err := redisstore.New(c, redisstore.Options{Timeout: storeTimeout, KeepAfterFailover: true})
			if err != nil {
				t.Fatal(err)
			}
			warm(t, rs)
			fs, err := failsafe.New(rs, failsafe.Options{
				Policy: failsafe.FailClosed, FailureThreshold: 1, CoolOff: 50 * time.Millisecond,
				EmptyAfterOutage: empty, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			lim, err := fleetrate.New(fs, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.Every(time.Minute, 10)}})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if res, err := lim.AllowN(ctx, 10, "k"); err != nil || !res.Allowed {
				t.Fatalf("spending the burst: %+v %v", res, err)
			}
			srv.Kill()
			if _, err := lim.Allow(ctx, "k"); !errors.Is(err, fleetrate.ErrStoreUnavailable) {
				t.Fatalf("Redis down: %v", err)
			}
			srv.Restart() // the bucket is gone: it reads as full
			var res fleetrate.Result
			deadline := time.Now().Add(5 * time.Second)
			for {
				res, err = lim.Allow(ctx, "k")
				if err == nil || time.Now().After(deadline) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil {
				t.Fatalf("after restart: %v", err)
			}
			if res.Allowed == empty {
				t.Fatalf("first take after the restart: %+v; want allowed=%v", res, !empty)
			}
			if empty && res.RetryAfter < 55*time.Second {
				t.Fatalf("bucket did not start empty: %+v", res)
			}
		})
	}
}
