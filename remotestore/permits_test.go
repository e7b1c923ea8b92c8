package remotestore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/remotestore"
)

// TestSettleOnceWithAWorkerToken: a worker's token (decide and store, no
// admin) settles a grant through the Limiter once; the store's second
// settle of it has no grant left and is refused, naming why.
func TestSettleOnceWithAWorkerToken(t *testing.T) {
	t.Parallel()
	url := serve(t, "w0rker")
	store := newStore(t, url, remotestore.Options{Token: "w0rker", Timeout: 10 * time.Second})
	lim, err := fleetrate.New(store, fleetrate.Config{Buckets: []fleetrate.BucketConfig{
		{Name: "{llm}/requests", Limits: []fleetrate.Limit{fleetrate.PerPeriod(600, time.Hour)}},
		{Name: "{llm}/tokens", Limits: []fleetrate.Limit{fleetrate.PerPeriod(100000, time.Hour)}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r, err := lim.AllowCosts(ctx, fleetrate.Cost{Bucket: "{llm}/requests", N: 1}, fleetrate.Cost{Bucket: "{llm}/tokens", N: 60000})
	if err != nil || !r.Result.Allowed {
		t.Fatalf("AllowCosts: %+v, %v", r, err)
	}
	if err := r.Settle(ctx, fleetrate.Cost{Bucket: "{llm}/requests", N: 1}, fleetrate.Cost{Bucket: "{llm}/tokens", N: 1000}); err != nil {
		t.Fatalf("Settle with the grant: %v", err)
	}
	peek, err := lim.AllowCosts(ctx, fleetrate.Cost{Bucket: "{llm}/tokens", N: 0})
	if err != nil || peek.Result.Remaining < 98999 {
		t.Fatalf("after settling 60000 to 1000: %+v, %v, want 99000 left", peek, err)
	}
	bs := []fleetrate.Bucket{
		{Prefix: "fleetrate:", Key: "{llm}/requests", Limits: []fleetrate.Limit{fleetrate.PerPeriod(600, time.Hour)}},
		{Prefix: "fleetrate:", Key: "{llm}/tokens", Limits: []fleetrate.Limit{fleetrate.PerPeriod(100000, time.Hour)}},
	}
	st := fleetrate.Settlement{Costs: []int64{1, 60000}, Actual: []int64{1, 0}, At: r.Result.At.Add(r.Result.Wait)}
	err = store.Settle(ctx, bs, st)
	if err == nil || !strings.Contains(err.Error(), "grant_required") {
		t.Fatalf("a second settle of the grant: %v, want refused (grant_required: the grant was spent)", err)
	}
}

// TestAcquireThroughTheService: a Limiter over remotestore holds at most
// the bound's permits across two Stores, and a waiter is woken by the
// service (PermitNotifier over /v1/store/notify) when the holder releases.
func TestAcquireThroughTheService(t *testing.T) {
	t.Parallel()
	url := serve(t)
	cfg := fleetrate.Config{Buckets: []fleetrate.BucketConfig{
		{Name: "{api}/calls", Limits: []fleetrate.Limit{fleetrate.PerSecond(1000, 1000)}, InFlight: 1},
	}, PermitTTL: time.Minute, MaxWait: 30 * time.Second}
	holder, err := fleetrate.New(newStore(t, url, remotestore.Options{Timeout: 10 * time.Second}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := fleetrate.New(newStore(t, url, remotestore.Options{Timeout: 10 * time.Second}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	held, err := holder.Acquire(ctx, "{api}/calls")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := waiter.TryAcquire(ctx, "{api}/calls"); err != nil || r.Result.Allowed {
		t.Fatalf("TryAcquire beyond the bound: %+v, %v, want denied", r, err)
	}
	got := make(chan error, 1)
	go func() {
		r, err := waiter.Acquire(ctx, "{api}/calls")
		if err == nil {
			err = r.Release(ctx)
		}
		got <- err
	}()
	// Whether the waiter has queued yet or not, the release lets it
	// through: queued, the service wakes it (its own timer, a third of the
	// one-minute lease, would take 20 s); not yet, it finds the permit free.
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("the waiter was not woken by the release within 15 s (its timer would take 20 s)")
	}
}

// TestNotifyPermitStream: NotifyPermit returns once the service has
// registered the waiter; its channel receives once then (a release
// before the registration would otherwise be missed), and again when the
// holder releases through another Store.
func TestNotifyPermitStream(t *testing.T) {
	t.Parallel()
	url := serve(t)
	a := newStore(t, url, remotestore.Options{Timeout: 10 * time.Second})
	b := newStore(t, url, remotestore.Options{Timeout: 10 * time.Second})
	ctx := context.Background()
	bs := []fleetrate.Bucket{{Prefix: "fleetrate:", Key: "notify", Limits: []fleetrate.Limit{fleetrate.PerSecond(1000, 1000)}, InFlight: 1}}
	take := func(s *remotestore.Store, id string, wait time.Duration) fleetrate.Result {
		t.Helper()
		res, err := s.Take(ctx, fleetrate.Request{Buckets: bs, N: 1, MaxWait: wait, Permit: fleetrate.Permit{ID: id, TTL: time.Minute}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := take(a, "holder", 0); !res.Allowed {
		t.Fatalf("holder: %+v", res)
	}
	if res := take(b, "waiter", time.Second); res.Allowed || !res.InFlight.Queued {
		t.Fatalf("waiter: %+v, want queued", res)
	}
	ch, stop := b.NotifyPermit(bs[0].StoreKey(), "waiter")
	defer stop()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no notice once the waiter was registered")
	}
	if _, err := a.Release(ctx, bs, "holder"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no notice within 10 s of the holder's release")
	}
	if res := take(b, "waiter", time.Second); !res.Allowed {
		t.Fatalf("the woken waiter: %+v, want the permit", res)
	}
}
