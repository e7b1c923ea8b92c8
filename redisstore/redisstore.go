// Package redisstore is the fleetrate.Store kept in Redis, shared by every
// process of a fleet. Each operation is one Lua script and so one round trip;
// the scripts read the server's clock (TIME), so workers' clocks never
// matter, and they compute exactly the answers of gcra.Decide (package gcra).
//
// Any go-redis v9 client works: *redis.Client, *redis.ClusterClient,
// *redis.Ring, a failover (Sentinel) client or a redis.UniversalClient.
//
// Takes that many goroutines make at once share script calls (one call
// for up to 256 takes), each still with its own exact decision; a take
// that finds no call in flight is sent at once (see Options.Unbatched).
//
// A take with costs by bucket (Request.Costs) or an in-flight bound
// (Bucket.InFlight) runs a script of its own, never batched. A bucket's
// permits live in keys beside its own, on its Cluster slot (see
// Store.Release), and Release tells the processes whose takes wait for a
// permit, over Redis pub/sub (see NotifyPermit).
package redisstore

import (
	"context"
	"fmt"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
)

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
	// again (docs/OPERATIONS.md, Sentinel). A bucket with an in-flight
	// bound has its permits counted as held there until the longest lease
	// could have ended (failover_permits.go). It costs Redis about 4 µs per
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
	// FailoverMargin is how much longer than this process's own bookings
	// EmptyAfterFailover keeps a bucket empty on a new master. The
	// processes of a fleet hear of a failover at different moments, and
	// until the last has left the old master, the old master grants to
	// it: up to its rate for that lag, which a bucket emptied only as
	// the first process arrives would grant again on the new master. The
	// margin withholds the rate for that long instead. The default is
	// DefaultFailoverMargin (500 ms) on a Sentinel failover client
	// (redis.NewFailoverClient) and none on others, whose new master is
	// a restart: the old one no longer grants. Negative means none.
	FailoverMargin time.Duration
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
	// notices are the takes waiting for a permit (see NotifyPermit).
	notices notices
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
		margin := opts.FailoverMargin
		if margin == 0 && !sentinelClient(c) {
			// Only a failover has an old master granting after the
			// switch; a restarted one is gone.
			margin = -1
		}
		if err := s.guardFailovers(opts.FailoverWindow, margin); err != nil {
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

// sentinelClient reports whether c is a Sentinel failover client, which
// go-redis names by the address "FailoverClient".
func sentinelClient(c Client) bool {
	rc, ok := c.(*redis.Client)
	return ok && rc.Options().Addr == "FailoverClient"
}
