package memstore_test

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
)

// cpuTime returns the CPU time this process has used, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkNewKeys takes from distinct, never-seen buckets that stay live
// (an hour to refill), below the key cap and at it, where every new bucket
// evicts one: the cost per take should not depend on which. It reports
// the CPU time per take as well as the wall time.
//
//	go test -run '^$' -bench BenchmarkNewKeys -count 5 ./memstore
func BenchmarkNewKeys(b *testing.B) {
	const maxKeys = 1 << 17
	lim := []fleetrate.Limit{fleetrate.Every(time.Hour, 10)}
	for _, tc := range []struct {
		name    string
		prefill int
	}{
		{"BelowCap", 0},
		{"AtCap", maxKeys},
	} {
		b.Run(tc.name, func(b *testing.B) {
			// Below the cap, a store too big to reach it within b.N.
			s := memstore.New(memstore.Options{MaxKeys: maxKeys + tc.prefill + b.N, Shards: 16})
			if tc.prefill > 0 {
				s = memstore.New(memstore.Options{MaxKeys: maxKeys, Shards: 16})
			}
			ctx := context.Background()
			var buf []byte
			take := func(i int) {
				buf = strconv.AppendInt(append(buf[:0], 'k'), int64(i), 10)
				req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: string(buf), Limits: lim}}, N: 1}
				if _, err := s.Take(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			for i := range tc.prefill + maxKeys/16 { // fill, and settle at the cap
				take(-1 - i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cpuTime(b)
			for i := range b.N {
				take(i)
			}
			// On a loaded machine wall time per op measures the load;
			// the process's CPU time (its GC included) measures the store.
			b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
