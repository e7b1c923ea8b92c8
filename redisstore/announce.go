package redisstore

import (
	"context"
	"errors"
	"net"
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

// DefaultListenCheck is the default Options.ListenCheck.
const DefaultListenCheck = time.Second

// Listen subscribes to the Redis channel topic and calls fn with every
// message until ctx ends. It calls state(true) each time Redis confirms
// the subscription, first and after each reconnection, and state(false)
// each time it takes the subscription for lost: a message published in
// between is lost. A connection that fails is noticed at once (within
// 2 × ListenCheck when the client dials again at length); one that goes
// silent (dropped by a NAT or load balancer without a reset) is
// pinged after Options.ListenCheck without traffic and taken for lost
// when nothing comes within another ListenCheck, so within
// 2 × ListenCheck (2 s by default) of the last thing received. Listen then
// subscribes again on a new connection. It returns nil when ctx ends, or
// at once an error when the client cannot subscribe.
func (s *Store) Listen(ctx context.Context, topic string, fn func(msg string), state func(listening bool)) error {
	c, ok := s.c.(pubSub)
	if !ok {
		return errNoPubSub
	}
	backoff := 10 * time.Millisecond
	for {
		confirmed := s.subscription(ctx, c, topic, fn, state)
		if ctx.Err() != nil {
			return nil
		}
		state(false)
		if confirmed {
			backoff = 10 * time.Millisecond
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// subscription subscribes to topic on a connection of its own and serves
// it until it fails, goes silent (see Listen) or ctx ends. It reports
// whether Redis confirmed the subscription.
func (s *Store) subscription(ctx context.Context, c pubSub, topic string, fn func(msg string), state func(listening bool)) (confirmed bool) {
	ps := c.Subscribe(ctx, topic)
	// A blocked Receive does not see ctx end: closing the subscription
	// ends it.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer func() {
		stop()
		_ = ps.Close()
	}()
	pinged := false
	for {
		// go-redis keeps the connection after a read that timed out
		// (ReceiveTimeout), so a silent one is pinged, then dropped here.
		// After a read that failed it dials again before it returns, with
		// rctx: bounded, so that the failure is reported within
		// 2 × ListenCheck however long the client's dialer would retry.
		rctx, cancel := context.WithTimeout(ctx, 2*s.listenCheck)
		m, err := ps.ReceiveTimeout(rctx, s.listenCheck)
		cancel()
		if ctx.Err() != nil {
			return confirmed
		}
		var ne net.Error
		switch {
		case err == nil:
		case !errors.As(err, &ne) || !ne.Timeout():
			return confirmed // failed: a new connection subscribes again
		case pinged:
			return confirmed // silent since the ping: dropped
		default:
			pctx, cancel := context.WithTimeout(ctx, s.listenCheck)
			err := ps.Ping(pctx)
			cancel()
			if err != nil {
				return confirmed
			}
			pinged = true
			continue
		}
		pinged = false // anything received is as good as the answer
		switch m := m.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				confirmed = true
				state(true)
			}
		case *redis.Message:
			fn(m.Payload)
		}
	}
}
