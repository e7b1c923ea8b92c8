package lease_test

import (
	"context"
	"testing"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/lease"
	"github.com/fleetrate/fleetrate/memstore"
)

// BenchmarkTake measures a hot bucket's Allow through a lease store over
// the in-memory store: "leased" is served from leases of 100 tokens (one
// store call per 100 takes), "lean" from a bucket that refuses every lease
// (one store call per take, the lease store's own cost on top), each by
// one caller and by parallel callers contending for the lease.
func BenchmarkTake(b *testing.B) {
	for _, bc := range []struct {
		name   string
		tokens int64
	}{
		{"leased", 100},
		{"lean", 1 << 62},
	} {
		s, err := lease.New(memstore.New(memstore.Options{}), lease.Options{Tokens: bc.tokens})
		if err != nil {
			b.Fatal(err)
		}
		req := fleetrate.Request{N: 1, Buckets: []fleetrate.Bucket{{Key: "hot", Limits: []fleetrate.Limit{fleetrate.PerSecond(1e9, 1e9)}}}}
		ctx := context.Background()
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Take(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := s.Take(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
