package memstore_test

import (
	"context"
	"strconv"
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
