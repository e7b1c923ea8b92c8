package redisstore

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fleetrate/fleetrate"
)

// folder folds concurrent identical takes on one bucket into one script
// call. One key can execute only so many scripts a second on one Redis
// core; a hot key shared by a big fleet needs more. While a call for a
// bucket is in flight, the takes that arrive for the same bucket queue up;
// when it returns, the whole queue goes out as one call of count takes, and
// each caller gets the decision the script made for it, exactly as if the
// takes had run one after the other at the same instant.
type folder struct {
	s      *Store
	mu     sync.Mutex
	groups map[string]*group
}

type group struct {
	req     fleetrate.Request
	waiters []*waiter
}

// The states of a queued take. A caller whose context ends takes its call
// from pending to abandoned (it is then never sent) or from sent to
// abandonedSent (the sender then refunds what the call was granted); the
// sender takes it from pending to sent and from sent to delivered.
const (
	pending int32 = iota
	sent
	delivered
	abandoned
	abandonedSent
)

type waiter struct {
	state atomic.Int32
	res   fleetrate.Result
	err   error
	done  chan struct{}
}

// maxFold bounds one folded call, so that one script never runs long.
const maxFold = 512

// identity names the buckets, cost and max wait of a request; takes with
// the same identity and the same limits fold together.
// Each key is length-prefixed, so that keys holding any bytes (a NUL
// included) can never make two different requests look the same.
func identity(req fleetrate.Request) string {
	var sb strings.Builder
	for _, b := range req.Buckets {
		sb.WriteString(strconv.Itoa(len(b.Prefix) + len(b.Key)))
		sb.WriteByte(':')
		sb.WriteString(b.Prefix)
		sb.WriteString(b.Key)
	}
	sb.WriteString(strconv.FormatInt(req.N, 10))
	sb.WriteByte(0)
	sb.WriteString(strconv.FormatInt(int64(req.MaxWait), 10))
	return sb.String()
}

// sameLimits reports whether two requests on the same buckets carry the
// same limits, so that their takes may fold.
func sameLimits(a, b fleetrate.Request) bool {
	if len(a.Buckets) != len(b.Buckets) {
		return false
	}
	for i := range a.Buckets {
		x, y := a.Buckets[i].Limits, b.Buckets[i].Limits
		if len(x) != len(y) {
			return false
		}
		for j := range x {
			if x[j].Rate != y[j].Rate || x[j].Burst != y[j].Burst || x[j].Name != y[j].Name {
				return false
			}
		}
	}
	return true
}

// take queues req with the takes of the same shape and waits for its own
// decision.
func (f *folder) take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	// A caller that has already given up must not be queued: its decision
	// could come back before the select below noticed the context.
	if err := ctx.Err(); err != nil {
		return fleetrate.Result{}, unavailable("take", err)
	}
	w := &waiter{done: make(chan struct{})}
	id := identity(req)
	f.mu.Lock()
	g, running := f.groups[id]
	if running && !sameLimits(g.req, req) {
		// The limits changed under a running group: take alone.
		f.mu.Unlock()
		return f.s.takeMany(ctx, req, 1)
	}
	if !running {
		g = &group{req: cloneRequest(req)}
		f.groups[id] = g
	}
	g.waiters = append(g.waiters, w)
	f.mu.Unlock()
	if !running {
		go f.run(id, g)
	}
	select {
	case <-w.done:
		return w.res, w.err
	case <-ctx.Done():
		if w.state.CompareAndSwap(pending, abandoned) {
			return fleetrate.Result{}, unavailable("take", ctx.Err())
		}
		<-w.done // delivered meanwhile: the decision stands
		return w.res, w.err
	}
}

// run sends the queue of one group as folded calls until it is empty.
func (f *folder) run(id string, g *group) {
	for {
		f.mu.Lock()
		batch := g.waiters
		if len(batch) > maxFold {
			batch = batch[:maxFold]
		}
		g.waiters = g.waiters[len(batch):]
		if len(batch) == 0 {
			delete(f.groups, id)
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()

		// The call belongs to no single caller, so it has the store's own
		// timeout rather than any caller's context.
		ctx, cancel := f.s.ownCtx()
		results, err := f.s.takeBatch(ctx, g.req, len(batch))
		cancel()
		var refund int64
		for i, w := range batch {
			if err != nil {
				w.err = err
			} else {
				w.res = results[min(i, len(results)-1)]
			}
			if w.state.CompareAndSwap(pending, delivered) {
				close(w.done)
			} else if err == nil && w.res.Allowed {
				refund += g.req.N // its caller gave up: return its tokens
			}
		}
		if refund > 0 {
			go f.s.refundAbandoned(g.req.Buckets, refund)
		}
	}
}

// cloneRequest copies the slices of req, which belong to the caller and
// may be reused once its call returns, while the group lives on.
func cloneRequest(req fleetrate.Request) fleetrate.Request {
	bs := make([]fleetrate.Bucket, len(req.Buckets))
	for i, b := range req.Buckets {
		b.Limits = append([]fleetrate.Limit(nil), b.Limits...)
		bs[i] = b
	}
	req.Buckets = bs
	return req
}
