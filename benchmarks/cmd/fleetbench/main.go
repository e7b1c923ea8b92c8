// Command fleetbench measures fleetrate side by side with its peers and the
// Redis ceiling in one run, and prints markdown tables (and, with -chart, a
// PNG chart) for docs/BENCHMARKS.md.
//
//	cd benchmarks && go run ./cmd/fleetbench -duration 2s -chart ../docs/bench-redis.png > /tmp/bench.md
//
// It starts its own redis-server on a free loopback port. Every figure is
// meant to be read as a ratio to the peer or ceiling measured in the same
// run: absolute numbers on a shared machine mean little.
package main

import (
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/benchmarks/workload"
	"github.com/fleetrate/fleetrate/internal/cli/loadgen"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fleetbench:", err)
		os.Exit(1)
	}
}

type config struct {
	repro      string // the flags that reproduce the run (see reproArgs)
	count      int
	duration   time.Duration
	goroutines []int
	chart      string
	quick      bool
	only       map[string]bool
	impl       string
	hot        string
	cpuprofile string
	// plain: the Redis table's clients keep go-redis's defaults
	// (ContextTimeoutEnabled off), as a client built without
	// redisstore.ClientOptions does.
	plain bool
}

func run(args []string, out io.Writer) error {
	cfg, err := parseFlags(args)
	if err != nil {
		return err
	}
	if cfg.cpuprofile != "" {
		stop, err := startProfile(cfg.cpuprofile)
		if err != nil {
			return err
		}
		defer stop()
	}
	// The run's own command goes to the log; docs/BENCHMARKS.md heads the
	// tables with its date, commit and command (benchmarks/regen.sh).
	fmt.Fprintf(os.Stderr, "fleetbench: measuring %s by `cd benchmarks && go run ./cmd/fleetbench %s`\n",
		time.Now().UTC().Format("2006-01-02"), cfg.repro)
	fmt.Fprintf(out, "redis-server on loopback, %d CPU cores shared by client and server.\n\n", nproc())
	// The in-memory table is measured first, before any redis-server runs
	// (one expiring thousands of keys takes CPU time from the process)
	// and while this process's heap is fresh, and printed last.
	var mem bytes.Buffer
	if cfg.only["mem"] {
		memTable(cfg, &mem)
	}
	redisRows, err := redisTables(cfg, out)
	if err != nil {
		return err
	}
	if _, err := mem.WriteTo(out); err != nil {
		return err
	}
	if cfg.chart != "" && redisRows != nil {
		if err := writeChart(cfg.chart, redisRows); err != nil {
			return err
		}
	}
	return nil
}

// parseFlags reads the command line into a config.
func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("fleetbench", flag.ContinueOnError)
	var cfg config
	fs.DurationVar(&cfg.duration, "duration", 2*time.Second, "how long each measurement runs")
	fs.IntVar(&cfg.count, "count", 3, "how many times each measurement runs; tables report the median")
	gs := fs.String("goroutines", "1,8,64,256", "goroutine counts for the Redis table")
	fs.StringVar(&cfg.chart, "chart", "", "write a PNG chart of Redis throughput to this file")
	fs.BoolVar(&cfg.quick, "quick", false, "a short smoke run (CI)")
	fs.StringVar(&cfg.impl, "impl", "", "measure only the Redis implementations whose name contains this (redis_rate always runs)")
	fs.StringVar(&cfg.hot, "keys", "hot,spread", "Redis key patterns: hot (one key), spread (10,000 keys), or both")
	fs.StringVar(&cfg.cpuprofile, "cpuprofile", "", "write a CPU profile of this process to this file")
	fs.BoolVar(&cfg.plain, "plain-client", false, "Redis table: clients with go-redis's default options (ContextTimeoutEnabled off) for every implementation")
	only := fs.String("only", "redis,wait,mem", "which tables to measure: any of redis, wait, mem, script")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	cfg.repro = reproArgs(fs)
	for _, f := range strings.Split(*gs, ",") {
		g, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || g < 1 {
			return cfg, fmt.Errorf("-goroutines: %q is not a positive integer", f)
		}
		cfg.goroutines = append(cfg.goroutines, g)
	}
	cfg.only = map[string]bool{}
	for _, t := range strings.Split(*only, ",") {
		switch t = strings.TrimSpace(t); t {
		case "redis", "wait", "mem", "script":
			cfg.only[t] = true
		default:
			return cfg, fmt.Errorf("-only: unknown table %q (want redis, wait, mem or script)", t)
		}
	}
	if cfg.count < 1 {
		return cfg, fmt.Errorf("-count: %d is not a positive integer", cfg.count)
	}
	if cfg.quick {
		cfg.count = 1
		cfg.duration = 200 * time.Millisecond
		cfg.goroutines = []int{1, 64}
	}
	return cfg, nil
}

// startProfile starts a CPU profile of this process into path; stop ends
// it.
func startProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// redisTables measures the tables cfg asks for that need a redis-server,
// on one it starts, and returns the Redis table's rows for the chart.
func redisTables(cfg config, out io.Writer) ([]redisRow, error) {
	if !cfg.only["redis"] && !cfg.only["wait"] && !cfg.only["script"] {
		return nil, nil
	}
	dir, err := os.MkdirTemp("", "fleetbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	srv, err := redistest.Launch(dir)
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	if cfg.only["script"] {
		if err := scriptTable(srv, cfg, out); err != nil {
			return nil, err
		}
	}
	var rows []redisRow
	if cfg.only["redis"] {
		if rows, err = redisTable(srv, cfg, out); err != nil {
			return nil, err
		}
	}
	if cfg.only["wait"] {
		if err := waitTable(srv, cfg, out); err != nil {
			return nil, err
		}
	}
	return rows, nil
}

// median returns the middle of xs by key, which it sorts.
func median[T any, K cmp.Ordered](xs []T, key func(T) K) T {
	slices.SortFunc(xs, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
	return xs[len(xs)/2]
}

func nproc() int {
	out, err := exec.Command("nproc").Output()
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

// measurement is what one run of loadgen.Measure saw.
type measurement struct {
	ops      float64 // decisions per second
	p50, p99 time.Duration
	errors   int64
}

// measure runs f from g goroutines for d with loadgen.Measure, the loop
// fleetrate bench uses too, and reports throughput and latency
// percentiles.
func measure(g int, d time.Duration, f func(ctx context.Context, i int) error) measurement {
	m := loadgen.Measure(context.Background(), g, d, f)
	return measurement{ops: m.Ops, p50: m.P50, p99: m.P99, errors: m.Errors}
}

type redisRow struct {
	impl    string
	hot     bool
	g       int
	m       measurement
	ceiling float64
}

func newClient(srv *redistest.Server, g int) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: g + 4, ContextTimeoutEnabled: true})
}

// newImplClient is newClient for the Redis table: with -plain-client, a
// client with go-redis's default options.
func newImplClient(srv *redistest.Server, cfg config, g int) *redis.Client {
	if cfg.plain {
		return redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: g + 4})
	}
	return newClient(srv, g)
}

func fleetLimiter(c redisstore.Client, opts redisstore.Options) (*fleetrate.Limiter, error) {
	opts.Timeout = 5 * time.Second
	s, err := redisstore.New(c, opts)
	if err != nil {
		return nil, err
	}
	if err := s.LoadScripts(context.Background()); err != nil {
		return nil, err
	}
	return fleetrate.New(s, fleetrate.Config{Prefix: "fr:", Limits: []fleetrate.Limit{workload.Limit}})
}

func redisTable(srv *redistest.Server, cfg config, out io.Writer) ([]redisRow, error) {
	patterns, err := keyPatterns(cfg.hot)
	if err != nil {
		return nil, err
	}
	var hots, spreads []float64
	for range cfg.count {
		h, err := ceiling(srv, true, cfg)
		if err != nil {
			return nil, err
		}
		sp, err := ceiling(srv, false, cfg)
		if err != nil {
			return nil, err
		}
		hots, spreads = append(hots, h), append(spreads, sp)
	}
	self := func(x float64) float64 { return x }
	ceilHot, ceilSpread := median(hots, self), median(spreads, self)
	goHot, goSpread, err := goCeilings(srv, cfg)
	if err != nil {
		return nil, err
	}
	impls := slices.DeleteFunc(redisImpls(), func(im redisImpl) bool {
		return im.name != "redis_rate v10" && !strings.Contains(im.name, cfg.impl)
	})
	rows, err := measureRedis(srv, cfg, impls, patterns)
	if err != nil {
		return nil, err
	}
	for i := range rows {
		rows[i].ceiling = ceilSpread
		if rows[i].hot {
			rows[i].ceiling = ceilHot
		}
	}
	fmt.Fprintf(out, "## Redis: Allow decisions per second\n\n")
	fmt.Fprintf(out, "The ceiling is `redis-benchmark` running fleetrate's own take script with EVALSHA, 50 clients, pipelining 32: %.0f/s on one hot key, %.0f/s over %d keys (medians of %d runs; each row below is the median of %d runs of %v). The same load sent from Go (loadgen.Ceiling, the ceiling `fleetrate bench` reports) ran %.0f/s and %.0f/s.\n\n",
		ceilHot, ceilSpread, workload.Keys, cfg.count, cfg.count, cfg.duration, goHot, goSpread)
	printRedisRows(out, rows)
	return rows, nil
}

// keyPatterns reads -keys: true for the hot key, false for the keyspace.
func keyPatterns(s string) ([]bool, error) {
	var patterns []bool
	for _, p := range strings.Split(s, ",") {
		switch strings.TrimSpace(p) {
		case "hot":
			patterns = append(patterns, true)
		case "spread":
			patterns = append(patterns, false)
		default:
			return nil, fmt.Errorf("-keys: unknown pattern %q (want hot or spread)", p)
		}
	}
	return patterns, nil
}

// redisImpl is one way to decide an Allow on Redis: build returns the
// call on key and what closes it.
type redisImpl struct {
	name  string
	build func(c *redis.Client) (func(ctx context.Context, key string) error, func(), error)
}

// redisImpls are fleetrate's Redis configurations and redis_rate.
func redisImpls() []redisImpl {
	store := func(opts redisstore.Options) func(c *redis.Client) (func(context.Context, string) error, func(), error) {
		return func(c *redis.Client) (func(context.Context, string) error, func(), error) {
			l, err := fleetLimiter(c, opts)
			return limiterAllow(l), func() {}, err
		}
	}
	return []redisImpl{
		{"fleetrate (default: batched)", store(redisstore.Options{})},
		{"fleetrate unbatched", store(redisstore.Options{Unbatched: true})},
		{"fleetrate unbatched + autopipeline", func(c *redis.Client) (func(context.Context, string) error, func(), error) {
			ap, err := c.AutoPipeline()
			if err != nil {
				return nil, nil, err
			}
			l, err := fleetLimiter(ap, redisstore.Options{Unbatched: true})
			return limiterAllow(l), func() { _ = ap.Close() }, err
		}},
		{"fleetrate + fold hot keys", store(redisstore.Options{FoldHotKeys: true})},
		{"redis_rate v10", func(c *redis.Client) (func(context.Context, string) error, func(), error) {
			l := redis_rate.NewLimiter(c)
			lim := redis_rate.Limit{Rate: 100, Burst: 1 << 27, Period: time.Second}
			return func(ctx context.Context, key string) error {
				_, err := l.Allow(ctx, key, lim)
				return err
			}, func() {}, nil
		}},
	}
}

// measureRedis measures each implementation at each key pattern and
// number of goroutines cfg.count times, the implementations taking turns
// so that a slow spell of the machine hits them all, in the opposite
// order every other round so that going first or second favours none;
// each row is the run with the median throughput.
func measureRedis(srv *redistest.Server, cfg config, impls []redisImpl, patterns []bool) ([]redisRow, error) {
	runs := make([][]measurement, len(patterns)*len(cfg.goroutines)*len(impls))
	at := func(hi, gi, ii int) int { return (hi*len(cfg.goroutines)+gi)*len(impls) + ii }
	for rep := range cfg.count {
		for hi, hot := range patterns {
			for gi, g := range cfg.goroutines {
				for k := range impls {
					ii := k
					if rep%2 == 1 {
						ii = len(impls) - 1 - k
					}
					im := impls[ii]
					m, err := measureImpl(srv, cfg, im, hot, g)
					if err != nil {
						return nil, err
					}
					runs[at(hi, gi, ii)] = append(runs[at(hi, gi, ii)], m)
					fmt.Fprintf(os.Stderr, "redis %-26s hot=%-5v g=%-3d %9.0f/s p99 %v errors %d\n", im.name, hot, g, m.ops, m.p99, m.errors)
				}
			}
		}
	}
	var rows []redisRow
	for hi, hot := range patterns {
		for gi, g := range cfg.goroutines {
			for ii, im := range impls {
				med := median(runs[at(hi, gi, ii)], func(m measurement) float64 { return m.ops })
				rows = append(rows, redisRow{impl: im.name, hot: hot, g: g, m: med})
			}
		}
	}
	return rows, nil
}

// measureImpl measures one implementation with a client of its own, from
// g goroutines on the hot key or over the keyspace.
func measureImpl(srv *redistest.Server, cfg config, im redisImpl, hot bool, g int) (measurement, error) {
	c := newImplClient(srv, cfg, g)
	defer c.Close()
	f, closeFn, err := im.build(c)
	if err != nil {
		return measurement{}, fmt.Errorf("%s: %w", im.name, err)
	}
	defer closeFn()
	return measure(g, cfg.duration, func(ctx context.Context, i int) error {
		key := "hot"
		if !hot {
			key = workload.KeyNames[i%workload.Keys]
		}
		return f(ctx, key)
	}), nil
}

// printRedisRows writes the Redis table, each row also as a multiple of
// redis_rate's row of the same keys and goroutines.
func printRedisRows(out io.Writer, rows []redisRow) {
	fmt.Fprintf(out, "| keys | goroutines | implementation | decisions/s | × ceiling | × redis_rate | p50 | p99 | errors |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		var peer float64
		for _, p := range rows {
			if p.impl == "redis_rate v10" && p.hot == r.hot && p.g == r.g {
				peer = p.m.ops
			}
		}
		keys := strconv.Itoa(workload.Keys)
		if r.hot {
			keys = "1 (hot)"
		}
		fmt.Fprintf(out, "| %s | %d | %s | %.0f | %.2f | %.2f | %v | %v | %d |\n", keys, r.g, r.impl, r.m.ops, r.m.ops/r.ceiling, r.m.ops/peer,
			r.m.p50.Round(time.Microsecond), r.m.p99.Round(time.Microsecond), r.m.errors)
	}
	fmt.Fprintln(out)
}

func limiterAllow(l *fleetrate.Limiter) func(context.Context, string) error {
	return func(ctx context.Context, key string) error {
		_, err := l.Allow(ctx, key)
		return err
	}
}

// ceiling runs redis-benchmark with fleetrate's take script, pipelined.
func ceiling(srv *redistest.Server, hot bool, cfg config) (float64, error) {
	c := newClient(srv, 1)
	defer c.Close()
	// KeepAfterFailover: TakeScriptSHA is the unguarded script, which a
	// store behind the failover guard (the default on a plain client)
	// never loads.
	l, err := fleetLimiter(c, redisstore.Options{KeepAfterFailover: true})
	if err != nil {
		return 0, err
	}
	// Load the script through one take, then call it by its SHA.
	if _, err := l.Allow(context.Background(), "warm"); err != nil {
		return 0, err
	}
	sha := redisstore.TakeScriptSHA()
	key := "fr:hot"
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(srv.Port()), "-c", "50", "-P", "32", "-q"}
	n := 1_000_000
	if cfg.quick {
		n = 50_000
	}
	args = append(args, "-n", strconv.Itoa(n))
	if !hot {
		key = "fr:bench:__rand_int__"
		args = append(args, "-r", strconv.Itoa(workload.Keys))
	}
	args = append(args, "EVALSHA", sha, "1", key)
	for _, a := range redisstore.TakeScriptArgs(1, []fleetrate.Limit{workload.Limit}) {
		args = append(args, fmt.Sprint(a))
	}
	outb, err := exec.Command("redis-benchmark", args...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark: %v: %s", err, outb)
	}
	// The quiet output ends with "<name>: <n> requests per second, ...".
	for _, line := range bytes.Split(outb, []byte("\r")) {
		s := string(bytes.TrimSpace(line))
		if i := strings.Index(s, " requests per second"); i > 0 {
			f := strings.Fields(s[:i])
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				return v, nil
			}
		}
	}
	return 0, fmt.Errorf("redis-benchmark: no throughput in %q", outb)
}

// goCeilings measures the ceiling as fleetrate bench does, from Go with
// loadgen.Ceiling, on the hot key and over the keyspace.
func goCeilings(srv *redistest.Server, cfg config) (hot, spread float64, err error) {
	c := newClient(srv, loadgen.CeilingClients)
	defer c.Close()
	lim := []fleetrate.Limit{workload.Limit}
	ctx := context.Background()
	if hot, err = loadgen.Ceiling(ctx, c, cfg.duration, loadgen.CeilingClients, loadgen.CeilingDepth, lim, func(int) string { return "fr:gohot" }); err != nil {
		return 0, 0, err
	}
	spread, err = loadgen.Ceiling(ctx, c, cfg.duration, loadgen.CeilingClients, loadgen.CeilingDepth, lim, func(i int) string { return "fr:go" + workload.KeyNames[i%workload.Keys] })
	return hot, spread, err
}

// reproArgs is the command line that reproduces a run: every flag it was
// given (those that narrowed it, such as -only, -goroutines and -keys,
// included) but those that only say where to write its output, and
// -duration and -count even when left at their defaults.
func reproArgs(fs *flag.FlagSet) string {
	var out []string
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		set[f.Name] = true
		switch f.Name {
		case "doc", "chart", "cpuprofile":
			return
		}
		out = append(out, "-"+f.Name+"="+f.Value.String())
	})
	for _, name := range []string{"duration", "count"} {
		if !set[name] {
			out = append(out, "-"+name+"="+fs.Lookup(name).Value.String())
		}
	}
	return strings.Join(out, " ")
}
