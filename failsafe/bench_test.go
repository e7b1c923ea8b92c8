package failsafe_test

import (
	"context"
	"testing"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/failsafe"
	"github.com/fleetrate/fleetrate/memstore"
)

// BenchmarkTake measures what the breaker adds to a take of the in-memory
// store while it is closed (the store answers), by one caller and by
// parallel callers.
func BenchmarkTake(b *testing.B) {
	s, err := failsafe.New(memstore.New(memstore.Options{}), failsafe.Options{})
	if err != nil {
		b.Fatal(err)
	}
	req := fleetrate.Request{N: 1, Buckets: []fleetrate.Bucket{{Key: "hot", Limits: []fleetrate.Limit{fleetrate.PerSecond(1e9, 1e9)}}}}
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Take(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
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
