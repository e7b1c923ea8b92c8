package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/storetest"
)

// TestSentinelConformance runs the conformance suite on a Sentinel-managed
// master through go-redis failover clients, behind the failover guard
// (EmptyAfterFailover, their default), one take per call and batched.
func TestSentinelConformance(t *testing.T) {
	sn := redistest.StartSentinel(t)
	for _, m := range []struct {
		name string
		opts redisstore.Options
	}{
		{"Unbatched", redisstore.Options{Timeout: 5 * time.Second, Unbatched: true}},
		{"Batch", redisstore.Options{Timeout: 5 * time.Second, Batch: true}},
	} {
		t.Run(m.name, func(t *testing.T) {
			s, err := redisstore.New(sn.FailoverClient(), m.opts)
			if err != nil {
				t.Fatal(err)
			}
			storetest.Run(t, func(*testing.T) fleetrate.Store { return s })
		})
	}
}

// bound is a bucket of in-flight bound n whose rate never binds.
func bound(key string, n int64) fleetrate.Bucket {
	return fleetrate.Bucket{Key: key, Limits: []fleetrate.Limit{fleetrate.PerSecond(1e6, 1e6)}, InFlight: n}
}

// acquire takes a token and a permit for id, waiting up to maxWait.
func acquire(ctx context.Context, t *testing.T, s fleetrate.Store, b fleetrate.Bucket, id string, maxWait time.Duration) fleetrate.Result {
	t.Helper()
	res, err := s.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1, MaxWait: maxWait, Permit: fleetrate.Permit{ID: id, TTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// receive waits for a notice on ch, failing the test after 10 s (a
// bound for a loaded machine, not a timing assertion).
func receive(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no notice within 10 s", what)
	}
}

// TestPermitNoticeWakesOnlyItsWaiter runs two stores on one Redis, as two
// processes: the one whose waiter is first in the queue gets the notice of
// a release made by the other, and a waiter behind it gets none. Notices
// come in order on the one subscription, so a later notice to another
// waiter proves the first reached its process.
func TestPermitNoticeWakesOnlyItsWaiter(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	holder, err := redisstore.New(redis.NewClient(&redis.Options{Addr: srv.Addr()}), redisstore.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	waiters, err := redisstore.New(redis.NewClient(&redis.Options{Addr: srv.Addr()}), redisstore.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a := bound("notice/a", 1)
	second, stop := noticeWakesOnlyItsWaiter(t, holder, waiters, a, bound("notice/z", 1))
	defer stop()

	// A subscription that Redis drops is made again, and its confirmation
	// wakes the waiters: a notice published meanwhile is not lost for good.
	if err := srv.Client().Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	receive(t, second, "the waiter, after the subscription was made again")
	if _, err := waiters.Release(ctx, []fleetrate.Bucket{a}, "first"); err != nil {
		t.Fatal(err)
	}
	receive(t, second, "the second waiter, after the first released")
}

// noticeWakesOnlyItsWaiter is TestPermitNoticeWakesOnlyItsWaiter on two
// stores (two processes) of any client, with buckets a and z of bound 1:
// the holder (store holder) releases a permit of each, and of the two
// waiters queued on a (store waiters), only the first is woken; the
// waiter on z proves the notices arrived. It leaves "first" holding a
// permit of a and returns the second waiter's channel, and a function
// that stops the notifications.
func noticeWakesOnlyItsWaiter(t *testing.T, holder, waiters *redisstore.Store, a, z fleetrate.Bucket) (<-chan struct{}, func()) {
	ctx := context.Background()
	for _, b := range []fleetrate.Bucket{a, z} {
		if res := acquire(ctx, t, holder, b, "h", 0); !res.Allowed {
			t.Fatalf("holder: %+v", res)
		}
	}
	for _, id := range []string{"first", "second"} {
		if res := acquire(ctx, t, waiters, a, id, time.Minute); !res.InFlight.Queued {
			t.Fatalf("waiter %s: %+v, want queued", id, res)
		}
	}
	if res := acquire(ctx, t, waiters, z, "other", time.Minute); !res.InFlight.Queued {
		t.Fatalf("waiter on z: %+v, want queued", res)
	}
	first, stop1 := waiters.NotifyPermit(a.StoreKey(), "first")
	defer stop1()
	second, stop2 := waiters.NotifyPermit(a.StoreKey(), "second")
	other, stop3 := waiters.NotifyPermit(z.StoreKey(), "other")
	defer stop3()
	// Redis confirming the subscription wakes every waiter once (a notice
	// may have been lost before it).
	receive(t, first, "the subscription's confirmation")
	receive(t, second, "the subscription's confirmation")
	receive(t, other, "the subscription's confirmation")

	if held, err := holder.Release(ctx, []fleetrate.Bucket{a}, "h"); err != nil || held != 1 {
		t.Fatalf("Release = %d, %v", held, err)
	}
	if held, err := holder.Release(ctx, []fleetrate.Bucket{z}, "h"); err != nil || held != 1 {
		t.Fatalf("Release = %d, %v", held, err)
	}
	receive(t, first, "the first waiter, after the release")
	receive(t, other, "the waiter on z, after the release of z")
	select {
	case <-second:
		t.Fatal("the second waiter was woken by a release that freed one permit, which is the first's")
	default:
	}
	if res := acquire(ctx, t, waiters, a, "first", time.Minute); !res.Allowed {
		t.Fatalf("the woken waiter: %+v, want granted", res)
	}
	return second, stop2
}

// TestPermitsFilledAfterFailover restarts Redis without its data (a new
// master, as after a failover) while a permit is held. With
// EmptyAfterFailover the bucket admits nobody new until the held lease
// could have ended, and the holder renewing keeps its permit; without it,
// the new master admits another holder at once.
func TestPermitsFilledAfterFailover(t *testing.T) {
	srv := redistest.Start(t)
	for _, empty := range []bool{true, false} {
		t.Run(map[bool]string{true: "EmptyAfterFailover", false: "KeepAfterFailover"}[empty], func(t *testing.T) {
			ctx := context.Background()
			if err := srv.Client().FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			c := redis.NewClient(redisstore.ClientOptions(&redis.Options{Addr: srv.Addr()}))
			t.Cleanup(func() { _ = c.Close() })
			s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second, EmptyAfterFailover: empty, KeepAfterFailover: !empty})
			if err != nil {
				t.Fatal(err)
			}
			b := bound("failover/permits", 1)
			if res := acquire(ctx, t, s, b, "holder", 0); !res.Allowed {
				t.Fatalf("holder: %+v", res)
			}
			srv.Kill()
			srv.Restart()
			res := acquire(ctx, t, s, b, "late", 0)
			if !empty {
				if !res.Allowed {
					t.Fatalf("without EmptyAfterFailover, the new master: %+v, want the permit granted again (the weakness documented)", res)
				}
				return
			}
			if res.Allowed || res.InFlight.Held != 1 || res.RetryAfter < 50*time.Second || res.RetryAfter > time.Minute+2*time.Second {
				t.Fatalf("a take on the new master: %+v, want denied, the permit counted held for the lease (1 min) plus 1 s", res)
			}
			p := fleetrate.Permit{ID: "holder", TTL: time.Minute}
			if held, err := s.Renew(ctx, []fleetrate.Bucket{b}, p); err != nil || held != 1 {
				t.Fatalf("the holder renewing on the new master: %d, %v, want 1 (taken back)", held, err)
			}
			if held, err := s.Release(ctx, []fleetrate.Bucket{b}, "holder"); err != nil || held != 1 {
				t.Fatalf("the holder releasing: %d, %v, want 1", held, err)
			}
			if res := acquire(ctx, t, s, b, "late", 0); res.Allowed {
				t.Fatalf("a take after the holder released, while the fill lasts: %+v, want denied", res)
			}
		})
	}
}

// clusterNotices runs noticeWakesOnlyItsWaiter on a Cluster, with two
// cluster clients as two processes would have. The buckets share a hash
// tag, so that both releases publish from one master, in order: a Cluster
// forwards each master's messages to the subscriber's node in order, not
// those of two masters.
func clusterNotices(t *testing.T, cl *redistest.Cluster) {
	stores := make([]*redisstore.Store, 2)
	for i := range stores {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		stores[i] = s
	}
	_, stop := noticeWakesOnlyItsWaiter(t, stores[0], stores[1], bound("notice/{n}/a", 1), bound("notice/{n}/z", 1))
	stop()
}

// permitKeysShareTheSlot checks on a Cluster that a bucket's permits live
// on its hash slot (the slot counts them), with or without a hash tag,
// and that a key that cannot have them there is refused, named.
func permitKeysShareTheSlot(t *testing.T, cl *redistest.Cluster, s *redisstore.Store) {
	ctx := context.Background()
	for _, key := range []string{"permits/plain", "permits/{tag}:x", "permits/a{b"} {
		b := bound(key, 2)
		slot := redisstore.Slot(key)
		count := func() int64 {
			t.Helper()
			n, err := cl.Client().ClusterCountKeysInSlot(ctx, slot).Result()
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := count()
		if res := acquire(ctx, t, s, b, "a", 0); !res.Allowed {
			t.Fatalf("%s: %+v", key, res)
		}
		// The bucket and its held permits.
		if n := count(); n != before+2 {
			t.Errorf("%s: slot %d holds %d keys after a take with a permit, want %d (the bucket and its permits)", key, slot, n, before+2)
		}
		if err := s.Reset(ctx, key); err != nil {
			t.Fatal(err)
		}
		if n := count(); n != before {
			t.Errorf("%s: slot %d holds %d keys after Reset, want %d", key, slot, n, before)
		}
	}
	_, err := s.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{bound("permits/a}b", 1)}, N: 1, Permit: fleetrate.Permit{ID: "a", TTL: time.Minute}})
	if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), `"permits/a}b"`) || !strings.Contains(err.Error(), "hash tag") {
		t.Errorf("a key with a \"}\" and no hash tag: %v, want ErrInvalid naming it and asking for a hash tag", err)
	}
}
