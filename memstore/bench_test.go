package memstore_test

import (
	"context"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

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
			// Below the cap, a store too big to reach it within b.N (in
			// keys or bytes).
			s := memstore.New(memstore.Options{MaxKeys: maxKeys + tc.prefill + b.N, MaxBytes: -1, Shards: 16})
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

// threadTime returns the CPU time the calling thread has used; the caller
// has locked its goroutine to its thread.
func threadTime(b *testing.B) time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		b.Fatal(errno)
	}
	return time.Duration(ts.Nano())
}

// BenchmarkNewKeysCapRatio is BenchmarkNewKeys with the two stores side
// by side: it alternates blocks of 256 new buckets between a store below
// its key cap and one at it, and times each block by the CPU time of its
// thread, so that the load of a busy machine (time the thread is not
// running) falls on neither. It reports the cost per take of each and
// their ratio (at-cap/below-cap; 1 means eviction is free). The GC's
// background work runs on other threads and is left out of both; its
// assists are in. Run it several times:
//
//	go test -run '^$' -bench BenchmarkNewKeysCapRatio -count 5 ./memstore
func BenchmarkNewKeysCapRatio(b *testing.B) {
	const (
		maxKeys = 1 << 17
		block   = 256
	)
	lim := []fleetrate.Limit{fleetrate.Every(time.Hour, 10)}
	ctx := context.Background()
	blocks := b.N/block + 1
	below := memstore.New(memstore.Options{MaxKeys: maxKeys + blocks*block + maxKeys/16, MaxBytes: -1, Shards: 16})
	atCap := memstore.New(memstore.Options{MaxKeys: maxKeys, Shards: 16})
	var buf []byte
	take := func(s *memstore.Store, i int) {
		buf = strconv.AppendInt(append(buf[:0], 'k'), int64(i), 10)
		req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: string(buf), Limits: lim}}, N: 1}
		if _, err := s.Take(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	for i := range maxKeys + maxKeys/16 { // fill, and settle at the cap
		take(atCap, -1-i)
	}
	for i := range maxKeys / 16 {
		take(below, -1-i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var tBelow, tAt time.Duration
	for k := range blocks {
		start := threadTime(b)
		for i := k * block; i < (k+1)*block; i++ {
			take(below, i)
		}
		mid := threadTime(b)
		for i := k * block; i < (k+1)*block; i++ {
			take(atCap, i)
		}
		end := threadTime(b)
		tBelow, tAt = tBelow+mid-start, tAt+end-mid
	}
	n := float64(blocks * block)
	b.ReportMetric(float64(tBelow)/n, "below-ns/take")
	b.ReportMetric(float64(tAt)/n, "atcap-ns/take")
	b.ReportMetric(float64(tAt)/float64(tBelow), "ratio")
}
