package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// While a Redis Cluster slot migrates, Redis runs a command on several keys
// of the slot only when all of them exist on one node: the source, where
// every key starts, or the target (after ASKING), where MIGRATE moves them
// one batch at a time. Otherwise it answers TRYAGAIN, and it would do so
// until the slot has moved, seconds for a slot of many keys. A full bucket
// has no key, so every script on several buckets (a take of any kind,
// booked or not, batched or not, a peek, a refund, a cancel, a drain) would
// fail for the whole migration. A command on one key always works: go-redis
// follows the ASK redirect to wherever its key is.
//
// So a script on several keys of a migrating slot first gathers its keys
// on the target, then runs there, as one script, exactly as anywhere else:
//
//   - the source moves the keys it still holds to the target (MIGRATE
//     ... KEYS, the command the migration itself sends for every key of
//     the slot: the migration later skips the keys already moved);
//   - every key still absent is written on the target as a full bucket
//     (placeholder, SET NX with a TTL, after ASKING), which every script
//     reads exactly as an absent key;
//   - the script then runs on the target, where all its keys now are.
//
// No decision is made apart from the others, so every limit stays exact.
// This needs the MIGRATE command (a user whose ACL forbids it, or a service
// that renames it, gets the TRYAGAIN retried until the call's deadline,
// which succeeds only if the migration happens to move the keys in time).

// placeholder is the value of an absent bucket gathered on a migration's
// target: stamp 0 and one debt of 0, which the scripts (and parseState)
// read as a full bucket whatever its limits.
const placeholder = "0 0"

// placeholderTTL is how long a placeholder lives: long enough for the
// script it was written for to run after it, on a loaded machine too. A
// take that books the bucket rewrites it with the bucket's own TTL.
const placeholderTTL = 10 * time.Second

// migrateTimeout is the timeout, in ms, that a MIGRATE of a script's keys
// gives the target. It is not the call's own deadline, which bounds only
// how long the store waits: a MIGRATE that times out may leave a key on
// both nodes (Redis then cannot finish the migration: BUSYKEY), so the
// source gets the time a migration itself gives a batch of keys.
const migrateTimeout = 5000

// migratingFor bounds the retries of a script whose slot migrates when
// its call has no deadline of its own.
const migratingFor = time.Second

// eval runs script on keys with args. A script on several keys of a Redis
// Cluster goes to its slot's master and, when the slot migrates, gathers
// its keys on the target and runs there (see above), within ctx.
func (s *Store) eval(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	cc, ok := s.c.(*redis.ClusterClient)
	if !ok || len(keys) < 2 {
		// s.sc: behind the failover guard of EmptyAfterFailover, if set
		// (never for a Cluster, whose masters differ per key).
		return script.Run(ctx, s.sc, keys, args...)
	}
	// The slot's master itself, rather than the Cluster client, which
	// would retry TRYAGAIN after back-offs of tens of milliseconds with
	// the keys still apart.
	src, err := cc.MasterForKey(ctx, keys[0])
	if err != nil {
		return script.Run(ctx, cc, keys, args...)
	}
	cmd := script.Run(ctx, src, keys, args...)
	err = cmd.Err()
	if err == nil || ctx.Err() != nil {
		return cmd
	}
	if !migrating(err) {
		if rerouted(err) {
			// The slot moved, or the node failed or is not a master now:
			// the Cluster client follows the slot and retries as it
			// always does.
			return script.Run(ctx, cc, keys, args...)
		}
		return cmd // the script's own error
	}
	return s.evalMigrating(ctx, cc, src, script, keys, args, err)
}

// evalMigrating is eval once the slot's master src answered err, TRYAGAIN
// or ASK: it gathers the keys on the target and runs there, until ctx
// ends (or migratingFor passes, when ctx has no deadline).
func (s *Store) evalMigrating(ctx context.Context, cc *redis.ClusterClient, src *redis.Client, script *redis.Script, keys []string, args []any, err error) *redis.Cmd {
	if _, ok := ctx.Deadline(); !ok {
		// A store without a timeout, called without a deadline: the keys
		// may stay apart (MIGRATE forbidden, the migration stalled), so
		// the retries end after migratingFor.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, migratingFor)
		defer cancel()
	}
	var cmd *redis.Cmd
	for {
		if addr, ask := redis.IsAskError(err); ask {
			// The source holds none of the keys: run on the target in
			// one round trip, the absent keys written there first.
			if c := s.onTarget(ctx, cc, addr, script, keys, args); c != nil && !migrating(c.Err()) {
				return c
			}
		}
		gather(ctx, cc, src, keys)
		cmd = script.Run(ctx, cc, keys, args...)
		if err = cmd.Err(); !migrating(err) {
			return cmd
		}
		if ctx.Err() != nil {
			break
		}
		// The keys moved apart again (a placeholder expired, another
		// client gathered them): again, shortly.
		t := time.NewTimer(time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		if ctx.Err() != nil {
			break
		}
	}
	// Out of time with the keys still apart: the error is the deadline's,
	// naming the migration.
	cmd.SetErr(fmt.Errorf("%w (its slot migrating: %w)", ctx.Err(), err))
	return cmd
}

// migrating reports whether err is what a script on several keys meets
// while its slot migrates: TRYAGAIN, or an ASK redirect (left over when
// go-redis spent its redirects retrying TRYAGAIN, or from the source
// itself, which redirects a script none of whose keys it holds).
func migrating(err error) bool {
	_, ask := redis.IsAskError(err)
	return ask || redis.IsTryAgainError(err)
}

// rerouted reports whether err means that the script did not run on the
// node it was sent to and belongs to the Cluster client's own retries: a
// failed connection, or a reply that names a moved slot or a node not
// serving (MOVED, CLUSTERDOWN, READONLY after a failover, LOADING,
// MASTERDOWN). A script's own error (such as its WRONGTYPE) is not.
func rerouted(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return true
	}
	msg := err.Error()
	for _, p := range []string{"MOVED ", "CLUSTERDOWN ", "READONLY ", "LOADING ", "MASTERDOWN "} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// gather moves the keys that src, the master that owned their slot when
// the call began, still holds to the target of the slot's migration, and
// writes every key absent there as a placeholder (see above). It is best
// effort: what it could not do shows as TRYAGAIN in the script that
// follows.
func gather(ctx context.Context, cc *redis.ClusterClient, src *redis.Client, keys []string) {
	held, target := locate(ctx, src, keys)
	if target == "" {
		return // src no longer migrates the slot, or holds every key
	}
	if len(held) > 0 {
		host, port, err := net.SplitHostPort(target)
		if err != nil {
			return
		}
		// REPLACE: a copy that an earlier MIGRATE left on the target when
		// it failed half way is stale (the source holds the key, so no
		// script ran on that copy) and gives way.
		args := append([]any{"migrate", host, port, "", 0, migrateTimeout, "replace", "keys"}, held...)
		if src.Do(ctx, args...).Err() != nil {
			return
		}
	}
	// Straight to the target, each key after ASKING (the target serves a
	// slot it imports only to a client that says it was redirected), all
	// in one round trip: none of the keys is on the source now, and the
	// source never creates a key while its slot migrates.
	dst := master(ctx, cc, target)
	if dst == nil {
		// The source names the target by an address the Cluster client
		// does not use: key by key through the Cluster client, which
		// the source redirects (ASK).
		for _, k := range keys {
			cc.SetArgs(ctx, k, placeholder, redis.SetArgs{Mode: "NX", TTL: placeholderTTL})
		}
		return
	}
	pipe := dst.Pipeline()
	for _, k := range keys {
		pipe.Do(ctx, "asking")
		pipe.SetArgs(ctx, k, placeholder, redis.SetArgs{Mode: "NX", TTL: placeholderTTL})
	}
	_, _ = pipe.Exec(ctx) // NX answers nil for a key that is there
}

// locate returns the keys that src holds and the address of the node its
// slot migrates to ("" when src does not migrate it or holds every key):
// EXISTS on the source answers 1 for a key it holds and, for a key it does
// not, an ASK redirect naming the target.
func locate(ctx context.Context, src *redis.Client, keys []string) (held []any, target string) {
	pipe := src.Pipeline()
	exists := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		exists[i] = pipe.Exists(ctx, k)
	}
	_, _ = pipe.Exec(ctx)
	for i, e := range exists {
		n, err := e.Result()
		if addr, ask := redis.IsAskError(err); ask {
			target = addr
		} else if err == nil && n == 1 {
			held = append(held, keys[i])
		}
	}
	return held, target
}

// onTarget runs script on keys with args on the master at addr, the
// target of their slot's migration, when the source holds none of them (it
// answered ASK): in one pipeline, each absent key written as a
// placeholder, then the script, each command after ASKING. It returns nil
// when the Cluster client knows no master at addr.
func (s *Store) onTarget(ctx context.Context, cc *redis.ClusterClient, addr string, script *redis.Script, keys []string, args []any) *redis.Cmd {
	dst := s.targetClient(ctx, cc, addr)
	if dst == nil {
		return nil
	}
	run := func(eval bool) *redis.Cmd {
		pipe := dst.Pipeline()
		for _, k := range keys {
			pipe.Do(ctx, "asking")
			pipe.SetArgs(ctx, k, placeholder, redis.SetArgs{Mode: "NX", TTL: placeholderTTL})
		}
		pipe.Do(ctx, "asking")
		var cmd *redis.Cmd
		if eval {
			cmd = script.Eval(ctx, pipe, keys, args...)
		} else {
			cmd = script.EvalSha(ctx, pipe, keys, args...)
		}
		_, _ = pipe.Exec(ctx) // each command keeps its own error
		return cmd
	}
	cmd := run(false)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd = run(true)
	}
	if errors.Is(cmd.Err(), redis.ErrClosed) {
		s.target.Store(nil) // the Cluster client dropped that node
	}
	return cmd
}

// target is the master a migration moves keys to, as last found.
type target struct {
	addr string
	c    *redis.Client
}

// targetClient returns the Cluster client's client of the master at addr,
// remembered from the last call, or nil when it knows none there.
func (s *Store) targetClient(ctx context.Context, cc *redis.ClusterClient, addr string) *redis.Client {
	if t := s.target.Load(); t != nil && t.addr == addr {
		return t.c
	}
	c := master(ctx, cc, addr)
	if c != nil {
		s.target.Store(&target{addr: addr, c: c})
	}
	return c
}

// master returns the Cluster client's client of the master at addr, or
// nil when it knows none there.
func master(ctx context.Context, cc *redis.ClusterClient, addr string) *redis.Client {
	var (
		mu    sync.Mutex
		found *redis.Client
	)
	_ = cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		if c.Options().Addr == addr {
			mu.Lock()
			found = c
			mu.Unlock()
		}
		return nil
	})
	return found
}
