package redisstore

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/fleetrate/fleetrate"
)

var _ fleetrate.PermitNotifier = (*Store)(nil)

// notifyLinger is how long a store keeps its subscription to the permit
// channel after its last waiter left, so that a process whose takes queue
// now and then does not subscribe again for each.
const notifyLinger = 30 * time.Second

// NotifyPermit implements fleetrate.PermitNotifier. Release publishes, on
// one Redis channel, the waiters a permit was freed for; each store
// subscribes to it once (while any of its takes waits, and notifyLinger
// after), and hands each notice to the waiter it names in this process,
// if any: the waiters of other processes do not wake. The subscription is
// made again after a reconnection (see Listen), and each time Redis
// confirms it every waiter of the store is woken, since a notice may have
// been lost meanwhile: the waiter takes again, keeping its place in the
// queue. With a client that cannot subscribe, the channel never receives;
// the waiter then takes again at its Result's RetryAfter.
func (s *Store) NotifyPermit(key, id string) (<-chan struct{}, func()) {
	return s.notices.add(s, waiter{key: key, id: id})
}

// waiter is a take queued for a permit of the bucket key.
type waiter struct{ key, id string }

// notices are the channels of the takes of a store waiting for a permit,
// by bucket and id, and the subscription that feeds them.
type notices struct {
	mu sync.Mutex
	m  map[waiter]chan struct{}
	// stop ends the subscription; nil when none runs.
	stop context.CancelFunc
	// idle ends the subscription notifyLinger after the last waiter left.
	idle *time.Timer
}

func (n *notices) add(s *Store, w waiter) (<-chan struct{}, func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil {
		n.m = map[waiter]chan struct{}{}
	}
	ch := make(chan struct{}, 1)
	n.m[w] = ch
	if n.idle != nil {
		n.idle.Stop()
		n.idle = nil
	}
	if n.stop == nil {
		ctx, stop := context.WithCancel(context.Background())
		n.stop = stop
		go func() {
			_ = s.Listen(ctx, permitChannel, n.notice, n.listening)
		}()
	}
	return ch, func() { n.remove(w, ch) }
}

// remove drops w's channel ch, and ends the subscription notifyLinger
// after the last waiter left.
func (n *notices) remove(w waiter, ch chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m[w] != ch {
		return
	}
	delete(n.m, w)
	if len(n.m) > 0 || n.stop == nil || n.idle != nil {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(notifyLinger, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.idle == t && len(n.m) == 0 {
			n.stop()
			n.stop, n.idle = nil, nil
		}
	})
	n.idle = t
}

// notice wakes the waiter a message "<id> <key>" names, if it waits here.
func (n *notices) notice(msg string) {
	id, key, ok := strings.Cut(msg, " ")
	if !ok {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	wake(n.m[waiter{key: key, id: id}])
}

// listening wakes every waiter when the subscription is confirmed: a
// notice may have been published before it, or while it was lost.
func (n *notices) listening(ok bool) {
	if !ok {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ch := range n.m {
		wake(ch)
	}
}

// wake signals ch, which has room for one signal, unless it holds one.
func wake(ch chan struct{}) {
	if ch == nil {
		return
	}
	select {
	case ch <- struct{}{}:
	default:
	}
}
