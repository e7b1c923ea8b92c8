package benchmarks

import (
	"context"
	"testing"

	"golang.org/x/sync/semaphore"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
)

// The in-memory path of an in-flight permit against its ceiling,
// golang.org/x/sync/semaphore (a process-local semaphore with no rate, no
// lease and no fleet), one goroutine acquiring and releasing one permit of
// a bound of 8 (issue 37):
//
//	cd benchmarks && go test -run '^$' -bench 'Permit' -count 6 | tee permit.txt && benchstat permit.txt

// BenchmarkPermitSemaphore is the ceiling: TryAcquire and Release of one
// of 8 permits.
func BenchmarkPermitSemaphore(b *testing.B) {
	s := semaphore.NewWeighted(8)
	b.ReportAllocs()
	for b.Loop() {
		if !s.TryAcquire(1) {
			b.Fatal("no permit")
		}
		s.Release(1)
	}
}

// BenchmarkPermitMemory is Limiter.TryAcquire and Reservation.Release on
// the in-memory store: a token of a rate that never binds and one of 8
// permits, leased and released.
func BenchmarkPermitMemory(b *testing.B) {
	l, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{
		Buckets: []fleetrate.BucketConfig{{Name: "api", Limits: []fleetrate.Limit{fleetrate.PerSecond(1e9, 1e9)}, InFlight: 8}},
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		r, err := l.TryAcquire(ctx, "api")
		if err != nil || !r.Result.Allowed {
			b.Fatalf("%+v %v", r, err)
		}
		if err := r.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
