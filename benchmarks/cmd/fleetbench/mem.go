package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/ratelimit"
	"golang.org/x/time/rate"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/benchmarks/workload"
	"github.com/fleetrate/fleetrate/memstore"
)

// memTable compares the in-memory store with x/time/rate and uber's
// ratelimit using testing.Benchmark.
func memTable(cfg config, out io.Writer) {
	single := benchRows(cfg, memSingleRows())
	parallel := benchRows(cfg, memParallelRows())
	fmt.Fprintf(out, "## In memory: Allow\n\n| case | implementation | ns/op | allocs/op | × x/time/rate |\n|---|---|---|---|---|\n")
	for _, set := range []struct {
		name string
		rows []memRow
	}{{"1 goroutine, 1 key", single}, {"all cores, 10,000 keys", parallel}} {
		peer := float64(set.rows[1].r.NsPerOp())
		for _, r := range set.rows {
			ns := float64(r.r.NsPerOp())
			fmt.Fprintf(out, "| %s | %s | %.1f | %d | %.2f (throughput %.2f×) |\n", set.name, r.name, ns, r.r.AllocsPerOp(), ns/peer, peer/ns)
		}
	}
	fmt.Fprintln(out)
}

// memRow is one in-memory implementation's benchmark and its result.
type memRow struct {
	name string
	f    func(b *testing.B)
	r    testing.BenchmarkResult
}

// benchRows runs the rows' benchmarks cfg.count times, taking turns so
// that a slow spell of the machine hits every implementation alike, and
// keeps each one's run with the median ns/op.
func benchRows(cfg config, rows []memRow) []memRow {
	runs := make([][]testing.BenchmarkResult, len(rows))
	for range cfg.count {
		for i, r := range rows {
			runs[i] = append(runs[i], testing.Benchmark(r.f))
		}
	}
	for i := range rows {
		rows[i].r = median(runs[i], testing.BenchmarkResult.NsPerOp)
	}
	return rows
}

func memLimiter() *fleetrate.Limiter {
	l, _ := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Limits: []fleetrate.Limit{workload.Limit}})
	return l
}

// memSingleRows take from one key in one goroutine; x/time/rate second.
func memSingleRows() []memRow {
	ctx := context.Background()
	return []memRow{
		{name: "fleetrate memstore", f: func(b *testing.B) {
			l := memLimiter()
			b.ReportAllocs()
			for b.Loop() {
				_, _ = l.Allow(ctx, "k")
			}
		}},
		{name: "x/time/rate", f: func(b *testing.B) {
			l := rate.NewLimiter(rate.Limit(workload.Limit.Rate), int(workload.Limit.Burst))
			b.ReportAllocs()
			for b.Loop() {
				l.Allow()
			}
		}},
		{name: "go.uber.org/ratelimit (Take, never blocks here)", f: func(b *testing.B) {
			l := ratelimit.New(1e9, ratelimit.WithoutSlack)
			b.ReportAllocs()
			for b.Loop() {
				l.Take()
			}
		}},
	}
}

// memParallelRows take over the keyspace from all cores; x/time/rate
// (a map of limiters under a mutex) second.
func memParallelRows() []memRow {
	ctx := context.Background()
	return []memRow{
		{name: "fleetrate memstore", f: func(b *testing.B) {
			l := memLimiter()
			var seq atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(7919))
				for pb.Next() {
					i++
					_, _ = l.Allow(ctx, workload.KeyNames[i%workload.Keys])
				}
			})
		}},
		{name: "x/time/rate, map + mutex", f: func(b *testing.B) {
			var mu sync.Mutex
			m := map[string]*rate.Limiter{}
			var seq atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(7919))
				for pb.Next() {
					i++
					k := workload.KeyNames[i%workload.Keys]
					mu.Lock()
					l, ok := m[k]
					if !ok {
						l = rate.NewLimiter(rate.Limit(workload.Limit.Rate), int(workload.Limit.Burst))
						m[k] = l
					}
					mu.Unlock()
					l.Allow()
				}
			})
		}},
	}
}
