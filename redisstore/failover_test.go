package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/internal/harness/schednoise"
	"github.com/fleetrate/fleetrate/redisstore"
)

// TestEmptyAfterFailoverOnRestart books 10 s ahead on a bucket, restarts
// Redis without its data (a new master, as after a failover: a new
// replication ID, and a bucket the old one had emptied is full there), and
// takes again. With EmptyAfterFailover the take finds the bucket empty
// until the slot booked before the restart, in every mode and through a
// Limiter; without it, full.
func TestEmptyAfterFailoverOnRestart(t *testing.T) {
	srv := redistest.Start(t)
	lim := fleetrate.PerSecond(1, 5) // one token a second
	for _, m := range allModes {
		for _, empty := range []bool{true, false} {
			name := m.name + "/EmptyAfterFailover=false"
			if empty {
				name = m.name + "/EmptyAfterFailover=true"
			}
			t.Run(name, func(t *testing.T) {
				c := redis.NewClient(redisstore.ClientOptions(&redis.Options{Addr: srv.Addr()}))
				t.Cleanup(func() { _ = c.Close() })
				opts := m.opts
				opts.Timeout, opts.EmptyAfterFailover, opts.KeepAfterFailover = 5*time.Second, empty, !empty
				s, err := redisstore.New(c, opts)
				if err != nil {
					t.Fatal(err)
				}
				l, err := fleetrate.New(s, fleetrate.Config{Prefix: "failover:", Limits: []fleetrate.Limit{lim}, MaxWait: 30 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				ctx := t.Context()
				if err := srv.Client().FlushAll(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				// The last token booked below is due 10 s after the burst;
				// start is no later than the burst, on the same clock as
				// Redis (one host).
				start := time.Now()
				if res, err := l.AllowN(ctx, 5, "k"); err != nil || !res.Allowed {
					t.Fatalf("the burst: %+v, %v", res, err)
				}
				if _, err := reserve(ctx, l, 5); err != nil {
					t.Fatal(err)
				}
				res, err := reserve(ctx, l, 5)
				if err != nil || !res.Allowed || res.Wait < 9*time.Second {
					t.Fatalf("booking 10 s ahead: %+v, %v", res, err)
				}
				srv.Kill()
				srv.Restart()
				res, err = reserve(ctx, l, 1)
				elapsed := time.Since(start)
				if err != nil || !res.Allowed {
					t.Fatalf("take after the restart: %+v, %v", res, err)
				}
				t.Logf("take %v after the burst: wait %v", elapsed.Round(time.Millisecond), res.Wait)
				if !empty {
					if res.Wait != 0 {
						t.Errorf("without EmptyAfterFailover, the restarted Redis made the take wait %v, want 0 (a full bucket)", res.Wait)
					}
					return
				}
				// Emptied until the last booked slot (10 s after the burst),
				// then one token's interval. The store counts the booking
				// from when its reply arrived, later than Redis booked it,
				// so this holds exactly.
				if want := 11*time.Second - elapsed - 10*time.Millisecond; res.Wait < want {
					t.Errorf("with EmptyAfterFailover, the take after the restart waits %v, want at least %v (emptied until the slot booked before it)", res.Wait, want)
				}
				// Only the first take after the switch empties the bucket.
				res2, err := reserve(ctx, l, 1)
				if err != nil || !res2.Allowed || res2.Wait-res.Wait > 1100*time.Millisecond {
					t.Errorf("second take after the restart: %+v, %v; want one interval after the first (%v)", res2, err, res.Wait)
				}
			})
		}
	}
}

// reserve books n tokens of bucket k through l.
func reserve(ctx context.Context, l *fleetrate.Limiter, n int64) (fleetrate.Result, error) {
	r, err := l.ReserveN(ctx, n, "k")
	if err != nil {
		return fleetrate.Result{}, err
	}
	return r.Result, nil
}

// TestEmptyAfterFailoverRefusesAReplica: the guarded scripts write nothing
// on a server that is not a master, and the store reports it unavailable.
// The guard's reply is a READONLY one, as Redis's own to a write on a
// replica, so go-redis drops the connection and retries on a new one: a
// client left on a demoted master reconnects (to the new master, behind
// Sentinel) rather than failing on its old connections.
func TestEmptyAfterFailoverRefusesAReplica(t *testing.T) {
	master, replica := redistest.Start(t), redistest.Start(t)
	var dials atomic.Int64
	c := redis.NewClient(&redis.Options{Addr: replica.Addr(), OnConnect: func(context.Context, *redis.Conn) error {
		dials.Add(1)
		return nil
	}})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second, EmptyAfterFailover: true})
	if err != nil {
		t.Fatal(err)
	}
	b := []fleetrate.Bucket{{Key: "r", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 5)}}}
	if _, err := s.Take(t.Context(), fleetrate.Request{Buckets: b, N: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := replica.Do("replicaof", "127.0.0.1", master.Port()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = replica.Do("replicaof", "no", "one") })
	before := dials.Load()
	_, err = s.Take(t.Context(), fleetrate.Request{Buckets: b, N: 1})
	if !errors.Is(err, fleetrate.ErrStoreUnavailable) {
		t.Fatalf("take on a replica: %v, want ErrStoreUnavailable", err)
	}
	if dials.Load() == before {
		t.Fatalf("the guard's refusal on a replica left go-redis on its connection (%d dials): it must read as READONLY, which go-redis reconnects on", dials.Load())
	}
	t.Logf("take on a replica: %v (%d dials)", err, dials.Load())
}

func TestEmptyAfterFailoverOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    redisstore.Client
		opts redisstore.Options
	}{
		{"Cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}), redisstore.Options{EmptyAfterFailover: true}},
		{"Ring", redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}}), redisstore.Options{EmptyAfterFailover: true}},
		{"NegativeWindow", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), redisstore.Options{EmptyAfterFailover: true, FailoverWindow: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := redisstore.New(tc.c, tc.opts); !errors.Is(err, fleetrate.ErrInvalid) {
				t.Errorf("New: %v, want ErrInvalid", err)
			}
		})
	}
}

// TestEmptyAfterFailoverHungRedisBoundsEveryDecision is
// TestHungRedisBoundsEveryDecision for the guarded store: its retries after
// a switch share the one timeout, so a frozen Redis still bounds every
// decision by the timeout plus the measured scheduling noise.
func TestEmptyAfterFailoverHungRedisBoundsEveryDecision(t *testing.T) {
	const timeout = 100 * time.Millisecond
	srv := redistest.Start(t)
	for _, m := range allModes {
		t.Run(m.name, func(t *testing.T) {
			c := redis.NewClient(redisstore.ClientOptions(&redis.Options{Addr: srv.Addr()}))
			t.Cleanup(func() { _ = c.Close() })
			opts := m.opts
			opts.Timeout, opts.EmptyAfterFailover = timeout, true
			s, err := redisstore.New(c, opts)
			if err != nil {
				t.Fatal(err)
			}
			worst, noise := hungTakes(t, srv, s, 32, 5*timeout, false)
			bound := timeout + schednoise.Allowance(noise, 50*time.Millisecond)
			t.Logf("slowest decision %v with a %v timeout (scheduling noise %v, bound %v)", worst, timeout, noise, bound)
			if worst > bound {
				t.Errorf("slowest decision on a hung Redis took %v, more than the %v timeout plus %v of measured scheduling noise", worst, timeout, bound-timeout)
			}
		})
	}
}

// TestEmptyAfterFailoverAfterWarm warms a store behind the failover guard
// (as fleetrate serve does for a Sentinel URL, and the docs advise after
// New), then takes through it and through a plain store of the same
// process: loading the scripts must leave every store's takes working.
// Loading them through redis.Script.Load set the shared script's hash to
// the guarded twin's, which every store then sent unguarded: each take
// failed with the guard's FLEETRATE_MASTER reply.
func TestEmptyAfterFailoverAfterWarm(t *testing.T) {
	srv := redistest.Start(t)
	sha := redisstore.TakeScriptSHA()
	newStore := func(opts redisstore.Options) *fleetrate.Limiter {
		t.Helper()
		c := redis.NewClient(redisstore.ClientOptions(&redis.Options{Addr: srv.Addr()}))
		t.Cleanup(func() { _ = c.Close() })
		opts.Timeout = 5 * time.Second
		s, err := redisstore.New(c, opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Warm(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := s.LoadScripts(t.Context()); err != nil {
			t.Fatal(err)
		}
		l, err := fleetrate.New(s, fleetrate.Config{Prefix: "warm:", Limits: []fleetrate.Limit{fleetrate.PerSecond(100, 100)}})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	guarded := newStore(redisstore.Options{EmptyAfterFailover: true})
	plain := newStore(redisstore.Options{})
	for i, l := range []*fleetrate.Limiter{guarded, plain, guarded} {
		for range 3 {
			if res, err := l.Allow(t.Context(), "k"); err != nil || !res.Allowed {
				t.Fatalf("store %d after Warm and LoadScripts: %+v, %v", i, res, err)
			}
		}
	}
	if got := redisstore.TakeScriptSHA(); got != sha {
		t.Fatalf("loading the scripts changed the take script's hash from %s to %s", sha, got)
	}
}

// TestNewRefusesATypedNilClient: a nil *redis.Client is refused as a nil
// one is, rather than panicking on the first call.
func TestNewRefusesATypedNilClient(t *testing.T) {
	if _, err := redisstore.New((*redis.Client)(nil), redisstore.Options{}); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "client must not be nil") {
		t.Fatalf("New with a nil *redis.Client: %v, want ErrInvalid", err)
	}
}
