package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/cli/loadgen"
	"github.com/fleetrate/fleetrate/lease"
	"github.com/fleetrate/fleetrate/redisstore"
)

// benchPrefixRoot starts every key fleetrate bench writes; the rest of its
// prefix is random per run unless --prefix names one of the same form.
const benchPrefixRoot = "fleetrate:bench:"

var benchPrefixRE = regexp.MustCompile(`^fleetrate:bench:[0-9a-z]{6,32}:$`)

// benchLimit is every bench bucket's limit: it never runs out during a run
// (a take costs 10 ms of a 15-day burst), so that every call measures a
// decision and none sleeps, and keys expire by themselves should the
// cleanup not run.
var benchLimit = fleetrate.PerSecond(100, 1<<27)

// benchLeaseTokens is the lease size of the hot-key lease measurement.
const benchLeaseTokens = 100

// benchConfig is what the bench command's flags set.
type benchConfig struct {
	redis       string
	duration    time.Duration
	concurrency []int
	keys        []int
	prefix      string
	json        bool
}

// newBenchCmd returns "fleetrate bench": throughput and latency of the
// Redis store on the user's own Redis, and the settings that suit it.
func newBenchCmd() *cobra.Command {
	var cfg benchConfig
	cmd := &cobra.Command{
		Use:   "bench --redis URL",
		Short: "Measure fleetrate on your own Redis and recommend settings",
		Long: `bench measures the Redis store on the Redis you name, in about 45 s with
the defaults: decisions per second and p50/p99 latency of Allow (with
batching off and on) and Wait, at each --concurrency of callers in this
process and each --keys spread (1 is one hot key); the pipelined ceiling of
the store's take script in the same run (50 clients, 32 calls per
pipeline); and the settings it recommends for your case.

It writes only keys under its own prefix, fleetrate:bench:<random>:, refuses
to start if any of them exists, and deletes them at the end, also when
interrupted (Ctrl-C). Should the cleanup not reach Redis, the buckets it
wrote expire by themselves once full again: a take adds 10 ms to a bucket's
debt, so within minutes (15 days at the very most).

A measurement in which every call failed (Redis is not answering) stops the run:
the report then shows what was measured before it, marked as stopped, with
no recommendations, and the command fails. Decisions per second count
successful calls only.

Progress goes to stderr; stdout has the report (--json for JSON).
--redis takes the same URLs as "fleetrate serve" (standalone, rediss://,
redis+sentinel://, redis+cluster://, unix://).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBench(cmd.Context(), cfg, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.redis, "redis", "", "Redis URL (required; see fleetrate serve --help for Sentinel and Cluster)")
	f.DurationVar(&cfg.duration, "duration", 2*time.Second, "how long each measurement runs")
	f.IntSliceVar(&cfg.concurrency, "concurrency", []int{1, 16, 64}, "concurrent callers in this process")
	f.IntSliceVar(&cfg.keys, "keys", []int{1, 10000}, "key spreads: how many keys the calls go round (1 is one hot key)")
	f.StringVar(&cfg.prefix, "prefix", "", "key prefix, of the form fleetrate:bench:<6 to 32 of [0-9a-z]>: (default random)")
	f.BoolVar(&cfg.json, "json", false, "print the report as JSON")
	return cmd
}

// validate checks the flags and fills in the random prefix.
func (cfg *benchConfig) validate() error {
	switch {
	case cfg.redis == "":
		return errors.New("--redis: a Redis URL is required (bench measures a Redis store)")
	case cfg.duration < 100*time.Millisecond || cfg.duration > time.Minute:
		return fmt.Errorf("--duration: must be between 100ms and 1m, got %v", cfg.duration)
	case len(cfg.concurrency) == 0 || len(cfg.keys) == 0:
		return errors.New("--concurrency and --keys: need at least one value each")
	}
	for _, c := range cfg.concurrency {
		if c < 1 || c > 10_000 {
			return fmt.Errorf("--concurrency: %d is not between 1 and 10000", c)
		}
	}
	for _, k := range cfg.keys {
		if k < 1 || k > 1_000_000 {
			return fmt.Errorf("--keys: %d is not between 1 and 1000000", k)
		}
	}
	slices.Sort(cfg.concurrency)
	cfg.concurrency = slices.Compact(cfg.concurrency)
	slices.Sort(cfg.keys)
	cfg.keys = slices.Compact(cfg.keys)
	if cfg.prefix == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b) // never fails (crypto/rand)
		cfg.prefix = benchPrefixRoot + hex.EncodeToString(b) + ":"
	}
	if !benchPrefixRE.MatchString(cfg.prefix) {
		return fmt.Errorf("--prefix %q: bench writes only under its own prefix, %s<6 to 32 of [0-9a-z]> and a colon", cfg.prefix, benchPrefixRoot)
	}
	return nil
}

// benchRow is one measurement of the report.
type benchRow struct {
	Mode        string  `json:"mode"`   // allow or wait
	Config      string  `json:"config"` // unbatched, batch or lease
	Concurrency int     `json:"concurrency"`
	Keys        int     `json:"keys"`
	PerSecond   float64 `json:"decisions_per_second"`
	OfCeiling   float64 `json:"of_ceiling"`
	P50Micros   float64 `json:"p50_us"`
	P99Micros   float64 `json:"p99_us"`
	Errors      int64   `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	// PoolWaits counts the calls that waited for a free connection of
	// the client's pool.
	PoolWaits int64 `json:"pool_waits"`
}

// benchCeiling is the take script's pipelined ceiling over one key spread.
type benchCeiling struct {
	Keys      int     `json:"keys"`
	PerSecond float64 `json:"takes_per_second"`
}

// benchAdvice is one recommended setting and the measurement behind it.
type benchAdvice struct {
	Setting string `json:"setting"`
	Value   string `json:"value"`
	Why     string `json:"why"`
}

// benchReport is the whole result of a run.
type benchReport struct {
	Redis           string         `json:"redis"`
	Prefix          string         `json:"prefix"`
	Duration        string         `json:"duration_per_measurement"`
	PoolSize        int            `json:"pool_size"`
	Ceilings        []benchCeiling `json:"ceilings"`
	Rows            []benchRow     `json:"rows"`
	Recommendations []benchAdvice  `json:"recommendations"`
	KeysDeleted     int64          `json:"keys_deleted"`
	// Stopped is the error that ended the run early, if one did: the
	// rows are then the measurements made before it.
	Stopped string `json:"stopped,omitempty"`
}

// benchRun is one run's client, keys and progress.
type benchRun struct {
	cfg      benchConfig
	c        redis.UniversalClient
	progress io.Writer
	step     int
	steps    int
}

func runBench(ctx context.Context, cfg benchConfig, stdout, stderr io.Writer) (err error) {
	if err := cfg.validate(); err != nil {
		return err
	}
	// go-redis's own lines (a Sentinel's "selected addr", a failed dial):
	// structured and one a second, as serve logs them, not its raw lines
	// between the progress display's.
	redisstore.SetLogger(slog.New(slog.NewTextHandler(stderr, nil)))
	c, name, err := newServeRedisClient(cfg.redis)
	if err != nil {
		return err
	}
	defer c.Close()
	r := &benchRun{cfg: cfg, c: c, progress: stderr}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pingRedis(pctx, c); err != nil {
		return fmt.Errorf("--redis %s: %w", name, err)
	}
	if err := r.checkUnused(ctx); err != nil {
		return err
	}
	rep := benchReport{Redis: name, Prefix: cfg.prefix, Duration: cfg.duration.String(), PoolSize: poolSize(c)}
	defer func() { err = r.finish(ctx, &rep, stdout, err) }()
	r.steps = len(cfg.keys) * (1 + 3*len(cfg.concurrency))
	if slices.Contains(cfg.keys, 1) {
		r.steps++ // the hot key through a lease
	}
	r.logf("%d measurements of %v, keys under %s on %s", r.steps, cfg.duration, cfg.prefix, name)
	warm(ctx, c, min(slices.Max(cfg.concurrency), rep.PoolSize))
	if rep.Ceilings, err = r.ceilings(ctx); err != nil {
		return err
	}
	if rep.Rows, err = r.measureAll(ctx, rep.Ceilings); err != nil {
		return err
	}
	rep.Recommendations = recommend(cfg, rep)
	return nil
}

// finish ends a run whose measurement returned err: it deletes the run's
// keys, prints what was measured (marked as stopped, without
// recommendations, when err is set) into rep, and returns the error of
// the whole run.
func (r *benchRun) finish(ctx context.Context, rep *benchReport, stdout io.Writer, err error) error {
	budget := 30 * time.Second
	if err != nil && !errors.Is(err, context.Canceled) {
		budget = 5 * time.Second // Redis failed the run: it may not answer a DEL either
	}
	n, cerr := r.cleanup(ctx, budget)
	rep.KeysDeleted = n
	if err != nil {
		// What was measured before the failure is still printed,
		// marked as stopped, and without recommendations.
		rep.Stopped, rep.Recommendations = err.Error(), nil
	}
	if len(rep.Ceilings) > 0 && !errors.Is(err, context.Canceled) {
		if perr := printBench(stdout, *rep, r.cfg.json); err == nil {
			err = perr
		}
	}
	switch {
	case err == nil:
		err = cerr
	case errors.Is(err, context.Canceled) && cerr == nil:
		err = fmt.Errorf("interrupted; deleted the %d bench keys: %w", n, err)
	default:
		err = errors.Join(err, cerr)
	}
	return err
}

func (r *benchRun) logf(format string, a ...any) {
	fmt.Fprintf(r.progress, "fleetrate bench: "+format+"\n", a...)
}

// key names the i-th key of a spread of n.
func (r *benchRun) key(i, n int) string { return r.cfg.prefix + strconv.Itoa(i%n) }

// allKeys returns every key a run may write, in batches of at most 1000.
func (r *benchRun) allKeys() [][]string {
	n := slices.Max(r.cfg.keys)
	var out [][]string
	for lo := 0; lo < n; lo += 1000 {
		batch := make([]string, 0, min(1000, n-lo))
		for i := lo; i < min(lo+1000, n); i++ {
			batch = append(batch, r.key(i, n))
		}
		out = append(out, batch)
	}
	return out
}

// perKey runs one command per key of every batch in a pipeline (on a
// Cluster each goes to its key's node) and returns the sum of their
// replies.
func (r *benchRun) perKey(ctx context.Context, cmd func(p redis.Pipeliner, key string) *redis.IntCmd) (int64, error) {
	var sum int64
	for _, batch := range r.allKeys() {
		p := r.c.Pipeline()
		cmds := make([]*redis.IntCmd, len(batch))
		for i, k := range batch {
			cmds[i] = cmd(p, k)
		}
		if _, err := p.Exec(ctx); err != nil {
			return sum, err
		}
		for _, c := range cmds {
			sum += c.Val()
		}
	}
	return sum, nil
}

// checkUnused refuses to run when any key the run would write exists.
func (r *benchRun) checkUnused(ctx context.Context) error {
	n, err := r.perKey(ctx, func(p redis.Pipeliner, k string) *redis.IntCmd { return p.Exists(ctx, k) })
	if err != nil {
		return fmt.Errorf("checking that the bench keys are unused: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("--prefix %q: %d of the keys bench would write under it exist already; bench writes only keys of its own (leave --prefix unset for a random one)", r.cfg.prefix, n)
	}
	return nil
}

// cleanup deletes every key the run may have written. After an
// interrupt it waits out the calls still in flight (a batched call and
// the cancel of a take whose caller gave up end within the store's
// timeout and a second), then deletes again.
func (r *benchRun) cleanup(ctx context.Context, budget time.Duration) (int64, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget)
	defer cancel()
	del := func() (int64, error) {
		return r.perKey(cctx, func(p redis.Pipeliner, k string) *redis.IntCmd { return p.Del(cctx, k) })
	}
	n, err := del()
	if err == nil && ctx.Err() != nil {
		r.logf("interrupted; deleting the bench keys again once calls in flight have ended")
		time.Sleep(redisstore.DefaultTimeout + 1200*time.Millisecond)
		var m int64
		m, err = del()
		n += m
	}
	if err != nil {
		return n, fmt.Errorf("deleting the bench keys under %s: %w (they expire by themselves within 15 days)", r.cfg.prefix, err)
	}
	r.logf("deleted %d keys under %s", n, r.cfg.prefix)
	return n, nil
}

// warm opens n connections, as a client in service has them open.
func warm(ctx context.Context, c redis.UniversalClient, n int) {
	done := make(chan struct{}, n)
	for range n {
		go func() { _ = c.Ping(ctx).Err(); done <- struct{}{} }()
	}
	for range n {
		<-done
	}
}

// poolSize is the client's connection pool size (per node on a Cluster).
func poolSize(c redis.UniversalClient) int {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().PoolSize
	case *redis.ClusterClient:
		return c.Options().PoolSize
	}
	return 0
}

// ceilings measures the take script's pipelined ceiling on each spread.
func (r *benchRun) ceilings(ctx context.Context) ([]benchCeiling, error) {
	var out []benchCeiling
	for _, n := range r.cfg.keys {
		v, err := loadgen.Ceiling(ctx, r.c, r.cfg.duration, loadgen.CeilingClients, loadgen.CeilingDepth,
			[]fleetrate.Limit{benchLimit}, func(i int) string { return r.key(i, n) })
		if err != nil {
			return nil, fmt.Errorf("ceiling over %d keys: %w", n, err)
		}
		r.step++
		r.logf("[%d/%d] ceiling keys=%d: %.0f takes/s", r.step, r.steps, n, v)
		out = append(out, benchCeiling{Keys: n, PerSecond: v})
	}
	return out, nil
}

// measureAll measures Allow with batching off and on, then Wait with the
// faster of the two, at each concurrency and spread, and the hot key
// through a lease at the highest concurrency.
func (r *benchRun) measureAll(ctx context.Context, ceilings []benchCeiling) ([]benchRow, error) {
	var rows []benchRow
	for ki, n := range r.cfg.keys {
		names := make([]string, n)
		for i := range names {
			names[i] = strconv.Itoa(i)
		}
		ceil := ceilings[ki].PerSecond
		for _, g := range r.cfg.concurrency {
			var best benchRow
			for _, conf := range []string{"unbatched", "batch", ""} {
				mode := "allow"
				if conf == "" {
					mode, conf = "wait", best.Config
				}
				row, err := r.cell(ctx, mode, conf, g, names, ceil)
				if row.Mode != "" {
					rows = append(rows, row)
				}
				if err != nil {
					return rows, err
				}
				if mode == "allow" && row.PerSecond > best.PerSecond {
					best = row
				}
			}
		}
		if n == 1 {
			row, err := r.cell(ctx, "allow", "lease", slices.Max(r.cfg.concurrency), names, ceil)
			if row.Mode != "" {
				rows = append(rows, row)
			}
			if err != nil {
				return rows, err
			}
		}
	}
	return rows, nil
}

// benchLimiter returns a Limiter over the run's client in config conf,
// with the store options serve would use for the same URL (behind
// Sentinel, EmptyAfterFailover), so that the figures and the advice are
// for what serve runs.
func (r *benchRun) benchLimiter(conf string) (*fleetrate.Limiter, error) {
	rs, err := redisstore.New(r.c, serveStoreOptions(r.cfg.redis, conf == "batch", 0))
	if err != nil {
		return nil, err
	}
	var st fleetrate.Store = rs
	if conf == "lease" {
		if st, err = lease.New(rs, lease.Options{Tokens: benchLeaseTokens}); err != nil {
			return nil, err
		}
	}
	return fleetrate.New(st, fleetrate.Config{Prefix: r.cfg.prefix, Limits: []fleetrate.Limit{benchLimit}})
}

// cell runs one measurement: mode (allow or wait) in config conf from g
// callers going round names.
func (r *benchRun) cell(ctx context.Context, mode, conf string, g int, names []string, ceil float64) (benchRow, error) {
	l, err := r.benchLimiter(conf)
	if err != nil {
		return benchRow{}, err
	}
	call := func(ctx context.Context, i int) error {
		_, err := l.Allow(ctx, names[i%len(names)])
		return err
	}
	if mode == "wait" {
		call = func(ctx context.Context, i int) error {
			_, err := l.WaitN(ctx, 1, names[i%len(names)])
			return err
		}
	}
	waits := poolWaits(r.c)
	m := loadgen.Measure(ctx, g, r.cfg.duration, call)
	if err := ctx.Err(); err != nil {
		return benchRow{}, err
	}
	row := benchRow{
		Mode: mode, Config: conf, Concurrency: g, Keys: len(names),
		PerSecond: m.Ops, OfCeiling: m.Ops / ceil,
		P50Micros: micros(m.P50), P99Micros: micros(m.P99),
		Errors: m.Errors, PoolWaits: poolWaits(r.c) - waits,
	}
	if m.FirstErr != nil {
		row.FirstError = m.FirstErr.Error()
	}
	r.step++
	r.logf("[%d/%d] %s %s callers=%d keys=%d: %.0f/s p50 %v p99 %v errors %d", r.step, r.steps, mode, conf, g, len(names),
		m.Ops, m.P50.Round(time.Microsecond), m.P99.Round(time.Microsecond), m.Errors)
	if m.Errors > 0 && m.Errors == m.Calls {
		// Not a measurement of the store but of its failure: Redis is
		// not answering, the rest of the run would measure the same, and
		// advice built on it would be wrong. Some calls failing (timeouts
		// on a loaded machine) is a finding instead (see adviseTimeout).
		return row, fmt.Errorf("%s %s at %d callers over %d keys: all %d calls failed (first: %v); stopped measuring",
			mode, conf, g, len(names), m.Calls, m.FirstErr)
	}
	return row, nil
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// poolWaits is how many times a caller has waited for a pooled connection.
func poolWaits(c redis.UniversalClient) int64 {
	if s := c.PoolStats(); s != nil {
		return int64(s.WaitCount)
	}
	return 0
}
