package schedule

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrQueueBudget is Queues.Wait's error for a request whose wait budget
// ran out while it queued in its process.
var ErrQueueBudget = errors.New("transport: wait budget spent in the process's queue")

// Queues order a process's requests that draw from several buckets (an
// endpoint and its credential): a booking is a point in time on every
// bucket, and a token bucket cannot leave a hole before it, so a fleet
// that booked a slow endpoint far ahead would idle the credential for
// every other endpoint until then. With one booking per process ahead, a
// credential waits for no more than the fleet's processes' next slots on
// an endpoint. The zero Queues is ready.
type Queues struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

// Wait waits for the request's turn among this process's requests with
// the same key (in arrival order: a channel's waiting senders are served
// first in, first out) for at most budget, and returns the function that
// lets the next one go.
func (qs *Queues) Wait(ctx context.Context, key string, budget time.Duration) (release func(), err error) {
	qs.mu.Lock()
	if qs.m == nil {
		qs.m = map[string]chan struct{}{}
	}
	q := qs.m[key]
	if q == nil {
		q = make(chan struct{}, 1)
		qs.m[key] = q
	}
	qs.mu.Unlock()
	timer := time.NewTimer(max(budget, 0))
	defer timer.Stop()
	select {
	case q <- struct{}{}:
		var once sync.Once
		return func() { once.Do(func() { <-q }) }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-timer.C:
		return nil, ErrQueueBudget
	}
}
