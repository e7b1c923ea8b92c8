package redisstore

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redial settings of ClientOptions and ClusterClientOptions.
const (
	// RedialInterval is how long a dial waits after a failed try before
	// the next one.
	RedialInterval = 10 * time.Millisecond
	// RedialWindow is how long one dial keeps trying: the client's
	// DialTimeout, unless it was set longer.
	RedialWindow = time.Minute
)

// ClientOptions sets in o what a store's client needs to bound every
// decision and to come back within about 100 ms of Redis (p99 10-99 ms
// after a kill -9 or SIGSTOP of 1-5 s, docs/OPERATIONS.md), and
// returns o, ready for redis.NewClient. Fields already set are kept,
// except as noted:
//
//   - ContextTimeoutEnabled: a command gives up on its connection at the
//     call's deadline, instead of holding the connection for ReadTimeout
//     (3 s) after the store has stopped waiting. Without it the store
//     hands every call to another goroutine so as to stop waiting at the
//     deadline: a lone caller then ran at a median 0.69 × redis_rate
//     (fleetbench -plain-client), against about 1 × with this option
//     (medians of separate runs, docs/BENCHMARKS.md).
//   - Dialer: a dial that fails (connection refused while Redis restarts)
//     is tried again every RedialInterval until DialTimeout passes, each
//     try bounded by the DialTimeout o had (5 s when unset). DialTimeout
//     becomes RedialWindow (1 minute) unless it was longer. o's own Dialer,
//     if any, is the one tried.
//
// Why: go-redis counts failed dials, and once PoolSize of them have failed
// it stops dialling and checks the server once a second, so decisions came
// back up to a second after Redis did (kill -9 and restart: p99 499–723 ms
// with go-redis's defaults; go test -run TestRecoveryFigures -v ./redisstore
// -args -recovery.runs=3 -recovery.all). With dials that keep trying, none fails while Redis is
// away for less than about DialerRetries × RedialWindow (5 minutes by
// default), and the pool's dials connect within RedialInterval of Redis
// listening again. Callers never wait for a dial beyond their own deadline;
// while Redis is down, a call that needs a connection fails at its
// deadline (Options.Timeout) rather than at once, its error naming the
// last failed dial (to which address, how long ago, why: connection
// refused, no such host), and a failsafe.Store's breaker then answers
// without calling. A dial in progress when the client
// closes keeps trying until its window ends.
//
// There is no variant for a failover (Sentinel) client: it asks the
// Sentinels for the master before each dial, and retrying one address
// would keep dialling a master that is gone.
func ClientOptions(o *redis.Options) *redis.Options {
	o.ContextTimeoutEnabled = true
	try := o.DialTimeout
	if try <= 0 {
		try = 5 * time.Second
	}
	inner := o.Dialer
	if inner == nil {
		c := *o
		c.DialTimeout = try
		inner = redis.NewDialer(&c)
	}
	o.Dialer = redial(inner, try)
	o.DialTimeout = max(o.DialTimeout, RedialWindow)
	return o
}

// ClusterClientOptions is ClientOptions for a Cluster client: each node's
// client gets the same settings.
func ClusterClientOptions(o *redis.ClusterOptions) *redis.ClusterOptions {
	o.ContextTimeoutEnabled = true
	try := o.DialTimeout
	if try <= 0 {
		try = 5 * time.Second
	}
	inner := o.Dialer
	if inner == nil {
		inner = netDialer(try, o.TLSConfig)
	}
	o.Dialer = redial(inner, try)
	o.DialTimeout = max(o.DialTimeout, RedialWindow)
	return o
}

// dialFunc is the type of go-redis's Dialer option.
type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// netDialer dials TCP, or TLS when tlsConf is set, each try bounded by
// timeout.
func netDialer(timeout time.Duration, tlsConf *tls.Config) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := &net.Dialer{Timeout: timeout}
		if tlsConf == nil {
			return d.DialContext(ctx, network, addr)
		}
		return (&tls.Dialer{NetDialer: d, Config: tlsConf}).DialContext(ctx, network, addr)
	}
}

// redial returns a dialer that tries dial, each try bounded by try, until
// one succeeds or ctx ends, waiting RedialInterval after each failure. It
// returns the last try's error.
func redial(dial dialFunc, try time.Duration) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		for {
			tctx, cancel := context.WithTimeout(ctx, try)
			c, err := dial(tctx, network, addr)
			cancel()
			if err == nil {
				if _, failed := dialFailures.Load(addr); failed {
					dialFailures.Delete(addr)
				}
				return c, nil
			}
			dialFailures.Store(addr, dialFailure{at: time.Now(), err: err})
			t := time.NewTimer(RedialInterval)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, err
			case <-t.C:
			}
		}
	}
}

// dialFailure is a failed dial of a client built with ClientOptions or
// ClusterClientOptions.
type dialFailure struct {
	at  time.Time
	err error
}

// dialFailures maps an address to its latest failed dial, until a dial
// to it succeeds. A call that timed out waiting for a connection reports
// only its deadline (the dial goes on in the background), so a store
// names its own addresses' failures as the likely cause (see
// Store.explain).
var dialFailures sync.Map

// dialCauseAge is how recent a failed dial must be to be named as the
// cause of a timeout: a few redial intervals.
const dialCauseAge = 2 * time.Second

// dialCause returns a note naming the latest failed dial, of the last
// dialCauseAge, to one of addrs, or "" when there is none.
func dialCause(addrs []string) string {
	for _, a := range addrs {
		v, ok := dialFailures.Load(a)
		if !ok {
			continue
		}
		if f := v.(dialFailure); time.Since(f.at) <= dialCauseAge {
			return fmt.Sprintf("the last dial, to %s, failed %v ago: %v", a, time.Since(f.at).Round(time.Millisecond), f.err)
		}
	}
	return ""
}
