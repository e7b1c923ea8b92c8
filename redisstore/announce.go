package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// pubSub is what a client needs to carry announcements: go-redis's
// Client, ClusterClient, Ring and UniversalClient have it.
type pubSub interface {
	Publish(ctx context.Context, channel string, message any) *redis.IntCmd
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// errNoPubSub is returned by Announce and Listen for a client without
// publish and subscribe.
var errNoPubSub = errors.New("redisstore: the client cannot publish or subscribe")

// Announce publishes msg on the Redis channel topic, to every process that
// listens to it (transport uses it to tell the fleet of a pause at once).
// It is bounded by the store's timeout.
func (s *Store) Announce(ctx context.Context, topic, msg string) error {
	c, ok := s.c.(pubSub)
	if !ok {
		return errNoPubSub
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := c.Publish(cctx, topic, msg).Err(); err != nil {
		return failed(ctx, "publish", err)
	}
	return nil
}

// Listen subscribes to the Redis channel topic and calls fn with every
// message until ctx ends. It calls state(true) each time the subscription
// is made, first and after each reconnection, and state(false) when the
// connection fails: a message published in between is lost. It returns
// nil when ctx ends, or at once an error when the client cannot
// subscribe.
func (s *Store) Listen(ctx context.Context, topic string, fn func(msg string), state func(listening bool)) error {
	c, ok := s.c.(pubSub)
	if !ok {
		return errNoPubSub
	}
	ps := c.Subscribe(ctx, topic)
	// A blocked Receive does not see ctx end: closing the subscription
	// ends it.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer func() {
		stop()
		_ = ps.Close()
	}()
	backoff := 10 * time.Millisecond
	for {
		m, err := ps.Receive(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			state(false)
			// The connection failed: the next Receive reconnects and
			// subscribes again, reported by a *redis.Subscription.
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		switch m := m.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				state(true)
			}
		case *redis.Message:
			fn(m.Payload)
		}
	}
}
