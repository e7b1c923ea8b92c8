// Command messages is a small message API protected by fleetrate's HTTP
// middleware: POST /v1/messages is limited per API key to 10 requests per
// second with a burst of 20 (by default), reads to five times that. On the
// in-memory store the limit holds for one process; with -redis every
// instance sharing the Redis enforces one budget per API key.
//
//	go run ./examples/messages                                  # in-memory store
//	go run ./examples/messages -redis redis://127.0.0.1:6379/0  # shared by a fleet
//
//	curl -i -X POST localhost:8090/v1/messages -H 'X-API-Key: sk_test_1' \
//	     -H 'Content-Type: application/json' -d '{"to":"ada","body":"hello"}'
//
// Any non-empty API key is accepted: a real service would look it up. The
// messages themselves live in the memory of each instance.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/redisstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// exitCode reports err on stderr and returns the process's exit status:
// 0 for success and for -h (the usage was asked for and printed), 2 for
// other flag errors (already printed with the usage), 1 otherwise.
func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintln(stderr, "messages:", err)
	return 1
}

// errUsage marks a command line that flag parsing rejected.
var errUsage = errors.New("usage")

// flags are the command-line settings.
type flags struct {
	addr          string
	redisURL      string
	rate          float64
	burst         int64
	failClosed    bool
	shadow        bool
	legacyHeaders bool
	timeout       time.Duration
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("messages", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8090", "listen address (8090: fleetrate serve takes 8080)")
	fs.StringVar(&f.redisURL, "redis", getenv("MESSAGES_REDIS_URL"), "Redis URL, such as redis://127.0.0.1:6379/0, to share limits across instances (default in-memory; env MESSAGES_REDIS_URL)")
	fs.Float64Var(&f.rate, "rate", 10, "POST /v1/messages requests per second per API key")
	fs.Int64Var(&f.burst, "burst", 20, "POST /v1/messages burst per API key")
	fs.BoolVar(&f.failClosed, "fail-closed", false, "answer 503 when the store fails (default: serve unlimited)")
	fs.BoolVar(&f.shadow, "shadow", false, "evaluate and report limits but never refuse")
	fs.BoolVar(&f.legacyHeaders, "legacy-headers", false, "also send X-RateLimit-Limit/Remaining/Reset")
	fs.DurationVar(&f.timeout, "timeout", 0, "bound on each rate-limit decision, such as 50ms (default: the store's and the middleware's own defaults)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return f, err
		}
		return f, fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if f.timeout < 0 {
		return f, fmt.Errorf("-timeout must not be negative, got %v", f.timeout)
	}
	return f, nil
}

// run parses args, starts the service and serves until ctx ends.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	store, storeName, closeStore, err := openStore(ctx, f, logger)
	if err != nil {
		return err
	}
	defer closeStore()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	api, err := newServer(serverConfig{
		Store:         store,
		Rate:          f.rate,
		Burst:         f.burst,
		FailClosed:    f.failClosed,
		Shadow:        f.shadow,
		LegacyHeaders: f.legacyHeaders,
		Timeout:       f.timeout,
		Logger:        logger,
		Registerer:    reg,
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/", api)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	fmt.Fprintf(stdout, "messages: listening on http://%s (%g/s burst %d per API key, %s)\n", ln.Addr(), f.rate, f.burst, storeName)
	return serveUntil(ctx, srv, ln)
}

// openStore opens the store the flags name: Redis with -redis, else the
// in-memory store. It returns the store's name for the log and the
// function that closes it.
func openStore(ctx context.Context, f flags, logger *slog.Logger) (store fleetrate.Store, name string, closeStore func() error, err error) {
	if f.redisURL == "" {
		return memstore.New(memstore.Options{}), "in-memory store", func() error { return nil }, nil
	}
	opts, err := redis.ParseURL(f.redisURL)
	if err != nil {
		return nil, "", nil, fmt.Errorf("-redis %q: %w", f.redisURL, err)
	}
	// Let commands give up at their context's deadline, so a hung
	// Redis costs a request at most the middleware's timeout.
	opts.ContextTimeoutEnabled = true
	// go-redis's own lines (a failed dial per request while Redis is
	// down) go through our logger, at most one a second.
	redisstore.SetLogger(logger)
	client := redis.NewClient(opts)
	if store, err = redisstore.New(client, redisstore.Options{Timeout: f.timeout}); err != nil {
		client.Close()
		return nil, "", nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		logger.Warn("Redis does not answer; requests are served unlimited until it does", "addr", opts.Addr, "error", err)
	}
	return store, "Redis at " + opts.Addr, client.Close, nil
}

// serveUntil serves ln until ctx ends, then shuts srv down, giving the
// requests in flight 10 seconds.
func serveUntil(ctx context.Context, srv *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
