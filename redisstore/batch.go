package redisstore

import (
	"context"
	"errors"
	"slices"
	"sync"
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
// Takes are queued per route: on a single Redis (or a Sentinel-managed
// one) every key can share a call; on a Cluster only keys of one hash slot
// can; with any other client, only takes whose first key is the same.
type batcher struct {
	s     *Store
	route func(key string) string

	mu     sync.Mutex
	queues map[string]*batchQueue
}

type batchQueue struct {
	pending  []*batchCall
	inflight int
}

// batchCall is one caller's take, with a copy of its request (the caller
// may give up and reuse its slices while the call is still queued).
type batchCall struct {
	waiter
	req  fleetrate.Request
	keys []string
	rs   []fleetrate.Result
	// The backing of req.Buckets and keys for a take from one bucket.
	bucket [1]fleetrate.Bucket
	key    [1]string
}

const (
	// maxBatch bounds the takes of one call, so that one script never
	// holds Redis for long (a take costs a few microseconds).
	maxBatch = 256
	// batchInflight is how many calls of one route may be in flight at
	// once: while Redis runs one, the client sends the next, so neither
	// side waits for the other.
	batchInflight = 2
)

func newBatcher(s *Store) *batcher {
	b := &batcher{s: s, queues: map[string]*batchQueue{}}
	switch s.c.(type) {
	case *redis.Client, *redis.AutoPipeliner:
		b.route = func(string) string { return "" }
	case *redis.ClusterClient:
		b.route = func(key string) string { return string(rune(Slot(key))) }
	default:
		b.route = func(key string) string { return key }
	}
	return b
}

// take queues an already validated req and waits for its decision. owned
// reports that req's limits belong to the store (a bound taker's), so that
// only the request's own slices need copying.
func (b *batcher) take(ctx context.Context, req fleetrate.Request, owned bool) (fleetrate.Result, error) {
	if err := ctx.Err(); err != nil {
		return fleetrate.Result{}, unavailable("take", err)
	}
	c := &batchCall{waiter: waiter{done: make(chan struct{})}, req: req}
	if owned && len(req.Buckets) == 1 {
		c.bucket[0], c.key[0] = req.Buckets[0], req.Buckets[0].StoreKey()
		c.req.Buckets, c.keys = c.bucket[:], c.key[:]
	} else {
		c.req = cloneRequest(req)
		c.keys = make([]string, len(req.Buckets))
		for i, bk := range req.Buckets {
			c.keys[i] = bk.StoreKey()
		}
		if err := b.s.sameSlot(c.keys); err != nil {
			return fleetrate.Result{}, err
		}
	}
	route := b.route(c.keys[0])
	b.mu.Lock()
	q := b.queues[route]
	if q == nil {
		q = &batchQueue{}
		b.queues[route] = q
	}
	q.pending = append(q.pending, c)
	start := q.inflight < batchInflight
	if start {
		q.inflight++
	}
	b.mu.Unlock()
	if start {
		go b.run(route, q)
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(pending, abandoned) {
			return fleetrate.Result{}, ctx.Err()
		}
		<-c.done // delivered meanwhile: the decision stands
	}
	if c.err != nil {
		return fleetrate.Result{}, c.err
	}
	return c.rs[0], nil
}

// run sends the queue of one route as batch calls until it is empty.
func (b *batcher) run(route string, q *batchQueue) {
	for {
		b.mu.Lock()
		batch := q.pending
		if len(batch) > maxBatch {
			batch = batch[:maxBatch:maxBatch]
		}
		q.pending = q.pending[len(batch):]
		if len(batch) == 0 {
			q.inflight--
			if q.inflight == 0 {
				delete(b.queues, route)
			}
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.send(batch)
	}
}

// sameTake reports whether two calls are identical takes, which the batch
// sends as one take with a count: a hot bucket then costs the script one
// take, however many callers share it.
func sameTake(a, b *batchCall) bool {
	return a.req.N == b.req.N && a.req.MaxWait == b.req.MaxWait &&
		slices.Equal(a.keys, b.keys) && sameLimits(a.req, b.req)
}

// send runs one batch call and hands each caller its decision.
func (b *batcher) send(batch []*batchCall) {
	// Runs of identical takes become one take each, counted.
	var runs [][]*batchCall
	for i, c := range batch {
		if i > 0 && sameTake(batch[i-1], c) {
			runs[len(runs)-1] = append(runs[len(runs)-1], c)
		} else {
			runs = append(runs, batch[i:i+1:i+1])
		}
	}
	nkeys, nargs := 0, 1
	for _, run := range runs {
		nkeys += len(run[0].keys)
		nargs += 4
		for _, bk := range run[0].req.Buckets {
			nargs += 1 + 2*len(bk.Limits)
		}
	}
	keys := make([]string, 0, nkeys)
	args := make([]any, 1, nargs)
	args[0] = len(runs)
	for _, run := range runs {
		c := run[0]
		keys = append(keys, c.keys...)
		args = append(args, len(c.keys), c.req.N, int64(c.req.MaxWait), len(run))
		_, args = appendLimits(args, c.req.Buckets)
	}
	// The call belongs to no single caller, so it has the store's own
	// timeout rather than any caller's context.
	ctx, cancel := b.s.ctx(context.Background())
	var reply []int64
	err := b.s.bounded(ctx, func(ctx context.Context) (err error) {
		reply, err = batchScript.Run(ctx, b.s.c, keys, args...).Int64Slice()
		return err
	})
	cancel()
	if err != nil {
		err = unavailable("take", err)
	} else if len(reply) < 1 {
		err = unavailable("take", errors.New("empty batch reply"))
	}
	var now int64
	if err == nil {
		now, reply = reply[0], reply[1:]
	}
	var refunds []*batchCall
	for _, run := range runs {
		var rs []fleetrate.Result
		if err == nil {
			// A reply that does not replay fails this take and every one
			// after it: the rest of the reply cannot be trusted.
			rs, reply, err = replay(run[0].req, now, reply, len(run))
		}
		for i, c := range run {
			if err != nil {
				c.err = err
			} else {
				c.rs = rs[min(i, len(rs)-1):]
			}
			if c.state.CompareAndSwap(pending, delivered) {
				close(c.done)
			} else if c.err == nil && c.rs[0].Allowed && c.req.N > 0 {
				refunds = append(refunds, c) // its caller gave up: return its tokens
			}
		}
	}
	for _, c := range refunds {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = b.s.Refund(ctx, c.req.Buckets, c.req.N)
		cancel()
	}
}
