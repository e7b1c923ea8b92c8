package redisstore

// This file is Options.EmptyAfterFailover: a store that notices when the
// master it writes to has changed (a Sentinel promoted the replica, or the
// master restarted without its data) and empties each bucket on the new
// master before its first take there, so that what the old master granted
// after the replica's last copy is not granted twice.

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
)

//go:embed scripts/guard.lua
var guardLua string

// DefaultFailoverWindow is the default Options.FailoverWindow.
const DefaultFailoverWindow = time.Minute

// DefaultFailoverMargin is the default Options.FailoverMargin: longer than
// the lag between the first and the last process of a fleet to leave an
// old master in the Sentinel failovers measured (docs/OPERATIONS.md).
const DefaultFailoverMargin = 500 * time.Millisecond

// errSwitched is the guard's answer when the master changed, or when a
// take's buckets are not yet emptied on the new master: the take wrote
// nothing, and the store empties its buckets and tries again.
var errSwitched = errors.New("redis master changed; buckets not yet emptied on the new master")

// errStaleMaster is the guard's answer from a master the store has left
// (an old master still answering on a connection made before the switch).
var errStaleMaster = errors.New("an earlier redis master answered; the store has moved to a new one")

// errNotMaster is the guard's answer from a server that is not a master:
// a replica, or an old master the Sentinels have made one.
var errNotMaster = errors.New("the redis server is not a master")

// guardedScript is one of the store's scripts behind the guard.
type guardedScript struct {
	script *redis.Script
	// take is set for the scripts that grant tokens: they run on a new
	// master only on buckets already emptied there.
	take bool
}

// guardedBySHA and guardedBySrc find the guarded twin of each script by
// the hash (EVALSHA) or the source (EVAL, SCRIPT LOAD) that redis.Script
// and loadScripts send.
var guardedBySHA, guardedBySrc = func() (map[string]guardedScript, map[string]guardedScript) {
	bySHA, bySrc := map[string]guardedScript{}, map[string]guardedScript{}
	for _, s := range scripts {
		g := guardedScript{redis.NewScript(guardLua + s.src), s.take}
		bySHA[s.script.Hash()], bySrc[s.src] = g, g
	}
	return bySHA, bySrc
}()

// failover is the state of Options.EmptyAfterFailover, shared by the
// guarded client and the store.
type failover struct {
	window time.Duration
	margin time.Duration // Options.FailoverMargin, 0 for none
	now    func() time.Time

	mu sync.Mutex
	// id is the replication ID of the master the store writes to; empty
	// until the first call learns it.
	id string
	// left holds the replication IDs of masters the store has left.
	left map[string]bool
	// epoch counts the switches seen.
	epoch int64
	// switched is when the last switch was seen.
	switched time.Time
	// emptied holds the buckets emptied on the current master since the
	// last switch; nil when no switch happened within window.
	emptied map[string]bool
	// booked is, per bucket, until when (local clock) this process holds
	// a booking on it: the last granted take that must wait, plus its
	// wait. A bucket is emptied until then, so that the new master does
	// not grant again the slots the old one booked.
	booked map[string]time.Time
	// prune is the size of booked at which expired bookings are next
	// removed.
	prune int
	// lease is the longest permit lease this process has asked for;
	// filled holds the buckets whose permits it filled on the master of
	// filledEpoch (see failover_permits.go).
	lease       time.Duration
	filled      map[string]bool
	filledEpoch int64
}

func newFailover(window, margin time.Duration) *failover {
	if window <= 0 {
		window = DefaultFailoverWindow
	}
	switch {
	case margin == 0:
		margin = DefaultFailoverMargin
	case margin < 0:
		margin = 0
	}
	return &failover{window: window, margin: margin, now: time.Now, left: map[string]bool{}, booked: map[string]time.Time{}, prune: 1024}
}

// expect returns the replication ID to send with a script on keys, or
// errSwitched when take is set and a key is not yet emptied on the
// current master.
func (f *failover) expect(keys []string, take bool) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.emptied == nil || !take {
		return f.id, nil
	}
	if f.now().Sub(f.switched) > f.window {
		f.emptied = nil // buckets first taken this late have refilled anyway
		return f.id, nil
	}
	for _, k := range keys {
		if !f.emptied[k] {
			return "", errSwitched
		}
	}
	return f.id, nil
}

// observe takes in the guard's report that the master's ID is got, for a
// call sent expecting sent. It reports whether the call may be sent again
// at once (the store just learnt its first master's ID), or else the error
// the call fails with.
func (f *failover) observe(sent, got string) (again bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.left[got]:
		return false, errStaleMaster
	case f.id == "":
		f.id = got
		return true, nil
	case got == f.id:
		// Another call saw the switch first.
		return false, errSwitched
	case sent != f.id:
		// A third master while this call was on its way: the next try
		// finds out which one is current.
		return false, errStaleMaster
	}
	f.left[f.id] = true
	f.id, f.epoch, f.switched, f.emptied = got, f.epoch+1, f.now(), map[string]bool{}
	return false, errSwitched
}

// toEmpty returns the buckets to empty before a take of buckets, each with
// how long to keep it empty (this process's bookings on it, and the
// margin), and the epoch they belong to.
func (f *failover) toEmpty(buckets []fleetrate.Bucket) (todo []fleetrate.Bucket, hold []time.Duration, epoch int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.emptied == nil {
		return nil, nil, f.epoch
	}
	now := f.now()
	for _, b := range buckets {
		k := b.StoreKey()
		if f.emptied[k] {
			continue
		}
		todo = append(todo, b)
		hold = append(hold, min(max(f.booked[k].Sub(now), 0)+f.margin, fleetrate.MaxWaitCap))
	}
	return todo, hold, f.epoch
}

// steady reports whether no bucket waits to be emptied on a new master:
// a take then needs nothing but the guard.
func (f *failover) steady() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.emptied == nil
}

// emptiedOn marks key as emptied on the master of epoch.
func (f *failover) emptiedOn(key string, epoch int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.epoch == epoch && f.emptied != nil {
		f.emptied[key] = true
	}
}

// record notes the booking of a granted take that must wait.
func (f *failover) record(buckets []fleetrate.Bucket, res fleetrate.Result) {
	if !res.Allowed || res.Wait <= 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	until := now.Add(res.Wait)
	for _, b := range buckets {
		k := b.StoreKey()
		if until.After(f.booked[k]) {
			f.booked[k] = until
		}
	}
	if len(f.booked) >= f.prune {
		for k, t := range f.booked {
			if !t.After(now) {
				delete(f.booked, k)
			}
		}
		f.prune = max(1024, 2*len(f.booked))
	}
}

// take runs a take through take, first emptying its buckets on a new
// master, and once more when the master changed under it; the whole
// within the store's timeout.
func (f *failover) take(ctx context.Context, s *Store, req fleetrate.Request, take func(context.Context, fleetrate.Request) (fleetrate.Result, error)) (fleetrate.Result, error) {
	tctx, cancel := s.ctx(ctx)
	defer cancel()
	for try := 0; ; try++ {
		res, err := f.takeOnce(tctx, s, req, take)
		if err == nil {
			f.record(req.Buckets, res)
			return res, nil
		}
		if ended(ctx) == nil && ended(tctx) != nil && !errors.Is(err, fleetrate.ErrStoreUnavailable) {
			// The store's own bound, not the caller's: an unavailable store.
			return res, unavailable("take", err)
		}
		if !errors.Is(err, errSwitched) || try == 2 {
			return res, err
		}
	}
}

func (f *failover) takeOnce(ctx context.Context, s *Store, req fleetrate.Request, take func(context.Context, fleetrate.Request) (fleetrate.Result, error)) (fleetrate.Result, error) {
	todo, hold, epoch := f.toEmpty(req.Buckets)
	for i, b := range todo {
		if err := s.Drain(ctx, []fleetrate.Bucket{b}, hold[i]); err != nil {
			return fleetrate.Result{}, err
		}
		f.emptiedOn(b.StoreKey(), epoch)
	}
	if err := f.fill(ctx, s, req); err != nil {
		return fleetrate.Result{}, err
	}
	return take(ctx, req)
}

// guardedClient runs the store's scripts behind the guard; every other
// call goes to the client unchanged.
type guardedClient struct {
	Client
	f *failover
}

// guardReply reads the guard's answer from a script call's error: the
// new master's ID (master), or notMaster.
func guardReply(err error) (master string, notMaster, ok bool) {
	if err == nil {
		return "", false, false
	}
	msg := err.Error()
	if id, found := strings.CutPrefix(msg, "FLEETRATE_MASTER "); found {
		return id, false, true
	}
	notMaster = strings.HasPrefix(msg, "READONLY FLEETRATE_NOTMASTER ")
	return "", notMaster, notMaster
}

func (g *guardedClient) run(ctx context.Context, gs guardedScript, keys []string, call func(args []any) *redis.Cmd, args []any) *redis.Cmd {
	for {
		id, err := g.f.expect(keys, gs.take)
		if err != nil {
			return failedCmd(ctx, err)
		}
		cmd := call(append([]any{id}, args...))
		got, notMaster, ok := guardReply(cmd.Err())
		if !ok {
			return cmd
		}
		if notMaster {
			return failedCmd(ctx, errNotMaster)
		}
		again, err := g.f.observe(id, got)
		if !again {
			return failedCmd(ctx, err)
		}
	}
}

func failedCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(fmt.Errorf("redisstore: failover guard: %w", err))
	return cmd
}

// EvalSha implements redis.Scripter.
func (g *guardedClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	gs, ok := guardedBySHA[sha]
	if !ok {
		return g.Client.EvalSha(ctx, sha, keys, args...)
	}
	return g.run(ctx, gs, keys, func(args []any) *redis.Cmd {
		return g.Client.EvalSha(ctx, gs.script.Hash(), keys, args...)
	}, args)
}

// Eval implements redis.Scripter.
func (g *guardedClient) Eval(ctx context.Context, src string, keys []string, args ...any) *redis.Cmd {
	gs, ok := guardedBySrc[src]
	if !ok {
		return g.Client.Eval(ctx, src, keys, args...)
	}
	return g.run(ctx, gs, keys, func(args []any) *redis.Cmd {
		return g.Client.Eval(ctx, guardLua+src, keys, args...)
	}, args)
}

// ScriptLoad implements redis.Scripter: it loads the guarded twin.
func (g *guardedClient) ScriptLoad(ctx context.Context, src string) *redis.StringCmd {
	if _, ok := guardedBySrc[src]; ok {
		src = guardLua + src
	}
	return g.Client.ScriptLoad(ctx, src)
}

// ScriptExists implements redis.Scripter, for the guarded twins.
func (g *guardedClient) ScriptExists(ctx context.Context, hashes ...string) *redis.BoolSliceCmd {
	hs := make([]string, len(hashes))
	for i, h := range hashes {
		hs[i] = h
		if gs, ok := guardedBySHA[h]; ok {
			hs[i] = gs.script.Hash()
		}
	}
	return g.Client.ScriptExists(ctx, hs...)
}

// guardFailovers puts the store's scripts behind the failover guard.
func (s *Store) guardFailovers(window, margin time.Duration) error {
	switch s.c.(type) {
	case *redis.ClusterClient, *redis.Ring:
		return fmt.Errorf("%w: redisstore: EmptyAfterFailover needs one master; a %T has several", fleetrate.ErrInvalid, s.c)
	}
	if window < 0 {
		return fmt.Errorf("%w: redisstore: FailoverWindow must not be negative, got %v", fleetrate.ErrInvalid, window)
	}
	s.fo = newFailover(window, margin)
	s.sc = &guardedClient{Client: s.c, f: s.fo}
	return nil
}
