package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/redistest"
)

// TestAnnounceReachesEveryListener: what one store announces, a store of
// another client listening to the topic receives, after being told it
// listens; ending the context stops the listener at once.
func TestAnnounceReachesEveryListener(t *testing.T) {
	srv := redistest.Start(t)
	pub, sub := newStore(t, srv), newStore(t, srv)
	ctx, cancel := context.WithCancel(t.Context())
	got := make(chan string, 1)
	ready := make(chan bool, 4)
	done := make(chan error, 1)
	go func() {
		done <- sub.Listen(ctx, "fleetrate:test:topic", func(msg string) { got <- msg }, func(on bool) { ready <- on })
	}()
	select {
	case on := <-ready:
		if !on {
			t.Fatal("the first state reported is not listening")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Listen never reported that it listens")
	}
	if err := pub.Announce(t.Context(), "fleetrate:test:topic", "p {ota}/avail 2000000000"); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-got:
		if msg != "p {ota}/avail 2000000000" {
			t.Fatalf("heard %q", msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the announcement was not heard")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Listen returned %v when its context ended, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Listen did not return when its context ended")
	}
}
