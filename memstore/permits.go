package memstore

import (
	"context"
	"sync"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/gcra"
)

// Release implements fleetrate.Store: it gives id's permits back and wakes
// the waiter first in each queue that a permit was freed in.
func (s *Store) Release(ctx context.Context, buckets []fleetrate.Bucket, id string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := fleetrate.ValidateRelease(buckets, id); err != nil {
		return 0, err
	}
	held := 0
	var wake []waiter
	s.atomically(buckets, func(now int64, states []gcra.State) bool {
		for i, b := range buckets {
			if b.InFlight == 0 {
				continue
			}
			p := &states[i].Permits
			p.Expire(now)
			if p.Release(id) {
				held++
			}
			for _, id := range p.Woken(b.InFlight) {
				wake = append(wake, waiter{key: b.StoreKey(), id: id})
			}
		}
		return true
	})
	for _, w := range wake {
		s.waiters.notify(w)
	}
	return held, nil
}

// Renew implements fleetrate.Store.
func (s *Store) Renew(ctx context.Context, buckets []fleetrate.Bucket, p fleetrate.Permit) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := fleetrate.ValidateRenew(buckets, p); err != nil {
		return 0, err
	}
	held := 0
	s.atomically(buckets, func(now int64, states []gcra.State) bool {
		exp := now + int64(p.TTL/time.Microsecond)
		for i, b := range buckets {
			if b.InFlight == 0 {
				continue
			}
			states[i].Permits.Expire(now)
			if states[i].Permits.Renew(p.ID, exp) {
				held++
			}
		}
		return true
	})
	return held, nil
}

// NotifyPermit implements fleetrate.PermitNotifier.
func (s *Store) NotifyPermit(key, id string) (<-chan struct{}, func()) {
	return s.waiters.add(waiter{key: key, id: id})
}

// waiter is a take queued for a permit of the bucket key.
type waiter struct{ key, id string }

// waiters are the channels of the takes waiting for a permit in this
// process, by bucket and id.
type waiters struct {
	mu sync.Mutex
	m  map[waiter]chan struct{}
}

func (w *waiters) add(k waiter) (<-chan struct{}, func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[waiter]chan struct{}{}
	}
	ch := make(chan struct{}, 1)
	w.m[k] = ch
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.m[k] == ch {
			delete(w.m, k)
		}
	}
}

func (w *waiters) notify(k waiter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ch, ok := w.m[k]; ok {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
