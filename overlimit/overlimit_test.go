package overlimit_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/manualclock"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/overlimit"
	"github.com/fleetrate/fleetrate/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(*testing.T) fleetrate.Store {
		return approximate{overlimit.New(memstore.New(memstore.Options{}), overlimit.Options{})}
	})
}

// approximate tells the conformance suite that a denial may come from the
// cache, with a retry-after that is a lower bound of the store's.
type approximate struct{ *overlimit.Store }

func (approximate) ApproximateDenials() {}

// counting counts the takes that reach the store.
type counting struct {
	fleetrate.Store
	takes atomic.Int64
}

func (c *counting) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	c.takes.Add(1)
	return c.Store.Take(ctx, req)
}

func one(key string, n int64, maxWait time.Duration, reserve int64, limits ...fleetrate.Limit) fleetrate.Request {
	return fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: key, Limits: limits, Reserve: reserve}}, N: n, MaxWait: maxWait}
}

// TestHotOverLimitKeySkipsTheStore: once the store denies a key, takes of
// it go no further than the cache until the store's retry-after has
// passed; then the store decides again, and grants.
func TestHotOverLimitKeySkipsTheStore(t *testing.T) {
	t.Parallel()
	clk := manualclock.New(time.Unix(1_700_000_000, 0))
	inner := &counting{Store: memstore.New(memstore.Options{Clock: clk.Now})}
	s := overlimit.New(inner, overlimit.Options{Clock: clk.Now})
	ctx := context.Background()
	lim := fleetrate.PerSecond(10, 2) // a token every 100 ms
	take := func() fleetrate.Result {
		t.Helper()
		res, err := s.Take(ctx, one("hot", 1, 0, 0, lim))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	take()
	take()
	first := take()
	if first.Allowed || first.RetryAfter != 100*time.Millisecond || first.NextToken != 100*time.Millisecond {
		t.Fatalf("third take: %+v, want denied for 100ms, the next token 100ms away", first)
	}
	for i := range 1000 {
		clk.Advance(50 * time.Microsecond) // 50 ms in all
		left := 100*time.Millisecond - time.Duration(i+1)*50*time.Microsecond
		if res := take(); res.Allowed || res.RetryAfter != left || res.NextToken != left {
			t.Fatalf("take %d from the cache: %+v", i, res)
		}
	}
	if got := inner.takes.Load(); got != 3 {
		t.Fatalf("%d takes reached the store, want 3 (the cache answered the 1000 others)", got)
	}
	if st := s.Stats(); st.Hits != 1000 || st.Misses != 3 || st.Entries != 1 {
		t.Fatalf("stats %+v, want 1000 hits, 3 misses, 1 entry", st)
	}
	clk.Advance(50 * time.Millisecond) // the token is back
	if res := take(); !res.Allowed {
		t.Fatalf("take once the retry-after has passed: %+v, want granted by the store", res)
	}
	if got := inner.takes.Load(); got != 4 {
		t.Fatalf("%d takes reached the store, want 4", got)
	}
}

// TestCacheAnswersOnlyWhatItKnows: a smaller cost, a smaller reserve,
// other limits, a peek, or a max wait reaching past the denial's end go to
// the store.
func TestCacheAnswersOnlyWhatItKnows(t *testing.T) {
	t.Parallel()
	clk := manualclock.New(time.Unix(1_700_000_000, 0))
	inner := &counting{Store: memstore.New(memstore.Options{Clock: clk.Now})}
	s := overlimit.New(inner, overlimit.Options{Clock: clk.Now})
	ctx := context.Background()
	lim := fleetrate.PerSecond(10, 4)
	if res, _ := s.Take(ctx, one("k", 3, 0, 0, lim)); !res.Allowed {
		t.Fatal("first take denied")
	}
	if res, _ := s.Take(ctx, one("k", 3, 0, 0, lim)); res.Allowed { // 1 left: denied for 200 ms, cached
		t.Fatal("second take of 3 granted")
	}
	before := inner.takes.Load()
	for _, c := range []struct {
		name    string
		req     fleetrate.Request
		cached  bool
		allowed bool
	}{
		{"same cost", one("k", 3, 0, 0, lim), true, false},
		{"larger cost", one("k", 4, 0, 0, lim), true, false},
		{"cost 2 plus a reserve of 1", one("k", 2, 0, 1, lim), true, false},
		{"max wait short of the end", one("k", 3, 150*time.Millisecond, 0, lim), true, false},
		{"smaller cost", one("k", 1, 0, 0, lim), false, true},
		{"peek", one("k", 0, 0, 0, lim), false, true},
		{"max wait past the end", one("k", 3, 300*time.Millisecond, 0, lim), false, true},
		{"other limits", one("k", 3, 0, 0, fleetrate.PerSecond(10, 40)), false, true},
	} {
		res, err := s.Take(ctx, c.req)
		if err != nil {
			t.Fatal(err)
		}
		after := inner.takes.Load()
		if cached := after == before; cached != c.cached || res.Allowed != c.allowed {
			t.Errorf("%s: cached %v allowed %v, want cached %v allowed %v (%+v)", c.name, cached, res.Allowed, c.cached, c.allowed, res)
		}
		before = after
		// Undo grants, so that every case sees the same bucket.
		if res.Allowed && c.req.N > 0 {
			if err := inner.Store.Reset(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			if _, err := inner.Store.Take(ctx, one("k", 3, 0, 0, lim)); err != nil {
				t.Fatal(err)
			}
			before = inner.takes.Load()
		}
	}
}

// TestNeverGrantsMoreThanTheStore drives a cached store and a bare one,
// on one manual clock, with the same random takes (costs, reserves, max
// waits, several buckets), refunds, cancels, drains and resets on a few
// hot keys: every decision is the same, so the cache never grants what
// the store would refuse, and, when everything goes through it, never
// refuses what the store would grant. It also answers some of them.
func TestNeverGrantsMoreThanTheStore(t *testing.T) {
	t.Parallel()
	clk := manualclock.New(time.Unix(1_700_000_000, 0))
	cached := overlimit.New(memstore.New(memstore.Options{Clock: clk.Now}), overlimit.Options{Clock: clk.Now, MaxBytes: 4096})
	bare := memstore.New(memstore.Options{Clock: clk.Now})
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	limits := [][]fleetrate.Limit{
		{fleetrate.PerSecond(100, 5)},
		{fleetrate.PerSecond(300, 3), fleetrate.PerSecond(20, 8)},
	}
	bucket := func() fleetrate.Bucket {
		k := rng.IntN(6)
		return fleetrate.Bucket{Prefix: "p:", Key: strconv.Itoa(k), Limits: limits[k%2]}
	}
	type booked struct {
		bs []fleetrate.Bucket
		n  int64
		b  fleetrate.Booking
	}
	var bookings []booked
	for step := range 20_000 {
		clk.Advance(time.Duration(rng.IntN(3000)) * time.Microsecond)
		bs := []fleetrate.Bucket{bucket()}
		if rng.IntN(5) == 0 {
			if b := bucket(); b.Key != bs[0].Key {
				bs = append(bs, b)
			}
		}
		switch op := rng.IntN(20); {
		case op < 16:
			req := fleetrate.Request{Buckets: bs, N: rng.Int64N(4)}
			if rng.IntN(4) == 0 {
				req.MaxWait = time.Duration(rng.IntN(30)) * time.Millisecond
			}
			if rng.IntN(4) == 0 {
				bs[0].Reserve = min(rng.Int64N(3), 2-req.N)
				bs[0].Reserve = max(bs[0].Reserve, 0)
			}
			var bk1, bk2 fleetrate.Booking
			if req.MaxWait > 0 {
				req.Booking = &bk1
			}
			got, err := cached.Take(ctx, req)
			if req.MaxWait > 0 {
				req.Booking = &bk2
			}
			want, err2 := bare.Take(ctx, req)
			if (err == nil) != (err2 == nil) {
				t.Fatalf("step %d: errors %v and %v", step, err, err2)
			}
			if err != nil {
				continue
			}
			if got.Allowed != want.Allowed || got.Allowed && !reflect.DeepEqual(got, want) {
				t.Fatalf("step %d: %+v\ncached store: %+v\nstore:        %+v", step, req, got, want)
			}
			if got.Allowed && req.N > 0 && req.MaxWait > 0 {
				bookings = append(bookings, booked{bs, req.N, bk1})
			}
		case op < 17:
			n := rng.Int64N(3)
			at := time.Now()
			if err := cached.Refund(ctx, bs, n, at); err != nil {
				t.Fatal(err)
			}
			if err := bare.Refund(ctx, bs, n, at); err != nil {
				t.Fatal(err)
			}
		case op < 18 && len(bookings) > 0:
			i := rng.IntN(len(bookings))
			b := bookings[i]
			bookings = append(bookings[:i], bookings[i+1:]...)
			if err := cached.Cancel(ctx, b.bs, b.n, b.b); err != nil {
				t.Fatal(err)
			}
			if err := bare.Cancel(ctx, b.bs, b.n, b.b); err != nil {
				t.Fatal(err)
			}
		case op < 19:
			d := time.Duration(rng.IntN(20)) * time.Millisecond
			if err := cached.Drain(ctx, bs, d); err != nil {
				t.Fatal(err)
			}
			if err := bare.Drain(ctx, bs, d); err != nil {
				t.Fatal(err)
			}
		default:
			if err := cached.Reset(ctx, bs[0].StoreKey()); err != nil {
				t.Fatal(err)
			}
			if err := bare.Reset(ctx, bs[0].StoreKey()); err != nil {
				t.Fatal(err)
			}
		}
	}
	st := cached.Stats()
	t.Logf("stats %+v", st)
	if st.Hits < 1000 {
		t.Errorf("stats %+v: the cache answered fewer than 1000 takes of 20,000 on 6 hot keys", st)
	}
}

// TestRefundByAnotherProcessIsNotSeen states the cache's one difference:
// tokens given back by another process (here, another cache over the
// same store) are not seen until the cached denial ends. The take is
// denied that the store would now grant: conservative, never more.
func TestRefundByAnotherProcessIsNotSeen(t *testing.T) {
	t.Parallel()
	clk := manualclock.New(time.Unix(1_700_000_000, 0))
	shared := memstore.New(memstore.Options{Clock: clk.Now})
	a := overlimit.New(shared, overlimit.Options{Clock: clk.Now})
	b := overlimit.New(shared, overlimit.Options{Clock: clk.Now})
	ctx := context.Background()
	lim := fleetrate.Every(time.Minute, 1)
	req := one("k", 1, 0, 0, lim)
	first, _ := a.Take(ctx, req)
	if !first.Allowed {
		t.Fatal("first take denied")
	}
	if res, _ := a.Take(ctx, req); res.Allowed {
		t.Fatal("second take granted") // and cached in a for a minute
	}
	if err := b.Refund(ctx, req.Buckets, 1, first.At); err != nil {
		t.Fatal(err)
	}
	if res, _ := shared.Take(ctx, one("k", 0, 0, 0, lim)); !res.Allowed {
		t.Fatal("the store itself does not have the refunded token")
	}
	if res, _ := a.Take(ctx, req); res.Allowed {
		t.Fatal("a saw the other process's refund: it should not (it was to answer from its cache)")
	}
	if err := a.Refund(ctx, req.Buckets, 0, first.At); err != nil { // a's own refund: forgets the denial
		t.Fatal(err)
	}
	if res, _ := a.Take(ctx, req); !res.Allowed {
		t.Fatal("after a refund through a, its take still denied")
	}
}

// TestBoundedInBytes floods the cache with denials of distinct long keys:
// it holds at most MaxBytes.
func TestBoundedInBytes(t *testing.T) {
	t.Parallel()
	const maxBytes = 64 << 10
	s := overlimit.New(memstore.New(memstore.Options{}), overlimit.Options{MaxBytes: maxBytes})
	ctx := context.Background()
	lim := fleetrate.Every(time.Hour, 1)
	pad := strings.Repeat("x", 500)
	for i := range 5000 {
		req := one(pad+strconv.Itoa(i), 1, 0, 0, lim)
		for range 2 { // a grant, then a denial to cache
			if _, err := s.Take(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
	}
	st := s.Stats()
	if st.Bytes > maxBytes || st.Entries == 0 {
		t.Fatalf("stats %+v after 5,000 denials of 500-byte keys, want at most %d bytes", st, maxBytes)
	}
}

// TestNilStoreIsAnError: New has no error to return, so a nil store
// answers every call with an error wrapping ErrInvalid, never a panic.
func TestNilStoreIsAnError(t *testing.T) {
	s := overlimit.New(nil, overlimit.Options{})
	ctx := context.Background()
	if _, err := s.Take(ctx, one("k", 1, 0, 0, fleetrate.PerSecond(1, 1))); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "nil") {
		t.Fatalf("Take over a nil store: %v, want ErrInvalid naming it", err)
	}
	if err := s.Reset(ctx, "k"); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Fatalf("Reset over a nil store: %v", err)
	}
}
