package redisstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
)

// batcher gathers the takes that arrive while earlier ones are in flight
// into one call of the batch script, which runs them one after the other at
// one instant of the server's clock. Redis then parses one command, runs one
// script and writes one reply for many decisions, and the client makes one
// round trip for them: the cost of a decision falls towards the cost of its
// few Redis commands.
//
// A take that finds its queue idle (no call in flight, none waiting) is
// sent at once by its own caller, as one call of the take script, exactly
// as without batching: no hand-off to another goroutine, no queue. Takes that
// arrive while calls are in flight queue up and go out together in the
// next call, which a goroutine of the batcher sends.
//
// Takes are queued per route, of type R, one per mode: on a single Redis
// (or a Sentinel-managed one) every key can share a call (oneRoute); on a
// Cluster only keys of one hash slot can (slotRoute); with any other
// client, only takes whose first key is the same (keyRoute); folding
// (Options.FoldHotKeys) queues identical takes only (foldRoute).
type batcher[R comparable] struct {
	s *Store
	// route names the queue of a take of n tokens, booked up to wait
	// ahead, whose first store key is key; req is the take's request
	// when it names several buckets, nil when it names one.
	route func(key string, n int64, wait time.Duration, req *fleetrate.Request) R
	// maxTakes and maxInflight bound the takes of one call and the calls
	// of one queue in flight at once.
	maxTakes, maxInflight int

	mu     sync.Mutex
	queues map[R]*batchQueue
	spare  *batchQueue // a queue no longer in use, for the next one

	// runners send the queued calls.
	runners runners
}

// sharer is a batcher of any route type: what the store calls.
type sharer interface {
	take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error)
	takeKey(ctx context.Context, bk fleetrate.Bucket, key string, n int64, maxWait time.Duration, largs []any) (fleetrate.Result, error)
	takeMany(ctx context.Context, reqs []fleetrate.Request, res []fleetrate.Result, errs []error)
}

// The route types, one per mode (see batcher).
type (
	// oneRoute is the one queue of a store whose keys may all share a call.
	oneRoute struct{}
	// slotRoute is a Cluster hash slot.
	slotRoute uint16
	// keyRoute is a take's first store key.
	keyRoute string
	// foldRoute names the takes that fold into one: a take from one
	// bucket by its store key, n and wait; a take from several by its
	// identity (see identity), which holds them all.
	foldRoute struct {
		key     string
		n       int64
		wait    time.Duration
		several bool
	}
)

type batchQueue struct {
	pending  []*batchCall
	inflight int
	last     int // takes in the call sent last
}

// batchCall is one caller's take, with a copy of its request (the caller
// may give up and reuse its slices while the call is still queued).
type batchCall struct {
	state callState
	err   error
	// done carries the one signal the sender gives when it delivers the
	// decision.
	done chan struct{}
	req  fleetrate.Request
	// keys are the store keys of req's buckets; nil until needed.
	keys []string
	// largs are the script arguments of req's limits (see appendTakeLimits),
	// encoded once by a bound taker; nil for other takes.
	largs []any
	// deadline is the caller's context's deadline (zero: none), which a
	// store without a timeout of its own bounds the shared call by.
	deadline time.Time
	// res is the caller's decision, valid once err is nil and done has
	// been signalled.
	res fleetrate.Result
	// booking is where a granted take left its buckets, recorded for every
	// take (its Debts are reused across calls): it goes to the caller that
	// asked for it (want, the caller's req.Booking) and cancels the grant
	// of a caller that gave up.
	booking fleetrate.Booking
	want    *fleetrate.Booking
	// The backing of req.Buckets and keys for a take from one bucket.
	bucket [1]fleetrate.Bucket
	key    [1]string
}

// storeKeys returns (and keeps) the store keys of c's buckets.
func (c *batchCall) storeKeys() []string {
	if c.keys == nil {
		if len(c.req.Buckets) == 1 {
			c.key[0] = c.req.Buckets[0].StoreKey()
			c.keys = c.key[:]
		} else {
			c.keys = storeKeys(c.req.Buckets)
		}
	}
	return c.keys
}

// callState is where a queued take stands between its caller and the
// sender of its call. Two goroutines move it, each only by the transitions
// named below, every one a compare-and-swap, so that exactly one of them
// decides what becomes of a take:
//
//	from     transition  to             by      then
//	queued   send        sent           sender  the take is in the call
//	queued   abandon     dropped        caller  it is never sent
//	sent     deliver     delivered      sender  the caller reads the decision
//	sent     abandon     sentDropped    caller  the sender cancels its grant
//
// A caller whose abandon fails (the take was delivered meanwhile) waits for
// the signal and keeps the decision.
type callState struct{ v atomic.Int32 }

const (
	queued int32 = iota
	sent
	delivered
	dropped
	sentDropped
)

// reset makes a recycled call queued.
func (s *callState) reset() { s.v.Store(queued) }

// send is the sender's queued → sent; false when the caller gave up.
func (s *callState) send() bool { return s.v.CompareAndSwap(queued, sent) }

// deliver is the sender's sent → delivered; false when the caller gave up
// while the call was in flight (the sender then owns the take).
func (s *callState) deliver() bool { return s.v.CompareAndSwap(sent, delivered) }

// abandon is the caller's queued → dropped or sent → sentDropped; false
// when the decision was delivered first.
func (s *callState) abandon() bool {
	return s.v.CompareAndSwap(queued, dropped) || s.v.CompareAndSwap(sent, sentDropped)
}

const (
	// maxBatch bounds the takes of one call, so that one script never
	// holds Redis for long (a take costs a few microseconds).
	maxBatch = 256
	// maxBatchKeys bounds the keys of one call (a take may name several):
	// the script reads them with one MGET, whose arguments Lua must hold
	// on its stack (about 8000 at most).
	maxBatchKeys = 1024
	// batchInflight is how many calls of one route may be in flight at
	// once: while Redis runs one, the client sends the next, so neither
	// side waits for the other.
	batchInflight = 2
	// maxSecondWait bounds how many takes must wait before a second call
	// goes out while one is in flight (see batcher.wait).
	maxSecondWait = 32
	// maxShapeScan bounds how many of the shapes already in a call a take
	// is compared with; one that matches none of them gets its own.
	maxShapeScan = 8
)

// newBatcher returns the batcher of Options.Batch: takes on any keys that
// one call may carry share a queue.
func newBatcher(s *Store) sharer {
	switch s.c.(type) {
	case *redis.Client, *redis.AutoPipeliner:
		return newQueues(s, maxBatch, batchInflight, func(string, int64, time.Duration, *fleetrate.Request) oneRoute {
			return oneRoute{}
		})
	case *redis.ClusterClient:
		return newQueues(s, maxBatch, batchInflight, func(key string, _ int64, _ time.Duration, _ *fleetrate.Request) slotRoute {
			return slotRoute(Slot(key))
		})
	default:
		return newQueues(s, maxBatch, batchInflight, func(key string, _ int64, _ time.Duration, _ *fleetrate.Request) keyRoute {
			return keyRoute(key)
		})
	}
}

func newQueues[R comparable](s *Store, maxTakes, maxInflight int, route func(key string, n int64, wait time.Duration, req *fleetrate.Request) R) *batcher[R] {
	return &batcher[R]{s: s, route: route, maxTakes: maxTakes, maxInflight: maxInflight, queues: map[R]*batchQueue{}}
}

// take decides an already validated req: at once when its queue is idle,
// else queued.
func (b *batcher[R]) take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if err := ctx.Err(); err != nil {
		return fleetrate.Result{}, fmt.Errorf("redisstore: take: %w", err)
	}
	r := b.routeOf(&req)
	if q := b.claimIdle(r); q != nil {
		res, err := b.s.takeOne(ctx, req) // checks the keys' slots
		b.finish(r, q)
		return res, err
	}
	c, err := b.queued(ctx, req)
	if err != nil {
		return fleetrate.Result{}, err
	}
	return b.wait(ctx, r, c)
}

// routeOf is the route of req.
func (b *batcher[R]) routeOf(req *fleetrate.Request) R {
	var several *fleetrate.Request
	if len(req.Buckets) > 1 {
		several = req
	}
	return b.route(req.Buckets[0].StoreKey(), req.N, req.MaxWait, several)
}

// queued returns a call for req to queue, with a copy of it (its caller
// may give up and reuse its slices while it waits), or the error of keys
// on different slots.
func (b *batcher[R]) queued(ctx context.Context, req fleetrate.Request) (*batchCall, error) {
	c := newBatchCall()
	c.req = cloneRequest(req)
	c.want, c.req.Booking = req.Booking, nil
	c.deadline, _ = ctx.Deadline()
	if err := b.s.sameSlot(c.storeKeys()); err != nil {
		c.release()
		return nil, err
	}
	return c, nil
}

// takeKey is take for a bound taker's request: n tokens from bk with key
// as its Key, waiting up to maxWait, its limits encoded as largs (which
// belong to the store). A queued request is built in the call itself, so
// that a take copies nothing but its key.
func (b *batcher[R]) takeKey(ctx context.Context, bk fleetrate.Bucket, key string, n int64, maxWait time.Duration, largs []any) (fleetrate.Result, error) {
	bk.Key = key
	bs := [1]fleetrate.Bucket{bk}
	req := fleetrate.Request{Buckets: bs[:], N: n, MaxWait: maxWait}
	if err := req.Validate(); err != nil {
		return fleetrate.Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return fleetrate.Result{}, fmt.Errorf("redisstore: take: %w", err)
	}
	key = bk.StoreKey()
	r := b.route(key, n, maxWait, nil)
	if q := b.claimIdle(r); q != nil {
		res, err := b.s.takeOneBound(ctx, bk, n, maxWait, key, largs)
		b.finish(r, q)
		return res, err
	}
	c := newBatchCall()
	c.bucket[0] = bk
	c.req = fleetrate.Request{Buckets: c.bucket[:], N: n, MaxWait: maxWait}
	c.key[0] = key
	c.keys = c.key[:]
	c.largs = largs
	c.deadline, _ = ctx.Deadline()
	return b.wait(ctx, r, c)
}

// takeOneBound is takeOne for a bound taker's take of n tokens, booked
// up to maxWait ahead, from bk, whose store key is key and whose limits'
// script arguments largs were boxed once, at Bind: a take boxes none
// again.
func (s *Store) takeOneBound(ctx context.Context, bk fleetrate.Bucket, n int64, maxWait time.Duration, key string, largs []any) (fleetrate.Result, error) {
	c := s.boundCall(ctx)
	c.key[0] = key
	c.bucket[0] = bk
	c.args = appendBoundArgs(c.args, n, maxWait, largs)
	return s.sendTake(ctx, c, fleetrate.Request{Buckets: c.bucket[:], N: n, MaxWait: maxWait}, c.key[:])
}

// appendBoundArgs appends to args the take script's arguments for a take
// of n tokens, booked up to maxWait ahead, from one bucket whose limits
// (and reserve) are largs: takeArgs for that bucket.
func appendBoundArgs(args []any, n int64, maxWait time.Duration, largs []any) []any {
	args = slices.Grow(args, 3+len(largs))
	args = append(args, n, int64(maxWait), 1)
	return append(args, largs...)
}

// claimIdle returns the queue of r with a call of its caller's counted in
// flight when no call is in flight and none waits, so that the caller sends
// its take at once; else nil.
func (b *batcher[R]) claimIdle(r R) *batchQueue {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.queues[r]
	if q == nil {
		q = b.spare
		if q == nil {
			q = &batchQueue{}
		}
		b.spare = nil
		b.queues[r] = q
	} else if q.inflight > 0 || len(q.pending) > 0 {
		return nil
	}
	q.inflight, q.last = 1, max(q.last, 1)
	return q
}

// finish ends a call of q sent by its own caller: the takes that queued
// meanwhile go out in a call of their own, unless another is in flight
// (whose sender then takes them).
func (b *batcher[R]) finish(r R, q *batchQueue) {
	b.mu.Lock()
	q.inflight--
	start := q.inflight == 0 && len(q.pending) > 0
	if start {
		q.inflight++
	} else if q.inflight == 0 {
		b.retire(r, q)
	}
	b.mu.Unlock()
	if start {
		b.startRun(r, q)
	}
}

// retire removes the idle queue q of r and keeps it for the next, with
// the size of its last call: under load a queue empties for a moment after
// each call, and the next call that joins one a caller sends alone should
// still wait for half as many takes (see wait), or calls shrink to a take
// or two. The only queue stays where it is, idle: a lone caller (or a
// store whose takes all share one queue) then claims it without touching
// the map. b.mu is held.
func (b *batcher[R]) retire(r R, q *batchQueue) {
	if len(b.queues) == 1 {
		return
	}
	delete(b.queues, r)
	b.spare = q
}

// wait queues c on r and waits for its decision, for at most the store's
// timeout from now (or until ctx ends, if sooner): a take queued behind a
// call in flight on a hung Redis then gives up at its own deadline, not
// after that call's timeout and then its own.
func (b *batcher[R]) wait(ctx context.Context, r R, c *batchCall) (fleetrate.Result, error) {
	var expired <-chan time.Time
	if d := b.s.timeout; d >= 0 {
		t := getTimer(d)
		defer putTimer(t)
		expired = t.C
	}
	b.mu.Lock()
	q := b.enqueue(r, c)
	start := b.claimRun(q)
	b.mu.Unlock()
	if start {
		b.startRun(r, q)
	}
	return b.await(ctx, c, expired)
}

// enqueue adds c to the queue of r, which it returns. b.mu is held.
func (b *batcher[R]) enqueue(r R, c *batchCall) *batchQueue {
	q := b.queues[r]
	if q == nil {
		q = &batchQueue{}
		b.queues[r] = q
	}
	q.pending = append(q.pending, c)
	return q
}

// claimRun reports whether a call of q should go out now, counting it
// in flight when so: when none is in flight, or a second once half as
// many takes as the call in flight carried (at most maxSecondWait) are
// waiting: under heavy load calls then stay large, which is what a busy
// Redis needs, while a few callers still get two calls in flight. b.mu
// is held.
func (b *batcher[R]) claimRun(q *batchQueue) bool {
	start := q.inflight == 0 || q.inflight < b.maxInflight && len(q.pending) >= min(max(q.last/2, 1), maxSecondWait)
	if start {
		q.inflight++
	}
	return start
}

// await waits for the decision of the queued c until ctx ends or expired
// fires, and releases c.
func (b *batcher[R]) await(ctx context.Context, c *batchCall, expired <-chan time.Time) (fleetrate.Result, error) {
	var gaveUp error
	select {
	case <-c.done:
	case <-ctx.Done():
		gaveUp = ctx.Err()
	case <-expired:
		gaveUp = context.DeadlineExceeded
	}
	if gaveUp != nil {
		// Queued: it is never sent. Sent: the sender cancels what it is
		// granted. Either way c now belongs to the sender.
		if c.state.abandon() {
			// The caller's own context: its error. The store's timeout:
			// an unavailable store.
			return fleetrate.Result{}, failed(ctx, "take", gaveUp)
		}
		<-c.done // delivered meanwhile: the decision stands
	}
	res, err := fleetrate.Result{}, c.err
	if err == nil {
		res = c.res
		if w := c.want; w != nil && res.Allowed && c.req.N > 0 {
			w.Stamp, w.Debts = c.booking.Stamp, append(w.Debts[:0], c.booking.Debts...)
		}
	}
	c.release()
	return res, err
}

// timers recycles the timers that bound queued takes, so that a take
// allocates none. Since Go 1.23 a stopped or reset timer delivers no stale
// tick, so a recycled one is as good as new.
var timers sync.Pool

func getTimer(d time.Duration) *time.Timer {
	if t, ok := timers.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

func putTimer(t *time.Timer) {
	t.Stop()
	timers.Put(t)
}

// calls recycles the batchCalls whose decision their caller received.
var calls = sync.Pool{New: func() any { return &batchCall{done: make(chan struct{}, 1)} }}

// newBatchCall returns an empty, queued call. Its done channel has room
// for the one signal the sender gives when it delivers the decision.
func newBatchCall() *batchCall {
	c := calls.Get().(*batchCall)
	c.state.reset()
	return c
}

// release recycles c once its caller has the decision: the sender has
// signalled and no longer touches it.
func (c *batchCall) release() {
	done, debts := c.done, c.booking.Debts[:0]
	*c = batchCall{}
	c.done, c.booking.Debts = done, debts
	calls.Put(c)
}

// run sends the queue of route r as batch calls until it is empty.
func (b *batcher[R]) run(r R, q *batchQueue) {
	for {
		b.mu.Lock()
		batch := b.next(q)
		if batch == nil {
			q.inflight--
			if q.inflight == 0 {
				b.retire(r, q)
			}
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.s.send(batch)
	}
}

// next takes the takes of the next call from q, at most maxTakes of them
// and maxBatchKeys keys (a take that joins the previous take's run names
// no keys of its own); nil when none waits. b.mu is held.
func (b *batcher[R]) next(q *batchQueue) []*batchCall {
	n, keys := 0, 0
	for n < len(q.pending) && n < b.maxTakes {
		k := len(q.pending[n].req.Buckets)
		if n > 0 && sameTake(q.pending[n-1], q.pending[n]) {
			k = 0
		}
		if n > 0 && keys+k > maxBatchKeys {
			break
		}
		n, keys = n+1, keys+k
	}
	if n == 0 {
		return nil
	}
	batch := q.pending[:n:n]
	q.pending = q.pending[n:]
	q.last = n
	return batch
}

// takeMany decides reqs, each as take would, by queueing them all at
// once: they go out together in the queue's next calls, sent by the
// batcher's runners, rather than each from a goroutine of the caller's.
// Each waits at most the store's timeout. A request whose errs[i] is
// already set (refused by the store's checks) is skipped; the others are
// valid.
func (b *batcher[R]) takeMany(ctx context.Context, reqs []fleetrate.Request, res []fleetrate.Result, errs []error) {
	if err := ctx.Err(); err != nil {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = fmt.Errorf("redisstore: take: %w", err)
			}
		}
		return
	}
	var expired <-chan time.Time
	if d := b.s.timeout; d >= 0 {
		// Closed, rather than sent to, when the timeout passes: every
		// take waiting on it then sees it.
		ch := make(chan time.Time)
		t := time.AfterFunc(d, func() { close(ch) })
		defer t.Stop()
		expired = ch
	}
	cs := make([]*batchCall, len(reqs))
	for i, req := range reqs {
		if errs[i] == nil {
			cs[i], errs[i] = b.queued(ctx, req)
		}
	}
	var starts []*batchQueue
	var routes []R
	b.mu.Lock()
	for i, c := range cs {
		if c == nil {
			continue
		}
		r := b.routeOf(&reqs[i])
		q := b.enqueue(r, c)
		if !slices.Contains(starts, q) {
			starts, routes = append(starts, q), append(routes, r)
		}
	}
	for i, q := range starts {
		if !b.claimRun(q) {
			starts[i] = nil
		}
	}
	b.mu.Unlock()
	for i, q := range starts {
		if q != nil {
			b.startRun(routes[i], q)
		}
	}
	for i, c := range cs {
		if c != nil {
			res[i], errs[i] = b.await(ctx, c, expired)
		}
	}
}
