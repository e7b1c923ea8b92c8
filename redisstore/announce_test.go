package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
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
	stopListen(t, cancel, done)
}

// TestListenNoticesASilentSubscription: a subscription whose connection a
// NAT drops without a reset (a proxy that forwards nothing more and closes
// nothing) is reported lost within 2 × ListenCheck of the last thing
// received on it, and Listen subscribes again on a new connection, which
// hears what is announced next. A quiet subscription that still answers
// is kept.
func TestListenNoticesASilentSubscription(t *testing.T) {
	const check = 250 * time.Millisecond
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr())
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	t.Cleanup(func() { client.Close() })
	sub, err := redisstore.New(client, redisstore.Options{ListenCheck: check})
	if err != nil {
		t.Fatal(err)
	}
	pub := newStore(t, srv)
	const topic = "fleetrate:test:silent"
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	got := make(chan string, 16)
	states := make(chan bool, 16)
	done := make(chan error, 1)
	go func() {
		done <- sub.Listen(ctx, topic, func(msg string) { got <- msg }, func(on bool) { states <- on })
	}()
	hear := func(msg string) {
		t.Helper()
		if err := pub.Announce(t.Context(), topic, msg); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-got:
			if m != msg {
				t.Fatalf("heard %q, want %q", m, msg)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%q was not heard", msg)
		}
	}
	wantListening(t, states, true, 10*time.Second, "subscribing")
	hear("one")

	// Quiet but alive: pinged, answered, kept.
	time.Sleep(4 * check)
	select {
	case on := <-states:
		t.Fatalf("a quiet live subscription was reported listening=%v", on)
	default:
	}

	if n := proxy.Blackhole(); n != 1 {
		t.Fatalf("the proxy carried %d connections, want the subscription's alone", n)
	}
	// 2 × check is the bound; the rest is room for a loaded machine.
	took := wantListening(t, states, false, 20*check, "blackholed")
	t.Logf("a silent subscription was reported lost %v after it went silent (bound 2 × %v)", took.Round(time.Millisecond), check)
	wantListening(t, states, true, 10*time.Second, "subscribing again")
	hear("two")

	stopListen(t, cancel, done)
}

func TestListenCheckMustNotBeNegative(t *testing.T) {
	srv := redistest.Start(t)
	_, err := redisstore.New(srv.Client(), redisstore.Options{ListenCheck: -time.Second})
	if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "ListenCheck") {
		t.Fatalf("New with a negative ListenCheck: %v, want ErrInvalid naming ListenCheck", err)
	}
}

// TestListenReportsAKilledRedis: with the dialer of ClientOptions, which
// dials again for up to a minute, a subscription whose Redis was killed is
// still reported lost within 2 × ListenCheck, and Listen subscribes again
// once Redis is back.
func TestListenReportsAKilledRedis(t *testing.T) {
	const check = 250 * time.Millisecond
	srv := redistest.Start(t)
	client := redis.NewClient(redisstore.ClientOptions(&redis.Options{Addr: srv.Addr()}))
	t.Cleanup(func() { client.Close() })
	sub, err := redisstore.New(client, redisstore.Options{ListenCheck: check})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	states := make(chan bool, 16)
	go func() {
		_ = sub.Listen(ctx, "fleetrate:test:killed", func(string) {}, func(on bool) { states <- on })
	}()
	wantListening(t, states, true, 10*time.Second, "subscribing")
	srv.Kill()
	killed := time.Now()
	wantListening(t, states, false, 20*check, "Redis killed")
	t.Logf("a killed Redis was reported %v later (bound 2 × %v)", time.Since(killed).Round(time.Millisecond), check)
	srv.Restart()
	for {
		select {
		case on := <-states:
			if !on {
				continue // attempts while Redis was down
			}
		case <-time.After(20 * time.Second):
			t.Fatal("Listen did not subscribe again once Redis was back")
		}
		break
	}
}

// stopListen ends Listen's context and checks that it returns nil soon.
func stopListen(t *testing.T, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
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

// wantListening waits up to within for Listen to report its state on
// states, fails the test unless it reports want, and returns how long it
// took.
func wantListening(t *testing.T, states <-chan bool, want bool, within time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case on := <-states:
		if on != want {
			t.Fatalf("%s: Listen reported listening=%v, want %v", what, on, want)
		}
	case <-time.After(within):
		t.Fatalf("%s: Listen reported nothing within %v", what, within)
	}
	return time.Since(start)
}
