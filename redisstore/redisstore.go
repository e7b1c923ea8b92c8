// Package redisstore is the fleetrate.Store kept in Redis, shared by every
// process of a fleet. Each operation is one Lua script and so one round trip;
// the scripts read the server's clock (TIME), so workers' clocks never
// matter, and they implement exactly the algorithm of fleetrate.Decide.
//
// Any go-redis v9 client works: *redis.Client, *redis.ClusterClient,
// *redis.Ring, a failover (Sentinel) client or a redis.UniversalClient.
//
// Takes that many goroutines make at once share script calls (one call
// for up to 256 takes), each still with its own exact decision; a take
// that finds no call in flight is sent at once (see Options.Unbatched).
package redisstore

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/gcra"
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

// Client is the part of a go-redis v9 client the store uses. Every go-redis
// client type satisfies it.
type Client interface {
	redis.Scripter
	Del(ctx context.Context, keys ...string) *redis.IntCmd
	Get(ctx context.Context, key string) *redis.StringCmd
}

var (
	_ Client = (*redis.Client)(nil)
	_ Client = (*redis.ClusterClient)(nil)
	_ Client = (*redis.Ring)(nil)
	_ Client = redis.UniversalClient(nil)
)

// DefaultTimeout bounds every store call that has no shorter deadline.
const DefaultTimeout = 50 * time.Millisecond

// Options configure a Store. The zero value of each field means its
// default.
type Options struct {
	// Timeout bounds each call; a call whose context has an earlier
	// deadline keeps it. The default is DefaultTimeout (50 ms); a negative
	// value means no bound beyond the context's, except for calls shared
	// by several callers (batched or folded), which belong to no single
	// caller's context and so are bounded by DefaultTimeout or, if later,
	// the latest deadline of their callers' contexts.
	Timeout time.Duration
	// Unbatched makes every take its own script call. By default (and
	// with Batch) the takes that this process makes while earlier ones
	// are in flight, on any buckets, share one script call (per hash slot
	// on a Cluster), run one after the other at one instant: Redis then
	// parses one command and runs one script for many decisions, and the
	// client makes one round trip for them, so many concurrent callers
	// reach several times the throughput of one call per take. Each
	// caller still gets its own exact decision. A take that finds no call
	// in flight is sent at once, as an unbatched one, by its own caller, so
	// a single caller pays nothing for batching (docs/BENCHMARKS.md);
	// `fleetrate bench` measures both on your Redis.
	Unbatched bool
	// Batch asks for batching, which is the default (see Unbatched); it
	// takes precedence over FoldHotKeys and Unbatched.
	Batch bool
	// FoldHotKeys folds concurrent identical takes on one bucket in this
	// process into a single script call while one is in flight, so that a
	// hot bucket shared by many goroutines is not limited by how many
	// scripts one Redis core runs a second. Every caller still gets its own
	// exact decision and wait. Batching (the default) folds identical takes
	// within its calls too; FoldHotKeys instead of it keeps one call in
	// flight per bucket and shares calls only between identical takes.
	FoldHotKeys bool
	// EmptyAfterFailover makes every bucket start empty on a new master:
	// each script first checks that it runs on the master the store
	// expects (its replication ID), and after a failover (a Sentinel
	// promoting the replica) or a restart without persistence, the first
	// take of each bucket within FailoverWindow first empties it there,
	// until the last slot this process had booked on it. What the old
	// master granted after the replica's last copy is then not granted
	// again (docs/OPERATIONS.md, Sentinel). It costs Redis about 4 µs per
	// script call and one extra round trip per bucket per failover. Not
	// for Cluster or Ring clients, whose masters differ per key. It is the
	// default on a *redis.Client, plain or Sentinel's (failoverdefault.go).
	EmptyAfterFailover bool
	// KeepAfterFailover turns off the default EmptyAfterFailover of a
	// *redis.Client: buckets then start full on a new or restarted master.
	KeepAfterFailover bool
	// FailoverWindow is how long after a failover EmptyAfterFailover
	// empties buckets at their first take. The default is
	// DefaultFailoverWindow (1 minute).
	FailoverWindow time.Duration
	// ListenCheck is how long Listen waits without receiving anything on
	// its subscription before it pings Redis on it, and then how long it
	// waits for the answer (or any message) before it takes the
	// subscription for dead: it reports state(false) and subscribes again
	// on a new connection. A subscription that a NAT or load balancer
	// drops without closing it (no FIN, no reset) is so noticed within
	// 2 × ListenCheck of the last thing received on it. The default is
	// DefaultListenCheck (1 s).
	ListenCheck time.Duration
}

// Store is a fleetrate.Store in Redis. It is safe for concurrent use.
type Store struct {
	c       Client
	timeout time.Duration
	// listenCheck is Options.ListenCheck, or its default.
	listenCheck time.Duration
	// sc runs the scripts: c, or c behind the failover guard of
	// Options.EmptyAfterFailover, whose state is fo (nil without it).
	sc redis.Scripter
	fo *failover
	// direct is true when the client itself gives up at the context's
	// deadline (ContextTimeoutEnabled); otherwise each call runs on one of
	// runners, which the store stops waiting for at the deadline.
	direct  bool
	runners runners
	// cluster is true for a Cluster client, where the keys of one call must
	// share a hash slot.
	cluster bool
	// fold is set with Options.FoldHotKeys.
	fold sharer
	// batch is set with Options.Batch.
	batch sharer
	// target is the master a Cluster slot's migration last moved a
	// script's keys to (see onTarget).
	target atomic.Pointer[target]
	// addrs are the addresses the client dials, whose failed dials a
	// timeout names (see explain): a Client's, or a ClusterClient's seeds.
	addrs []string
}

var (
	_ fleetrate.Store      = (*Store)(nil)
	_ fleetrate.Binder     = (*Store)(nil)
	_ fleetrate.MultiClock = (*Store)(nil)
)

// MultipleClocks implements fleetrate.MultiClock: the masters of a Cluster
// and the shards of a Ring each time their own decisions.
func (s *Store) MultipleClocks() bool {
	switch s.c.(type) {
	case *redis.ClusterClient, *redis.Ring:
		return true
	}
	return false
}

// New returns a Store over c.
func New(c Client, opts Options) (*Store, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: redisstore: client must not be nil", fleetrate.ErrInvalid)
	}
	if v := reflect.ValueOf(c); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, fmt.Errorf("%w: redisstore: client must not be nil (a nil %T)", fleetrate.ErrInvalid, c)
	}
	_, cluster := c.(*redis.ClusterClient)
	s := &Store{c: c, sc: c, timeout: opts.Timeout, direct: respectsContext(c), cluster: cluster, addrs: dialled(c)}
	opts, err := failoverDefault(c, opts)
	if err != nil {
		return nil, err
	}
	if opts.EmptyAfterFailover {
		if err := s.guardFailovers(opts.FailoverWindow); err != nil {
			return nil, err
		}
	}
	if s.timeout == 0 {
		s.timeout = DefaultTimeout
	}
	switch {
	case opts.ListenCheck < 0:
		return nil, fmt.Errorf("%w: redisstore: ListenCheck must not be negative, got %v", fleetrate.ErrInvalid, opts.ListenCheck)
	case opts.ListenCheck == 0:
		s.listenCheck = DefaultListenCheck
	default:
		s.listenCheck = opts.ListenCheck
	}
	switch {
	case opts.Batch:
		s.batch = newBatcher(s)
	case opts.FoldHotKeys:
		s.fold = newFolder(s)
	case !opts.Unbatched:
		s.batch = newBatcher(s)
	}
	return s, nil
}

// respectsContext reports whether c abandons a command at its context's
// deadline. go-redis does so only with ContextTimeoutEnabled; without it a
// hung server holds the caller for the client's ReadTimeout (3 s by
// default).
func respectsContext(c Client) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// bounded runs f within ctx's deadline, whatever the client's own
// settings: when the client would not give up in time, f runs on a runner
// that is abandoned at the deadline (and runs no other call until f
// returns).
func (s *Store) bounded(ctx context.Context, f func(context.Context) error) error {
	if s.direct {
		return f(ctx)
	}
	done := make(chan error, 1)
	s.runners.start(func() { done <- f(ctx) })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// cancelAbandoned gives back the bookings of shared calls' takes whose
// callers gave up after the store had granted them, latest first, so that
// each cancel finds its booking the latest and gets its tokens back (see
// gcra.Cancel): best effort, bounded by a second.
func (s *Store) cancelAbandoned(calls []*batchCall) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for i := len(calls) - 1; i >= 0; i-- {
		c := calls[i]
		// Its caller never saw the grant, so never acted on it: given
		// back whether or not its slot has begun.
		_ = s.cancel(ctx, c.req.Buckets, c.req.N, c.booking, math.MaxInt64)
	}
}

func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.timeout < 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.timeout)
}

// unavailable wraps a Redis failure so that callers see ErrStoreUnavailable.
// failed reports err, the failure of a call made for a caller whose
// context is caller: when the caller's context ended (cancelled, or its
// own deadline passed) the error is the context's, not the store's, so
// that errors.Is(err, context.Canceled) holds and failure policies do not
// count the caller's choice as an outage.
func failed(caller context.Context, op string, err error) error {
	if cerr := ended(caller); cerr != nil {
		return fmt.Errorf("redisstore: %s: %w", op, cerr)
	}
	return unavailable(op, err)
}

// ended returns ctx's error, or context.DeadlineExceeded once its deadline
// has passed even if ctx does not say so yet: a call bounded by that
// deadline has a timer of its own (see boundCall), which may fire, and
// fail the call, before the context's does.
func ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

func unavailable(op string, err error) error {
	return fmt.Errorf("%w: redis %s: %w", fleetrate.ErrStoreUnavailable, op, err)
}

// sameSlot checks, on a Cluster, that the keys of one atomic call share a
// hash slot, so that a caller's mistake is an ErrInvalid naming the keys,
// not a CROSSSLOT failure reported as an unavailable store.
func (s *Store) sameSlot(keys []string) error {
	if !s.cluster || len(keys) < 2 {
		return nil
	}
	first := Slot(keys[0])
	for _, k := range keys[1:] {
		if Slot(k) != first {
			return fmt.Errorf("%w: keys %q and %q are on different Redis Cluster slots; give buckets taken together a common {hash tag}", fleetrate.ErrInvalid, keys[0], k)
		}
	}
	return nil
}

// storeKeys returns each bucket's store key.
func storeKeys(buckets []fleetrate.Bucket) []string {
	keys := make([]string, len(buckets))
	for i, b := range buckets {
		keys[i] = b.StoreKey()
	}
	return keys
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

// Take implements fleetrate.Store.
func (s *Store) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if err := req.Validate(); err != nil {
		return fleetrate.Result{}, err
	}
	res, err := s.take(ctx, req)
	return res, s.explain(err)
}

// dialled returns the addresses c dials, as far as its options tell: a
// Client's one, a ClusterClient's seeds; none for other clients.
func dialled(c Client) []string {
	switch c := c.(type) {
	case *redis.Client:
		return []string{c.Options().Addr}
	case *redis.ClusterClient:
		return c.Options().Addrs
	}
	return nil
}

// explain adds to a store failure that timed out the latest failed dial
// to the store's Redis, if one failed in the last few seconds: a client
// built with ClientOptions dials in the background while the call waits,
// so the call's own error says only that its deadline passed.
func (s *Store) explain(err error) error {
	if err == nil || len(s.addrs) == 0 || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, fleetrate.ErrStoreUnavailable) {
		return err
	}
	if cause := dialCause(s.addrs); cause != "" {
		return fmt.Errorf("%w (%s)", err, cause)
	}
	return err
}

// take is Take for a validated request.
func (s *Store) take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if s.fo != nil {
		return s.fo.take(ctx, s, req, s.route)
	}
	return s.route(ctx, req)
}

// route sends a take through its batcher, or on its own.
func (s *Store) route(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if q := s.queue(req.N); q != nil {
		return q.take(ctx, req)
	}
	return s.takeOne(ctx, req)
}

// queue returns the batcher a take of n tokens shares calls through, or
// nil when it makes its own call.
func (s *Store) queue(n int64) sharer {
	if s.batch != nil {
		return s.batch
	}
	if s.fold != nil && n > 0 {
		return s.fold
	}
	return nil
}

// Bind implements fleetrate.Binder: a Limiter's Allow and Peek then skip
// building and checking a request of their own, and a batched take copies
// nothing but its key.
func (s *Store) Bind(prefix string, limits []fleetrate.Limit) (fleetrate.BoundTaker, error) {
	b := fleetrate.Bucket{Prefix: prefix, Key: "*", Limits: slices.Clone(limits)}
	if err := fleetrate.ValidateBuckets([]fleetrate.Bucket{b}); err != nil {
		return nil, err
	}
	largs := appendTakeLimits(nil, []fleetrate.Bucket{b})
	return &bound{s: s, b: b, largs: largs}, nil
}

// bound is a Store bound to one prefix and one list of validated limits.
type bound struct {
	s     *Store
	b     fleetrate.Bucket // Key is set per take
	largs []any            // b's limits as script arguments
}

// TakeKey implements fleetrate.BoundTaker.
func (t *bound) TakeKey(ctx context.Context, key string, n int64, maxWait time.Duration) (fleetrate.Result, error) {
	res, err := t.takeKey(ctx, key, n, maxWait)
	return res, t.s.explain(err)
}

// takeKey is TakeKey before its error is explained.
func (t *bound) takeKey(ctx context.Context, key string, n int64, maxWait time.Duration) (fleetrate.Result, error) {
	if q := t.s.queue(n); q != nil && t.s.fo == nil {
		return q.takeKey(ctx, t.b, key, n, maxWait, t.largs)
	}
	b := t.b
	b.Key = key
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: n, MaxWait: maxWait}
	if err := req.Validate(); err != nil {
		return fleetrate.Result{}, err
	}
	if t.s.fo != nil {
		return t.s.take(ctx, req)
	}
	return t.s.takeOne(ctx, req)
}

// takeOne runs one take of an already validated request in one call of
// the take script.
func (s *Store) takeOne(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	c := s.boundCall(ctx)
	keys := c.key[:]
	if len(req.Buckets) == 1 {
		c.key[0] = req.Buckets[0].StoreKey()
	} else {
		keys = storeKeys(req.Buckets)
		if err := s.sameSlot(keys); err != nil {
			c.release()
			return fleetrate.Result{}, err
		}
	}
	c.args = appendTakeArgs(c.args, req.N, req.MaxWait, req.Buckets)
	return s.sendTake(ctx, c, req, keys)
}

// boundCall returns the context, bounded by the store's timeout, and the
// scratch of one call made for a caller whose context is ctx.
func (s *Store) boundCall(ctx context.Context) *callCtx {
	return boundCall(ctx, s.timeout)
}

// sendTake sends one call of the take script for req, with c's
// arguments and keys, and releases c.
func (s *Store) sendTake(ctx context.Context, c *callCtx, req fleetrate.Request, keys []string) (fleetrate.Result, error) {
	defer c.release() // after the decision: req may be in c's scratch
	reply, err := s.runTake(c.context(), keys, c.args)
	if err != nil {
		return fleetrate.Result{}, failed(ctx, "take", err)
	}
	return decodeTake(req, reply)
}

// runTake runs the take script once within ctx. The reply is read only
// on success: an abandoned call (see bounded) may still write it.
func (s *Store) runTake(ctx context.Context, keys []string, args []any) ([]int64, error) {
	if s.direct {
		return s.eval(ctx, takeScript, keys, args...).Int64Slice()
	}
	var reply []int64
	err := s.bounded(ctx, func(ctx context.Context) (err error) {
		reply, err = s.eval(ctx, takeScript, keys, args...).Int64Slice()
		return err
	})
	if err != nil {
		return nil, err
	}
	return reply, nil
}

// decodeTake checks and replays the take script's reply for req.
// It is decodeReply for one take, with the decision kept on the stack.
func decodeTake(req fleetrate.Request, reply []int64) (fleetrate.Result, error) {
	if len(reply) < 1 {
		return fleetrate.Result{}, unavailable("take", errors.New("take script reply: empty"))
	}
	booking := req.Booking
	var one [1]fleetrate.Result
	rs, rest, err := replay(req, reply[0], reply[1:], 1, one[:0], func(int) *fleetrate.Booking { return booking })
	if err != nil {
		return fleetrate.Result{}, err
	}
	if len(rest) != 0 {
		return fleetrate.Result{}, unavailable("take", fmt.Errorf("take script reply: %d unexpected values at the end", len(rest)))
	}
	return rs[0], nil
}

// decodeReply checks and replays the reply of the take script or the
// batch script: now_us, then for each of n takes its decisions and the
// debts before them (see replay). take(i) gives the i-th take's request,
// its count and where its decisions go: into the slice's own backing when
// it has room, else into a new one. A reply the client does not agree with
// fails every take: no part of it can be trusted.
func decodeReply(reply []int64, n int, take func(i int) (fleetrate.Request, int, *[]fleetrate.Result, func(int) *fleetrate.Booking)) error {
	if len(reply) < 1 {
		return unavailable("take", errors.New("take script reply: empty"))
	}
	now, rest := reply[0], reply[1:]
	for i := range n {
		req, count, rs, book := take(i)
		var err error
		if *rs, rest, err = replay(req, now, rest, count, *rs, book); err != nil {
			return err
		}
	}
	if len(rest) != 0 {
		return unavailable("take", fmt.Errorf("take script reply: %d unexpected values at the end", len(rest)))
	}
	return nil
}

// replay reads one take's part of a script's reply, the number of
// decisions the script made for count identical takes of req and the debts
// of req's buckets before them, and returns those decisions and the rest of
// the reply. It makes the decisions again with fleetrate.Decide from that
// state, at the script's instant now (µs): the scripts mirror Decide, so
// the replay is exact, and a script need not report anything per decision.
// A reply the replay does not agree with is an error, never a decision.
func replay(req fleetrate.Request, now int64, reply []int64, count int, out []fleetrate.Result, book func(int) *fleetrate.Booking) ([]fleetrate.Result, []int64, error) {
	bad := func(format string, a ...any) ([]fleetrate.Result, []int64, error) {
		return nil, nil, unavailable("take", fmt.Errorf("take script reply: "+format, a...))
	}
	if len(reply) < 1 {
		return bad("ends early")
	}
	made, pos := reply[0], 1
	if made < 1 || made > int64(count) {
		return bad("%d decisions for %d takes", made, count)
	}
	var one [1]gcra.State
	states := one[:]
	if len(req.Buckets) > 1 {
		states = make([]gcra.State, len(req.Buckets))
	}
	for b, bk := range req.Buckets {
		m := len(bk.Limits)
		if len(reply) < pos+m {
			return bad("ends early")
		}
		debts := reply[pos : pos+m : pos+m]
		for _, d := range debts {
			if d < 0 {
				return bad("negative debt %d", d)
			}
		}
		states[b] = gcra.State{Stamp: now, Debts: debts}
		pos += m
	}
	if cap(out) < int(made) {
		out = make([]fleetrate.Result, made)
	}
	out = out[:made]
	for i := range out {
		req.Booking = book(i)
		out[i], _ = gcra.Decide(now, req, states)
		last := i == len(out)-1
		if !out[i].Allowed && !last || out[i].Allowed && last && made < int64(count) {
			return bad("decision %d of %d is allowed=%v on replay", i+1, made, out[i].Allowed)
		}
	}
	return out, reply[pos:], nil
}

// Refund implements fleetrate.Store.
func (s *Store) Refund(ctx context.Context, buckets []fleetrate.Bucket, n int64, at time.Time) error {
	if err := fleetrate.ValidateRefund(buckets, n, at); err != nil {
		return err
	}
	return s.run(ctx, "refund", refundScript, buckets, appendTakeLimits([]any{n, at.UnixMicro()}, buckets))
}

// Cancel implements fleetrate.Store.
func (s *Store) Cancel(ctx context.Context, buckets []fleetrate.Bucket, n int64, b fleetrate.Booking) error {
	if err := fleetrate.ValidateCancel(buckets, n, b); err != nil {
		return err
	}
	return s.cancel(ctx, buckets, n, b, gcra.BookedWait(buckets, b.Debts))
}

// cancel is Cancel of a booking whose slot began wait ns after its stamp:
// after that, nothing goes back.
func (s *Store) cancel(ctx context.Context, buckets []fleetrate.Bucket, n int64, b fleetrate.Booking, wait int64) error {
	args := make([]any, 3, 3+len(buckets)*3+len(b.Debts)*3)
	args[0], args[1], args[2] = n, b.Stamp, wait
	off := 0
	for i := range buckets {
		args = appendLimits(args, buckets[i:i+1])
		for _, d := range b.Debts[off : off+len(buckets[i].Limits)] {
			args = append(args, d)
		}
		off += len(buckets[i].Limits)
	}
	return s.run(ctx, "cancel", cancelScript, buckets, args)
}

// Drain implements fleetrate.Store.
func (s *Store) Drain(ctx context.Context, buckets []fleetrate.Bucket, d time.Duration) error {
	if d < 0 || d > fleetrate.MaxWaitCap {
		return fmt.Errorf("%w: drain duration must be between 0 and %v, got %v", fleetrate.ErrInvalid, fleetrate.MaxWaitCap, d)
	}
	if err := fleetrate.ValidateBuckets(buckets); err != nil {
		return err
	}
	return s.run(ctx, "drain", drainScript, buckets, appendLimits([]any{int64(d)}, buckets))
}

// run runs a script that changes buckets (already validated), with args
// as its ARGV, and returns nothing the client needs, within the store's
// timeout. The buckets must share a hash slot.
func (s *Store) run(ctx context.Context, op string, script *redis.Script, buckets []fleetrate.Bucket, args []any) error {
	keys := storeKeys(buckets)
	if err := s.sameSlot(keys); err != nil {
		return err
	}
	sctx, cancel := s.ctx(ctx)
	defer cancel()
	err := s.bounded(sctx, func(ctx context.Context) error {
		return s.eval(ctx, script, keys, args...).Err()
	})
	if err != nil {
		return s.explain(failed(ctx, op, err))
	}
	return nil
}

// Reset implements fleetrate.Store. Each key is deleted on its own so that
// keys on different Cluster slots work.
func (s *Store) Reset(ctx context.Context, keys ...string) error {
	sctx, cancel := s.ctx(ctx)
	defer cancel()
	err := s.bounded(sctx, func(ctx context.Context) error {
		for _, k := range keys {
			if err := s.c.Del(ctx, k).Err(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return s.explain(failed(ctx, "reset", err))
	}
	return nil
}

// State reads the stored state of a bucket, for tests and debugging. ok is
// false when the key is absent (a full bucket).
func (s *Store) State(ctx context.Context, key string) (st gcra.State, ok bool, err error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var raw string
	err = s.bounded(ctx, func(ctx context.Context) (err error) {
		raw, err = s.c.Get(ctx, key).Result()
		return err
	})
	if errors.Is(err, redis.Nil) {
		return st, false, nil
	}
	if err != nil {
		return st, false, unavailable("get", err)
	}
	if st, ok = parseState(raw); !ok {
		return st, false, fmt.Errorf("redisstore: key %q holds %q, not a bucket", key, raw)
	}
	return st, true, nil
}

// parseState reads a bucket's value as the scripts do: a one-limit value
// "g #" and three little-endian doubles (stamp, debt, fill), or the text
// "<stamp> <debt> -<fill> ..." (or "<stamp> <debt> ..." as older versions
// wrote it).
func parseState(raw string) (gcra.State, bool) {
	if st, ok, bin := parseOneLimit(raw); bin {
		return st, ok
	}
	f := strings.Fields(raw)
	if len(f) < 2 {
		return gcra.State{}, false
	}
	nums := make([]int64, len(f))
	for i, x := range f {
		var err error
		if nums[i], err = strconv.ParseInt(x, 10, 64); err != nil {
			return gcra.State{}, false
		}
	}
	st := gcra.State{Stamp: nums[0]}
	vals := nums[1:]
	if n := len(vals); n >= 4 && n%2 == 0 && vals[1] < 0 && vals[n-2] > 0 && vals[n-1] > 0 {
		// "<stamp> <debt> -<fill> ... <anchor> <horizon>": anchored.
		st.Anchor, st.Horizon, vals = vals[n-2], vals[n-1], vals[:n-2]
	}
	if len(vals)%2 == 0 && vals[1] < 0 {
		for i := 0; i < len(vals); i += 2 {
			if vals[i] < 0 || vals[i+1] >= 0 {
				return gcra.State{}, false
			}
			st.Debts, st.Fills = append(st.Debts, vals[i]), append(st.Fills, -vals[i+1])
		}
		return st, true
	}
	for _, v := range vals {
		if v < 0 {
			return gcra.State{}, false
		}
	}
	st.Debts = vals
	return st, true
}

// oneLimitTag starts the binary value of a one-limit bucket (see
// scripts/take_one.lua), anchoredTag that of an anchored one (two more
// doubles, the anchor and the horizon: see gcra.State.Anchor).
const (
	oneLimitTag = "g #"
	anchoredTag = "g $"
)

// parseOneLimit reads the binary value of a one-limit bucket. bin reports
// whether raw is one (by its tag and length); ok, whether it holds a
// valid state: three integers below 2^53 (five when anchored), the stamp
// and debt not negative and the fill time positive.
func parseOneLimit(raw string) (st gcra.State, ok, bin bool) {
	var v [5]int64
	n := 3
	switch {
	case len(raw) == len(oneLimitTag)+24 && strings.HasPrefix(raw, oneLimitTag):
	case len(raw) == len(anchoredTag)+40 && strings.HasPrefix(raw, anchoredTag):
		n = 5
	default:
		return st, false, false
	}
	for i := range n {
		f := math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[len(oneLimitTag)+8*i:])))
		if f != math.Trunc(f) || f < 0 || f >= 1<<53 {
			return st, false, true
		}
		v[i] = int64(f)
	}
	if v[2] == 0 {
		return st, false, true
	}
	return gcra.State{Stamp: v[0], Debts: []int64{v[1]}, Fills: []int64{v[2]}, Anchor: v[3], Horizon: v[4]}, true, true
}
