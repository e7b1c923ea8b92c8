package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"
)

type ctxKey struct{}

// TestCallCtx checks that a call's context behaves as context.WithTimeout's
// would, and that one that ended is never handed out live again.
func TestCallCtx(t *testing.T) {
	t.Run("live", func(t *testing.T) {
		parent := context.WithValue(context.Background(), ctxKey{}, "v")
		before := time.Now()
		c := boundCall(parent, time.Hour)
		if d, ok := c.Deadline(); !ok || d.Before(before.Add(time.Hour)) || d.After(time.Now().Add(time.Hour)) {
			t.Fatalf("Deadline() = %v, %v; want an hour from now", d, ok)
		}
		if c.Err() != nil || c.Value(ctxKey{}) != "v" {
			t.Fatalf("Err() = %v, Value = %v", c.Err(), c.Value(ctxKey{}))
		}
		select {
		case <-c.Done():
			t.Fatal("done before its deadline")
		default:
		}
		c.release()
	})
	t.Run("deadline", func(t *testing.T) {
		c := boundCall(context.Background(), time.Millisecond)
		<-c.Done()
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatalf("Err() = %v", c.Err())
		}
		c.release()
		for range 100 {
			n := boundCall(context.Background(), time.Hour)
			if n == c || n.Err() != nil {
				t.Fatal("an ended context was recycled")
			}
			n.release()
		}
	})
	t.Run("parent deadline", func(t *testing.T) {
		parent, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		want, _ := parent.Deadline()
		c := boundCall(parent, time.Hour)
		if d, _ := c.Deadline(); !d.Equal(want) {
			t.Fatalf("Deadline() = %v, want the parent's %v", d, want)
		}
		c.release()
	})
	t.Run("parent cancelled", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		c := boundCall(parent, time.Hour)
		cancel()
		<-c.Done()
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("Err() = %v", c.Err())
		}
		c.release()
		pre := boundCall(parent, time.Hour) // parent already cancelled
		if !errors.Is(pre.Err(), context.Canceled) {
			t.Fatalf("Err() of a call for a cancelled caller = %v", pre.Err())
		}
		pre.release()
	})
	t.Run("unbounded", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		defer cancel()
		c := boundCall(parent, -1)
		if c.context() != parent {
			t.Fatal("an unbounded call does not run in its caller's context")
		}
		c.release()
	})
}

// TestCallCtxRecycled checks that a call that ended in time leaves its
// context live for the next, with its scratch cleared.
func TestCallCtxRecycled(t *testing.T) {
	for range 100 {
		c := boundCall(context.Background(), time.Hour)
		c.key[0] = "k"
		c.args = append(c.args, 1, "x")
		c.release()
		n := boundCall(context.Background(), time.Hour)
		if n.Err() != nil || n.key[0] != "" || len(n.args) != 0 {
			t.Fatalf("recycled context: Err %v, key %q, args %v", n.Err(), n.key[0], n.args)
		}
		select {
		case <-n.Done():
			t.Fatal("recycled context is done")
		default:
		}
		n.release()
	}
}
