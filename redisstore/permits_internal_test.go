package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

// TestPermitKeysNaming pins how a bucket key names its permit keys, and
// that a Cluster refuses a key whose permits could not share its slot.
func TestPermitKeysNaming(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		key, base string
		refused   bool // on a Cluster
	}{
		{"api:user1", "api:user1{api:user1}", false},
		{"{cred}:tokens", "{cred}:tokens", false},
		{"a{b", "a{a{b}", false},
		{"x{}y{z}", "x{}y{z}", true}, // the first tag is empty: Redis hashes the whole key
		{"a}b", "a}b", true},
		{"{}x", "{}x", true},
	} {
		base, err := permitBase(tc.key, false)
		if err != nil || base != tc.base && !tc.refused {
			t.Errorf("permitBase(%q) = %q, %v, want %q", tc.key, base, err, tc.base)
		}
		_, err = permitBase(tc.key, true)
		if tc.refused != (err != nil) {
			t.Errorf("permitBase(%q) on a Cluster: %v, want refused=%v", tc.key, err, tc.refused)
		}
		if err != nil && (!errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), "hash tag")) {
			t.Errorf("refusal of %q: %v, want ErrInvalid naming the key and asking for a hash tag", tc.key, err)
		}
		if err == nil && !strings.HasPrefix(base, strings.SplitN(tc.key, "{", 2)[0]) {
			t.Errorf("permit keys of %q start %q: not with the key's prefix, which ACL patterns name", tc.key, base)
		}
		if err == nil && Slot(base+heldSuffix) != Slot(tc.key) {
			t.Errorf("permit keys of %q on slot %d, the bucket on %d", tc.key, Slot(base+heldSuffix), Slot(tc.key))
		}
	}
}

// FuzzPermitKeys checks that every key's permit keys share its Cluster
// slot, or that the key is refused on a Cluster.
func FuzzPermitKeys(f *testing.F) {
	for _, s := range []string{"", "{", "}", "{}", "a{b}c", "{{}}", "a}b{c}", "fleetrate:{booking_com}/availability"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		base, err := permitBase(key, true)
		if err != nil {
			if key != "" && !strings.Contains(key, "}") {
				t.Fatalf("%q refused without a \"}\": %v", key, err)
			}
			return
		}
		if !strings.HasPrefix(base, strings.SplitN(key, "{", 2)[0]) {
			t.Fatalf("permit keys of %q start %q, not with its part before any \"{\"", key, base)
		}
		for _, sfx := range []string{heldSuffix, queueSuffix, leasesSuffix} {
			if Slot(base+sfx) != Slot(key) {
				t.Fatalf("permit key %q on slot %d, bucket %q on %d", base+sfx, Slot(base+sfx), key, Slot(key))
			}
		}
	})
}

// FuzzPermitReply feeds the replay of the extended take script any reply:
// it must answer a decision or an error, never panic.
func FuzzPermitReply(f *testing.F) {
	f.Add(int64(1e15), int64(1), int64(0), int64(2), int64(0), int64(-1), int64(0), int64(1e15+5), int64(0), int64(0), int64(1))
	f.Add(int64(1e15), int64(1), int64(5), int64(1<<20), int64(1), int64(3), int64(2), int64(0), int64(1e15+9), int64(1), int64(2))
	f.Fuzz(func(t *testing.T, now, made, debt, held, mine, place, qlen, first, qfirst, eligible, decision int64) {
		b := fleetrate.Bucket{Key: "k", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}, InFlight: 2}
		req := fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1, MaxWait: time.Second, Permit: fleetrate.Permit{ID: "me", TTL: time.Minute}}
		reply := []int64{now, made, debt, held, mine, place, qlen % 1000, first, qfirst, eligible, decision}
		res, err := decodeExt(req, reply)
		if err == nil && res.InFlight.Bound != 2 {
			t.Fatalf("reply %v decoded to %+v", reply, res)
		}
	})
}

// TestPermitKeysLiveUntilTheLastLease checks the TTL of the permit keys:
// the last lease they hold, plus slack, and that Reset deletes them.
func TestPermitKeysLiveUntilTheLastLease(t *testing.T) {
	srv := redistest.Start(t)
	s, err := New(srv.Client(), Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b := fleetrate.Bucket{Key: "ttl", Limits: []fleetrate.Limit{fleetrate.PerSecond(1000, 1000)}, InFlight: 1}
	take := func(id string, ttl time.Duration, maxWait time.Duration) fleetrate.Result {
		t.Helper()
		res, err := s.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1, MaxWait: maxWait, Permit: fleetrate.Permit{ID: id, TTL: ttl}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := take("a", time.Minute, 0); !res.Allowed {
		t.Fatalf("first permit: %+v", res)
	}
	if res := take("b", 2*time.Minute, time.Second); !res.InFlight.Queued {
		t.Fatalf("a waiter: %+v, want queued", res)
	}
	h, q, w, err := s.permitKeys(b.StoreKey())
	if err != nil {
		t.Fatal(err)
	}
	for key, lease := range map[string]time.Duration{h: time.Minute, q: 2 * time.Minute, w: 2 * time.Minute} {
		ttl, err := srv.Client().PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		// The lease from the take's instant, plus 1 s of slack, less the
		// time since (a loaded machine may take seconds).
		if ttl > lease+time.Second || ttl < lease-10*time.Second {
			t.Errorf("PTTL %s = %v, want the lease of %v plus 1 s of slack", key, ttl, lease)
		}
	}
	if err := s.Reset(ctx, b.StoreKey()); err != nil {
		t.Fatal(err)
	}
	if n, err := srv.Client().Exists(ctx, b.StoreKey(), h, q, w).Result(); err != nil || n != 0 {
		t.Fatalf("after Reset, %d of the bucket's keys exist (%v)", n, err)
	}
}
