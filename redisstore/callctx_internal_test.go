package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
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

// lateCtx is a context whose deadline has passed but whose Err does not
// say so yet: the moment between a call's own timer, set to the caller's
// deadline, firing and the caller's context's.
type lateCtx struct {
	context.Context
	deadline time.Time
}

func (c lateCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// TestFailedBlamesAPassedDeadlineOnTheCaller: a call that failed once the
// caller's deadline had passed reports the caller's context error, not an
// unavailable store, even before the caller's context says it ended (a
// failure policy would otherwise count the caller's deadline as an
// outage); one that failed before the deadline is the store's.
func TestFailedBlamesAPassedDeadlineOnTheCaller(t *testing.T) {
	late := lateCtx{Context: context.Background(), deadline: time.Now().Add(-time.Millisecond)}
	err := failed(late, "take", context.DeadlineExceeded)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, fleetrate.ErrStoreUnavailable) {
		t.Fatalf("failed after the caller's deadline = %v; want the caller's context.DeadlineExceeded, not ErrStoreUnavailable", err)
	}
	ahead := lateCtx{Context: context.Background(), deadline: time.Now().Add(time.Hour)}
	if err := failed(ahead, "take", context.DeadlineExceeded); !errors.Is(err, fleetrate.ErrStoreUnavailable) {
		t.Fatalf("failed before the caller's deadline = %v; want ErrStoreUnavailable (the store's own timeout)", err)
	}
}
