package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/procs"
	"github.com/fleetrate/fleetrate/internal/server"
	"github.com/fleetrate/fleetrate/memstore"
)

const serveLong = `Run the fleetrate rate-limit service.

It speaks Envoy's rate limit protocol (gRPC RLS v3, ShouldRateLimit) on
--grpc-addr, and HTTP on --http-addr: POST /json (envoyproxy/ratelimit's
JSON API), POST /v1/take, /v1/wait, /v1/refund, /v1/drain and /v1/reset for
fleets in any language, the raw store API /v1/store/... for Go workers
using remotestore, GET /healthz, /readyz and /metrics, and a live status
page at /status/ (behind the same tokens; a browser gives one as the Basic
password). See docs/API.md.

The configuration file is an envoyproxy/ratelimit file (loaded unchanged),
plus fleetrate's extensions: burst, rate_limits, buckets and a server
section. It is reloaded on SIGHUP and when it changes on disk; a bad file
keeps the configuration in force and logs why.

Every setting below comes from, in order of precedence: the flag, the
environment variable FLEETRATE_<FLAG> (upper case, dashes as underscores,
e.g. FLEETRATE_HTTP_ADDR), envoyproxy/ratelimit's variable for it if it has
one (PORT, REDIS_URL, LOG_LEVEL, ...: docs/OPERATIONS.md), the file's
server section (the flag's name with underscores, e.g. http_addr; not
--config, --merge-domains and --ignore-dot-files, which say how the file
is read), then the default. The config file itself is --config, else
FLEETRATE_CONFIG, else RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY
if one of the first two is set, else fleetrate.yaml. Bearer tokens come
from --auth-token-file (one per line: the token, then optionally its
scopes, e.g. "s3cret decide,store") and from FLEETRATE_AUTH_TOKEN
(comma-separated, each optionally token:scope+scope; the environment only,
never a flag or the file). Scopes: decide (RLS, /json, /v1/take, /v1/wait,
refund and cancel with the grant the service issued), store
(/v1/store/...), admin (reset, drain, give-backs without a grant,
/v1/config, /status/). Without tokens, decide is open to everyone and store
and admin to loopback clients only. See docs/OPERATIONS.md, "Security
model".

The store is the embedded in-memory one unless --redis gives a URL:
  redis://[user:password@]host:6379[/db]        standalone Redis
  rediss://...                                   the same over TLS
  redis+sentinel://[user:pw@]s1:26379[/db]?master_name=mymaster&addr=s2:26379
                                                 Sentinel (user:pw are the
                                                 sentinels'; username= and
                                                 password= for the master)
  redis+cluster://[user:pw@]n1:6379?addr=n2:6379&addr=n3:6379
                                                 Redis Cluster
  rediss+sentinel://, rediss+cluster://          the same over TLS
go-redis query options (dial_timeout, pool_size, ...) are accepted.`

// serveSettings is the resolved configuration of one run of the service.
type serveSettings struct {
	configPath      string
	configLoad      config.LoadOptions
	envoyNotes      []string
	observe         observeSettings
	metricsAddr     string
	metricsPath     string
	cfg             *config.Config
	httpAddr        string
	grpcAddr        string
	redis           string
	prefix          string
	maxWait         time.Duration
	readTimeout     time.Duration
	writeTimeout    time.Duration
	idleTimeout     time.Duration
	shutdownTimeout time.Duration
	drainDelay      time.Duration
	tlsHTTP         bool
	healthStore     bool
	storeTimeout    time.Duration
	reloadInterval  time.Duration
	maxRequestBytes int64
	authTokenFile   string
	tlsCertFile     string
	tlsKeyFile      string
	tlsClientCAFile string
	logFormat       string
	logLevel        string
	responseHeaders bool
	shadowMode      bool
	quotaMode       bool
	fixedWindow     bool
	dynamicMetadata bool
	storeAPI        bool
	redisBatch      bool
	adaptiveProcs   bool
	memMaxKeys      int64
	memMaxBytes     int64
	localCacheBytes int64
	nearLimitRatio  float64
	maxMetricDescs  int64
	access          accessSettings
	safety          safetySettings
	envoyCompat     envoyCompatSettings
}

// Flag names and their defaults.
const (
	defaultConfig = "fleetrate.yaml"
	envPrefix     = "FLEETRATE_"
)

// serveCommand returns the "serve" command; it reads the environment only
// through getenv.
func serveCommand(getenv func(string) string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the rate-limit service (Envoy RLS gRPC, HTTP/JSON, metrics)",
		Long:  serveLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := resolveSettings(cmd.Flags(), getenv)
			if err != nil {
				return err
			}
			return serve(cmd.Context(), st, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.String("config", defaultConfig, "configuration file (YAML), or a directory: every file under it")
	f.Bool("merge-domains", false, "with a config directory, merge a domain several files give (else it is an error)")
	f.Bool("ignore-dot-files", false, "with a config directory, skip files and directories whose name starts with a dot")
	f.String("metrics-addr", "", "an extra listen address serving only the metrics (they are also on --http-addr)")
	f.String("metrics-path", "/metrics", "the metrics' path on --metrics-addr")
	f.String("http-addr", ":8080", "HTTP listen address (/json, /v1, /healthz, /readyz, /metrics); \"off\" disables")
	f.String("grpc-addr", ":8081", "gRPC listen address (Envoy RLS v3), or unix:PATH for a Unix socket; \"off\" disables")
	f.String("redis", "", "Redis URL; empty means the in-memory store (see above for Sentinel and Cluster)")
	f.String("prefix", server.DefaultPrefix, "prefix of every store key")
	f.Duration("max-wait", server.DefaultMaxWait, "default and largest max wait of /v1/wait")
	f.Duration("read-timeout", server.DefaultReadTimeout, "HTTP read timeout")
	f.Duration("write-timeout", server.DefaultWriteTimeout, "HTTP write timeout")
	f.Duration("idle-timeout", server.DefaultIdleTimeout, "HTTP keep-alive idle timeout")
	f.Duration("shutdown-timeout", server.DefaultShutdownTimeout, "how long in-flight requests get to finish on SIGTERM")
	f.Duration("drain-delay", 0, "how long to keep serving, with /readyz failing, after SIGTERM")
	f.Bool("health-checks-store", false, "make the gRPC health service and /healthcheck report NOT_SERVING (500) while the store does not answer the probe sent every second (envoyproxy/ratelimit's REDIS_HEALTH_CHECK_ACTIVE_CONNECTION); off, only /readyz asks the store")
	f.Duration("store-timeout", server.DefaultStoreTimeout, "bound on each store call")
	f.Duration("reload-interval", 2*time.Second, "how often to check the config file for changes; 0 reloads on SIGHUP only")
	f.Int64("max-request-bytes", server.DefaultMaxRequestBytes, "largest request body (HTTP) or message (gRPC)")
	f.String("auth-token-file", "", "file of bearer tokens, one per line, each optionally followed by its scopes (decide, store, admin); when set, the APIs need one")
	accessFlags(f)
	f.String("tls-cert-file", "", "TLS certificate (PEM); with --tls-key-file, serves HTTPS and gRPC over TLS")
	f.String("tls-key-file", "", "TLS private key (PEM)")
	f.Bool("tls-http", true, "with --tls-cert-file, serve HTTP over TLS too; false keeps HTTP plain (gRPC only over TLS), as envoyproxy/ratelimit's GRPC_SERVER_USE_TLS does")
	f.String("tls-client-ca-file", "", "CA bundle (PEM) to require and verify client certificates (mTLS); needs --tls-cert-file and --tls-key-file")
	f.String("log-format", "text", "log format: text or json")
	f.String("log-level", "info", "log level: debug, info, warn or error")
	f.Bool("response-headers", false, "add the IETF draft's RateLimit-Policy and RateLimit fields to RLS responses")
	f.Bool("shadow-mode", false, "answer OK to every RLS request while still counting (global shadow mode)")
	f.Bool("quota-mode", false, "put every RLS descriptor in quota mode: a request is denied only when all its descriptors are over their limits")
	f.Bool("fixed-window", false, "serve RLS limits of unit minute, hour, day and week as envoyproxy/ratelimit does: a fixed window that resets at the UTC boundary (a calendar quota), not a token bucket")
	f.Bool("response-dynamic-metadata", false, "add dynamic metadata (domain, descriptors, the rules' metadata) to RLS responses")
	f.Bool("store-api", true, "serve the raw store API (/v1/store/...) used by remotestore")
	f.Bool("redis-batch", true, "send concurrent decisions to Redis as one script call (redisstore's default; false sets redisstore.Options.Unbatched)")
	f.Bool("adaptive-procs", true, "run on one processor (GOMAXPROCS=1) while the service uses under 0.75 of a CPU, on Go's default as soon as one processor is 85 % busy (checked every 100ms), and on two processors when it has one CPU; false keeps Go's default; a GOMAXPROCS environment variable turns it off")
	f.Int64("memory-max-keys", memstore.DefaultMaxKeys, "in-memory store: most buckets held; beyond, the one closest to refilling among a sample is dropped")
	f.Int64("memory-max-bytes", memstore.DefaultMaxBytes, "in-memory store: most bytes the buckets hold (key bytes plus 208 a bucket), enforced as --memory-max-keys is")
	f.Int64("local-cache-bytes", 0, "size of the over-limit cache (package overlimit): a bucket the store denied n tokens until t is denied at once, without a store call, until t; 0 disables")
	f.Float64("near-limit-ratio", server.DefaultNearLimitRatio, "fraction of a limit's burst in use above which RLS hits count in fleetrate_near_limit_total")
	f.Int64("max-metric-descriptors", server.DefaultMaxMetricDescriptors, "most descriptor label values in fleetrate_decisions_total and fleetrate_near_limit_total; decisions of others count under descriptor=\"_overflow\" (rules with detailed_metric or value_to_metric label each request value)")
	addSafetyFlags(f)
	addEnvoyCompatFlags(f)
	addObserveFlags(f)
	return cmd
}

func newLogger(format, level string, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lvl}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// listen listens on addr: host:port, or unix:PATH for a Unix socket
// (listenUnix); "" and "off" are no listener.
func listen(addr string) (net.Listener, error) {
	if addr == "" || addr == "off" {
		return nil, nil
	}
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		return listenUnix(path)
	}
	return net.Listen("tcp", addr)
}

func closeAll(ls ...net.Listener) {
	for _, l := range ls {
		if l != nil {
			l.Close()
		}
	}
}

// serve runs the service until ctx ends (SIGTERM or interrupt), reloading
// the configuration on SIGHUP. It is long because it wires the store, the
// server, the listeners and the shutdown in their one order.
func serve(ctx context.Context, st serveSettings, logOut io.Writer) error {
	log := newLogger(st.logFormat, st.logLevel, logOut)
	ctx, cancel := context.WithCancel(ctx) // ends the certificate's watch when serve returns
	defer cancel()
	tlsCfg, err := loadTLS(ctx, st, log)
	if err != nil {
		return err
	}
	store, err := openServeStore(ctx, st, log)
	if err != nil {
		return err
	}
	defer store.close()
	opts, err := st.safeServerOptions(store, tlsCfg, log)
	if err != nil {
		return err
	}
	tp, stopTracing, err := startTracing(ctx, st.observe.tracing, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	if tp != nil {
		opts.Tracer = tp
	}
	opts.HealthyWithConfig = st.observe.healthyWithConfig
	srv, err := newServerWithStatus(opts)
	if err != nil {
		return err
	}
	hl, err := listen(st.httpAddr)
	if err != nil {
		return fmt.Errorf("http-addr: %w", err)
	}
	gl, err := listen(st.grpcAddr)
	if err != nil {
		closeAll(hl)
		return fmt.Errorf("grpc-addr: %w", err)
	}
	for _, n := range st.envoyNotes {
		log.Warn("envoyproxy/ratelimit setting: " + n)
	}
	if st.metricsAddr != "" {
		ms, err := serveMetrics(st.metricsAddr, st.metricsPath, st.readTimeout, srv.MetricsHandler())
		if err != nil {
			closeAll(hl, gl)
			return err
		}
		defer ms.Close()
	}
	if st.observe.debugAddr != "" {
		ds, err := serveDebug(st.observe.debugAddr, st.readTimeout, srv.DebugHandler(), log)
		if err != nil {
			closeAll(hl, gl)
			return err
		}
		defer ds.Close()
	}
	defer reloadOnHangup(ctx, srv, st.configPath, log)()
	if st.adaptiveProcs {
		defer governProcs(log)()
	}
	if st.redis != "" {
		setRedisGC(log)
	}
	return srv.Serve(ctx, hl, gl)
}

// governProcs starts the processor governor (package procs) and returns
// its stop; it logs what it does, or why it does nothing.
func governProcs(log *slog.Logger) (stop func()) {
	stop, err := procs.Start(procs.Options{Logger: log})
	full := runtime.GOMAXPROCS(0) // Go's default, which Start has set
	switch {
	case err == nil:
		log.Info("processors: adaptive", "default", full, "one_below_cpus", procs.DefaultQuiet, "default_above_cpus", procs.DefaultBusy, "interval", procs.DefaultInterval)
		return stop
	case errors.Is(err, procs.ErrFixed):
		log.Info("processors: GOMAXPROCS from the environment, not adaptive", "gomaxprocs", full)
	case errors.Is(err, procs.ErrOneCPU):
		runtime.GOMAXPROCS(oneCPUProcs)
		log.Info("processors: one CPU, two processors", "gomaxprocs", oneCPUProcs)
	case errors.Is(err, procs.ErrRunning):
		log.Debug("processors: governed by another service in this process", "gomaxprocs", full)
	default:
		log.Warn("processors: Go's default, not adaptive", "err", err)
	}
	return func() {}
}

// openServeStore opens the Redis store st names, or else the in-memory one.
func openServeStore(ctx context.Context, st serveSettings, log *slog.Logger) (serveStore, error) {
	if st.redis != "" {
		main, err := openServeRedis(ctx, st.redis, st.envoyCompat.redisTLS, st.redisBatch, st.storeTimeout, log)
		if err != nil || st.observe.redisPerSecond == "" {
			return main, err
		}
		second, err := openServeRedis(ctx, st.observe.redisPerSecond, st.envoyCompat.redisTLS, st.redisBatch, st.storeTimeout, log)
		if err != nil {
			main.close()
			return serveStore{}, fmt.Errorf("--redis-per-second: %w", err)
		}
		return withPerSecond(main, second), nil
	}
	return serveStore{
		store: memstore.New(memstore.Options{MaxKeys: int(st.memMaxKeys), MaxBytes: st.memMaxBytes}),
		name:  "memory",
		close: func() error { return nil },
	}, nil
}

// serverOptions are the server's options for st, serving store.
func (st *serveSettings) serverOptions(store serveStore, tlsCfg *tls.Config, log *slog.Logger) server.Options {
	return server.Options{
		LocalCacheBytes:         st.localCacheBytes,
		NearLimitRatio:          st.nearLimitRatio,
		MaxMetricDescriptors:    st.maxMetricDescs,
		Store:                   store.store,
		StoreName:               store.name,
		Config:                  st.cfg,
		ConfigPath:              st.configPath,
		ConfigOptions:           st.configLoad,
		ReloadInterval:          st.reloadInterval,
		Prefix:                  st.prefix,
		MaxWait:                 st.maxWait,
		StoreTimeout:            st.storeTimeout,
		MaxRequestBytes:         st.maxRequestBytes,
		ReadTimeout:             st.readTimeout,
		WriteTimeout:            st.writeTimeout,
		IdleTimeout:             st.idleTimeout,
		ShutdownTimeout:         st.shutdownTimeout,
		DrainDelay:              st.drainDelay,
		HealthChecksStore:       st.healthStore,
		Access:                  st.access.options(),
		TLS:                     tlsCfg,
		PlainHTTP:               !st.tlsHTTP,
		ResponseHeaders:         st.responseHeaders,
		LimitHeaders:            st.envoyCompat.limitHeaders,
		GRPC:                    st.envoyCompat.grpc,
		ShadowMode:              st.shadowMode,
		QuotaMode:               st.quotaMode,
		FixedWindow:             st.fixedWindow,
		DisableStoreAPI:         !st.storeAPI,
		ResponseDynamicMetadata: st.dynamicMetadata,
		Logger:                  log,
		// The memory store never waits, and openServeRedis gives the
		// Redis store --store-timeout as its own bound.
		StoreBounded: true,
	}
}

// serveMetrics serves metrics alone at path on a listener of its own at
// addr (--metrics-addr), until the returned server is closed.
func serveMetrics(addr, path string, readTimeout time.Duration, metrics http.Handler) (*http.Server, error) {
	ml, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle(path, metrics)
	ms := &http.Server{Handler: mux, ReadHeaderTimeout: readTimeout}
	go func() { _ = ms.Serve(ml) }()
	return ms, nil
}

// reloadOnHangup reloads srv's configuration on each SIGHUP until ctx ends;
// the returned function stops listening for SIGHUP.
func reloadOnHangup(ctx context.Context, srv *server.Server, path string, log *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				log.Info("SIGHUP: reloading the configuration", "path", path)
				_ = srv.Reload() // a failure is logged and keeps the old config
			}
		}
	}()
	return func() { signal.Stop(hup) }
}
