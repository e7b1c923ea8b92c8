package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/server"
	"github.com/fleetrate/fleetrate/redisstore"
)

// serveStore is an opened store: Redis, or the in-memory one.
type serveStore struct {
	store fleetrate.Store
	name  string // the URL without its password, for logs
	close func() error
}

// newServeRedisClient builds a go-redis client from a URL. The scheme selects
// the deployment: redis:// and rediss:// (TLS) a standalone server (or a
// proxy), redis+sentinel:// a Sentinel-managed primary, redis+cluster:// a
// Redis Cluster; each with an s for TLS. unix:// is a local socket.
func newServeRedisClient(raw string) (redis.UniversalClient, string, error) {
	return newServeRedisClientTLS(raw, redisTLSFiles{})
}

// newServeRedisClientTLS is newServeRedisClient with the TLS files of
// --redis-tls-*.
func newServeRedisClientTLS(raw string, files redisTLSFiles) (redis.UniversalClient, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, "", fmt.Errorf("redis URL: %w", err)
	}
	name := u.Redacted()
	base, mode, _ := strings.Cut(u.Scheme, "+")
	switch base {
	case "redis", "rediss":
	case "unix":
		if mode != "" {
			return nil, name, fmt.Errorf("redis URL %s: unix sockets serve a standalone server only", name)
		}
	default:
		return nil, name, fmt.Errorf("redis URL %s: scheme must be redis, rediss, redis+sentinel, rediss+sentinel, redis+cluster, rediss+cluster or unix", name)
	}
	plain := *u
	plain.Scheme = base
	switch mode {
	case "":
		o, err := redis.ParseURL(plain.String())
		if err == nil {
			o.TLSConfig, err = files.apply(o.TLSConfig)
		}
		if err != nil {
			return nil, name, fmt.Errorf("redis URL %s: %w", name, err)
		}
		return redis.NewClient(redisstore.ClientOptions(o)), name, nil
	case "sentinel":
		o, err := redis.ParseFailoverURL(plain.String())
		if err == nil {
			o.TLSConfig, err = files.apply(o.TLSConfig)
		}
		if err != nil {
			return nil, name, fmt.Errorf("redis URL %s: %w", name, err)
		}
		if o.MasterName == "" {
			return nil, name, fmt.Errorf("redis URL %s: a sentinel URL needs ?master_name=", name)
		}
		o.ContextTimeoutEnabled = true
		return redis.NewFailoverClient(o), name, nil
	case "cluster":
		o, err := redis.ParseClusterURL(plain.String())
		if err == nil {
			o.TLSConfig, err = files.apply(o.TLSConfig)
		}
		if err != nil {
			return nil, name, fmt.Errorf("redis URL %s: %w", name, err)
		}
		return redis.NewClusterClient(redisstore.ClusterClientOptions(o)), name, nil
	}
	return nil, name, fmt.Errorf("redis URL %s: unknown mode %q (want sentinel or cluster)", name, mode)
}

// serveStoreOptions returns the store options for the Redis at URL raw.
// Behind Sentinel every bucket starts empty on a new master, so that what
// the old one granted after the replica's last copy is not granted twice
// (redisstore.Options.EmptyAfterFailover, docs/OPERATIONS.md); a Cluster's
// masters differ per key and a lone server has no failover.
func serveStoreOptions(raw string, batch bool, timeout time.Duration) redisstore.Options {
	scheme, _, _ := strings.Cut(raw, "://")
	return redisstore.Options{Timeout: timeout, Batch: batch, Unbatched: !batch,
		EmptyAfterFailover: strings.HasSuffix(scheme, "+sentinel")}
}

// openServeRedis connects to Redis. An unreachable server is not fatal: the
// service starts, /readyz fails and decisions report the store as
// unavailable until Redis answers.
func openServeRedis(ctx context.Context, raw string, files redisTLSFiles, batch bool, timeout time.Duration, log *slog.Logger) (serveStore, error) {
	redisstore.SetLogger(log) // go-redis's own lines: structured, one a second
	c, name, err := newServeRedisClientTLS(raw, files)
	if err != nil {
		return serveStore{}, err
	}
	// --store-timeout bounds every store call: the server bounds each
	// request's calls with it, and the store bounds with it the calls that
	// belong to no single request (batched and folded ones), which would
	// otherwise get redisstore.DefaultTimeout (50 ms).
	if timeout <= 0 {
		timeout = server.DefaultStoreTimeout
	}
	st, err := redisstore.New(c, serveStoreOptions(raw, batch, timeout))
	if err != nil {
		c.Close()
		return serveStore{}, err
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := pingRedis(pctx, c); refusedSetup(err) {
		c.Close()
		return serveStore{}, refused(name, err)
	} else if err != nil {
		log.Warn("redis does not answer yet; starting anyway (/readyz fails until it does)", "redis", name, "error", err.Error())
	} else if err := st.LoadScripts(pctx); err != nil {
		log.Warn("loading the Lua scripts into redis failed; they load on first use", "redis", name, "error", err.Error())
	}
	return serveStore{store: st, name: name, close: c.Close}, nil
}

// refused is the error for a Redis at name (its URL, password masked)
// that refused the connection's setup with err.
func refused(name string, err error) error {
	return fmt.Errorf("--redis %s: redis answered but refused the connection: %w (check the URL's user, password and database number)", name, err)
}

// refusedSetup reports whether err is Redis refusing a connection's
// credentials or database: a mistake in the URL, which waiting does not
// mend, unlike a server that does not answer yet.
func refusedSetup(err error) bool {
	var rerr redis.Error
	if err == nil || !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	for _, p := range []string{"NOAUTH", "WRONGPASS", "NOPERM", "ERR invalid password", "ERR invalid username-password", "ERR AUTH", "ERR DB index", "ERR invalid DB index"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// pingRedis pings c within ctx. go-redis retries a failed dial until the
// context ends and then reports only the context's deadline, so a ping
// that timed out on a standalone server dials it once more to name the
// cause: connection refused, no such host, a timeout.
func pingRedis(ctx context.Context, c redis.UniversalClient) error {
	err := c.Ping(ctx).Err()
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	cl, ok := c.(*redis.Client)
	if !ok {
		return err
	}
	o := cl.Options()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	conn, derr := o.Dialer(dctx, o.Network, o.Addr)
	if derr != nil {
		return fmt.Errorf("no answer in time: %w", derr)
	}
	conn.Close()
	return fmt.Errorf("connected to %s, but it did not answer PING in time: %w", o.Addr, err)
}
