package redisstore_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
)

var sentinelKill = flag.Bool("sentinel.kill", false, "TestSentinelOvershootFigures: kill -9 the master instead of SENTINEL FAILOVER")

// sentinelFault forces the master of sn to change: SENTINEL FAILOVER, or
// with -sentinel.kill a kill -9 of the master, after which the Sentinels
// elect the replica once it has been down SentinelDownAfter. It returns
// the new master's address once every Sentinel reports it.
func sentinelFault(sn *redistest.Sentinel) (string, error) {
	if !*sentinelKill {
		return sn.Failover()
	}
	old, err := sn.MasterAddr()
	if err != nil {
		return "", err
	}
	sn.Server(old).Kill()
	deadline := time.Now().Add(redistest.SentinelDownAfter + 30*time.Second)
	for time.Now().Before(deadline) {
		if addr, err := sn.MasterAddr(); err == nil && addr != old {
			return addr, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "", fmt.Errorf("no new master within %v of killing %s", redistest.SentinelDownAfter+30*time.Second, old)
}

// TestSentinelFailoverOnDefaults runs the fleet of TestSentinelFailoverDuringFleet
// (4 failover clients × 16 waiters at 200/s burst 40) through a SENTINEL
// FAILOVER on the store's defaults, Options{}: a failover client gets
// EmptyAfterFailover without asking, so the fleet stays within the bound
// that test asserts with the option set.
func TestSentinelFailoverOnDefaults(t *testing.T) {
	sn := redistest.StartSentinel(t)
	over, nerr, window, first := sentinelOvershoot(t, sn, redisstore.Options{})
	t.Logf("on defaults: %+.1f tokens over burst + rate × T (burst 40); %d errors over %v, first %v", over, nerr, window.Round(time.Millisecond), first)
	// Measured on defaults, 2-core machine shared by six sessions: see
	// docs/OPERATIONS.md (Sentinel). Without the guard the same run took
	// +87. The bound is one burst, as TestSentinelFailoverDuringFleet's.
	if over > 40 {
		t.Errorf("%+.1f tokens over burst + rate × T on defaults, want at most one burst (40)", over)
	}
}

// TestRestartOnDefaults empties a bucket, restarts Redis without its data
// and takes again on the store's defaults: the bucket is still empty (the
// store saw the new master's replication ID and emptied the bucket before
// its first take there), where with KeepAfterFailover the restarted Redis
// grants a full burst.
func TestRestartOnDefaults(t *testing.T) {
	lim := fleetrate.Limit{Name: "slow", Rate: 0.1, Burst: 10}
	for _, tc := range []struct {
		name    string
		opts    redisstore.Options
		allowed bool
	}{
		{"defaults", redisstore.Options{Timeout: 2 * time.Second}, false},
		{"KeepAfterFailover", redisstore.Options{Timeout: 2 * time.Second, KeepAfterFailover: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := redistest.Start(t)
			c := redis.NewClient(&redis.Options{Addr: rs.Addr(), MaxRetries: -1})
			defer c.Close()
			s, err := redisstore.New(c, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Prefix: "t:", Key: "restart", Limits: []fleetrate.Limit{lim}}}, N: 10}
			if res, err := s.Take(context.Background(), req); err != nil || !res.Allowed {
				t.Fatalf("first take: %+v, %v", res, err)
			}
			rs.Kill()
			rs.Restart()
			req.N = 1
			var res fleetrate.Result
			for try := 0; ; try++ {
				// The connections of before the restart fail first.
				if res, err = s.Take(context.Background(), req); err == nil {
					break
				}
				if try == 20 || !errors.Is(err, fleetrate.ErrStoreUnavailable) && try > 3 {
					t.Fatalf("take after the restart: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if res.Allowed != tc.allowed {
				t.Errorf("take of 1 after the restart: allowed %v, want %v", res.Allowed, tc.allowed)
			}
		})
	}
}
