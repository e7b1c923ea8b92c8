package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
)

var (
	//go:embed scripts/common.lua
	commonLua string
	//go:embed scripts/take_one.lua
	takeOneLua string
	//go:embed scripts/take.lua
	takeLua string
	//go:embed scripts/take_batch.lua
	batchLua string
	//go:embed scripts/refund.lua
	refundLua string
	//go:embed scripts/cancel.lua
	cancelLua string
	//go:embed scripts/drain.lua
	drainLua string
	//go:embed scripts/settle.lua
	settleLua string
	//go:embed scripts/permits.lua
	permitsLua string
	//go:embed scripts/take_ext.lua
	takeExtLua string
	//go:embed scripts/release.lua
	releaseLua string
	//go:embed scripts/renew.lua
	renewLua string
	//go:embed scripts/fill.lua
	fillLua string
)

// The scripts, each with the shared helpers prepended; the take script
// starts with the path of a one-limit bucket, which needs none of them.
// redis.Script runs EVALSHA and falls back to EVAL on NOSCRIPT, so an empty
// script cache after a restart, SCRIPT FLUSH or failover costs one extra
// round trip and no error.
var (
	takeScript   = redis.NewScript(takeOneLua + commonLua + takeLua)
	batchScript  = redis.NewScript(commonLua + batchLua)
	refundScript = redis.NewScript(commonLua + refundLua)
	drainScript  = redis.NewScript(commonLua + drainLua)
	cancelScript = redis.NewScript(commonLua + cancelLua)
	settleScript = redis.NewScript(commonLua + settleLua)
	// The scripts of costs by bucket and in-flight permits.
	takeExtScript = redis.NewScript(commonLua + permitsLua + takeExtLua)
	releaseScript = redis.NewScript(commonLua + permitsLua + releaseLua)
	renewScript   = redis.NewScript(commonLua + permitsLua + renewLua)
	fillScript    = redis.NewScript(commonLua + permitsLua + fillLua)
)

// scripts lists every script with its source: LoadScripts sends the
// sources (redis.Script.Load would set the shared script's hash to the
// one the server answers, which behind the failover guard is the guarded
// twin's, and every store of the process would then send that hash
// unguarded), and the guard finds each twin by either.
var scripts = []struct {
	script *redis.Script
	src    string
	// take is set for the scripts that grant tokens (see guardedScript).
	take bool
}{
	{takeScript, takeOneLua + commonLua + takeLua, true},
	{batchScript, commonLua + batchLua, true},
	{refundScript, commonLua + refundLua, false},
	{drainScript, commonLua + drainLua, false},
	{cancelScript, commonLua + cancelLua, false},
	{settleScript, commonLua + settleLua, false},
	{takeExtScript, commonLua + permitsLua + takeExtLua, true},
	{releaseScript, commonLua + permitsLua + releaseLua, false},
	{renewScript, commonLua + permitsLua + renewLua, false},
	{fillScript, commonLua + permitsLua + fillLua, false},
}

// loadScripts loads every script's source into the script cache of the
// server behind s.sc (the guarded twins, behind the failover guard).
func (s *Store) loadScripts(ctx context.Context) error {
	for _, sc := range scripts {
		if err := s.sc.ScriptLoad(ctx, sc.src).Err(); err != nil {
			return err
		}
	}
	return nil
}

// TakeScriptSHA returns the SHA1 of the take script, for tools that run
// it directly (such as the benchmark's redis-benchmark ceiling).
func TakeScriptSHA() string { return takeScript.Hash() }

// TakeScriptArgs returns the ARGV of the take script (see TakeScriptSHA)
// for one take of n tokens now from one bucket with limits, in the layout
// the store itself sends, so that a tool running the script directly
// measures exactly the store's call.
func TakeScriptArgs(n int64, limits []fleetrate.Limit) []any {
	return takeArgs(n, 0, []fleetrate.Bucket{{Limits: limits}})
}

// takeArgs returns the ARGV of the take script for one take of n tokens
// from buckets (with their reserves), booked up to maxWait ahead.
func takeArgs(n int64, maxWait time.Duration, buckets []fleetrate.Bucket) []any {
	return appendTakeArgs(nil, n, maxWait, buckets)
}

// appendTakeArgs appends takeArgs(n, maxWait, buckets) to args.
func appendTakeArgs(args []any, n int64, maxWait time.Duration, buckets []fleetrate.Bucket) []any {
	size := len(args) + 3
	for _, b := range buckets {
		size += 2 + 2*len(b.Limits) // count, limits, reserve
	}
	args = slices.Grow(args, size-len(args))
	args = append(args, n, int64(maxWait), 1)
	return appendTakeLimits(args, buckets)
}

// appendLimits appends each bucket's limits to args in the layout the
// scripts read.
func appendLimits(args []any, buckets []fleetrate.Bucket) []any {
	for _, b := range buckets {
		args = append(args, len(b.Limits))
		for _, l := range b.Limits {
			args = append(args, l.Interval(), l.Burst)
		}
	}
	return args
}

// appendTakeLimits is appendLimits for a take: each bucket's limits are
// followed by its reserve.
func appendTakeLimits(args []any, buckets []fleetrate.Bucket) []any {
	for i := range buckets {
		args = appendLimits(args, buckets[i:i+1])
		args = append(args, buckets[i].Reserve)
	}
	return args
}

// LoadScripts loads every script into the server's script cache (on a
// Cluster client, into every master), so that the first calls need no EVAL
// fallback. It is optional: a missing script is always reloaded on demand.
func (s *Store) LoadScripts(ctx context.Context) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	err := s.bounded(ctx, s.loadScripts)
	if err != nil {
		return unavailable("script load", err)
	}
	return nil
}

// Warm readies the store for its first decisions: it loads every script
// (see LoadScripts) and, on a *redis.Client, opens the client's
// MinIdleConns connections (2 × GOMAXPROCS when unset, at most its
// PoolSize) and leaves them idle in its pool. A cold process that decides
// at once otherwise spends its first calls dialling and loading scripts,
// which on a loaded machine can pass the timeout: fail-closed callers see
// those as errors. Call it once after New, with a deadline of a second or
// so; it is bounded by ctx alone, not by Options.Timeout.
func (s *Store) Warm(ctx context.Context) error {
	err := s.bounded(ctx, func(ctx context.Context) error {
		if err := s.loadScripts(ctx); err != nil {
			return err
		}
		if c, ok := s.c.(*redis.Client); ok {
			return openConns(ctx, c)
		}
		return nil
	})
	if err != nil {
		return unavailable("warm-up", err)
	}
	return nil
}

// openConns opens c's MinIdleConns connections (see Warm) at once, each
// checked with a PING, and puts them back in c's pool.
func openConns(ctx context.Context, c *redis.Client) error {
	o := c.Options()
	n := o.MinIdleConns
	if n <= 0 {
		n = 2 * runtime.GOMAXPROCS(0)
	}
	n = min(n, o.PoolSize)
	conns := make([]*redis.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range conns {
		conns[i] = c.Conn()
		wg.Go(func() { errs[i] = conns[i].Ping(ctx).Err() })
	}
	wg.Wait()
	for _, cn := range conns {
		_ = cn.Close() // back to the pool, idle
	}
	return errors.Join(errs...)
}
