package redisstore_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
)

// TestClientOptionsDialWaitsForRedis: a client set up by ClientOptions
// keeps dialling a Redis that is not listening yet, and its command
// succeeds once Redis starts, within the command's deadline; go-redis's
// default dialler gives up with "connection refused".
func TestClientOptionsDialWaitsForRedis(t *testing.T) {
	port := redistest.FreePort(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	plain := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer plain.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := plain.Ping(ctx).Err(); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("ping with go-redis's defaults before Redis listens: %v, want connection refused", err)
	}

	c := redis.NewClient(redisstore.ClientOptions(&redis.Options{Addr: addr}))
	defer c.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pinged := make(chan error, 1)
	go func() { pinged <- c.Ping(ctx).Err() }()
	select {
	case err := <-pinged:
		t.Fatalf("ping returned %v before Redis started", err)
	case <-time.After(100 * time.Millisecond):
	}
	redistest.StartOnPort(t, port)
	if err := <-pinged; err != nil {
		t.Fatalf("ping once Redis listens: %v", err)
	}
}

// TestClientOptionsKeepsSettings: ClientOptions keeps a DialTimeout longer
// than its window and a Dialer of the caller's own, which it calls.
func TestClientOptionsKeepsSettings(t *testing.T) {
	srv := redistest.Start(t)
	var calls atomic.Int32
	o := redisstore.ClientOptions(&redis.Options{
		Addr: srv.Addr(), DialTimeout: 2 * time.Minute,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			calls.Add(1)
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	})
	if o.DialTimeout != 2*time.Minute || !o.ContextTimeoutEnabled {
		t.Errorf("DialTimeout %v, ContextTimeoutEnabled %v; want 2m0s, true", o.DialTimeout, o.ContextTimeoutEnabled)
	}
	c := redis.NewClient(o)
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 1 {
		t.Errorf("own dialer called %d times, want 1", calls.Load())
	}
	cc := redisstore.ClusterClientOptions(&redis.ClusterOptions{Addrs: []string{srv.Addr()}})
	if cc.DialTimeout != redisstore.RedialWindow || !cc.ContextTimeoutEnabled || cc.Dialer == nil {
		t.Errorf("cluster options: DialTimeout %v, ContextTimeoutEnabled %v, Dialer set %v; want %v, true, true",
			cc.DialTimeout, cc.ContextTimeoutEnabled, cc.Dialer != nil, redisstore.RedialWindow)
	}
}

// TestTimeoutNamesTheFailedDial: while nothing listens, a take through a
// ClientOptions client fails at its deadline (the dial goes on in the
// background), and its error names the refused dial instead of only the
// deadline.
func TestTimeoutNamesTheFailedDial(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(redistest.FreePort(t)))
	err := allowThrough(t, addr)
	if !errors.Is(err, fleetrate.ErrStoreUnavailable) || !errors.Is(err, context.DeadlineExceeded) ||
		!strings.Contains(err.Error(), "the last dial, to "+addr) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Allow with nothing listening: %v; want ErrStoreUnavailable naming the refused dial to %s", err, addr)
	}

	// Another store, whose Redis accepts connections and never answers,
	// times out too: its error names no dial, least of all the first's.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	if err := allowThrough(t, ln.Addr().String()); !errors.Is(err, fleetrate.ErrStoreUnavailable) || strings.Contains(err.Error(), "last dial") {
		t.Errorf("Allow against a silent Redis: %v; want ErrStoreUnavailable naming no dial", err)
	}
}

// allowThrough makes one Allow through a store of 100 ms timeout over a
// ClientOptions client of the Redis at addr, and returns its error.
func allowThrough(t *testing.T, addr string) error {
	t.Helper()
	c := redis.NewClient(redisstore.ClientOptions(&redis.Options{Addr: addr, MaxRetries: -1}))
	defer c.Close()
	st, err := redisstore.New(c, redisstore.Options{Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := fleetrate.New(st, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = lim.Allow(context.Background(), "k")
	return err
}
