// Package server is the fleetrate rate-limit service: Envoy's rate limit
// service protocol (RLS v3, gRPC ShouldRateLimit), the same over HTTP/JSON
// (POST /json), fleetrate's own HTTP API for fleets in any language
// (/v1/take, /v1/wait, /v1/refund, /v1/drain, /v1/reset), a raw store API
// for remotestore (/v1/store/...), health checks and Prometheus metrics.
//
// The server decides nothing itself: every decision is one call to a
// fleetrate.Store, so several instances over one Redis enforce one budget.
// A store failure is always reported as an error (gRPC UNAVAILABLE, HTTP
// 503), never as a denial; Envoy's failure_mode_deny decides what then
// happens to traffic.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/ratelog"
	"github.com/fleetrate/fleetrate/overlimit"
)

// Defaults applied by New when an Options field is zero.
const (
	DefaultPrefix          = fleetrate.DefaultPrefix
	DefaultMaxWait         = fleetrate.DefaultMaxWait
	DefaultStoreTimeout    = 15 * time.Millisecond
	DefaultMaxRequestBytes = 128 << 10
	DefaultReadTimeout     = 10 * time.Second
	DefaultWriteTimeout    = 10 * time.Second
	DefaultIdleTimeout     = 2 * time.Minute
	DefaultShutdownTimeout = 30 * time.Second
	// MaxDescriptors bounds the descriptors of one rate limit request.
	MaxDescriptors = 64
	// MaxBuckets bounds the buckets of one /v1 or raw store request.
	MaxBuckets = 64
	// MaxEntryBytes bounds each key and each value of an RLS descriptor.
	MaxEntryBytes = 1024
	// MaxDescriptorBytes bounds the keys and values of one RLS descriptor
	// together.
	MaxDescriptorBytes = 4096
	// MaxRequestKeyBytes bounds the keys and values of all the descriptors
	// of one RLS request together.
	MaxRequestKeyBytes = 32 << 10
	// MaxStoreKeyBytes bounds each key of a raw store request.
	MaxStoreKeyBytes = 1024
	// ProbeKey is the bucket (after the prefix) that /readyz peeks.
	ProbeKey = "_readyz"
)

// Options configure a Server. The zero value of each field means its
// default.
type Options struct {
	// Store keeps the buckets. Required.
	Store fleetrate.Store
	// StoreName describes the store in logs, e.g. "memory" or
	// "redis://10.0.0.5:6379". Default "store".
	StoreName string
	// Config is the configuration in force at start. Required.
	Config *config.Config
	// ConfigPath is the file, or the directory of files, Reload reads.
	// Empty disables reloading.
	ConfigPath string
	// ConfigOptions say how Reload reads a directory (merge of domains,
	// dot files).
	ConfigOptions config.LoadOptions
	// ReloadInterval is how often Serve checks ConfigPath for changes.
	// Zero disables watching; Reload (e.g. on SIGHUP) still works.
	ReloadInterval time.Duration
	// Prefix is prepended to every store key. Default "fleetrate:".
	Prefix string
	// MaxWait is the default and the largest max wait of /v1/wait.
	// Default 5 s.
	MaxWait time.Duration
	// StoreTimeout bounds each store call. Default DefaultStoreTimeout
	// (15 ms): within Envoy's 20 ms RLS timeout, with room for the call's
	// way to and from the service.
	StoreTimeout time.Duration
	// StoreBounded says that Store bounds each call by StoreTimeout (or
	// sooner) itself, as a redisstore.Store whose Options.Timeout is
	// StoreTimeout does, and as a memstore.Store, which never waits, needs
	// not: the server then arms no timer of its own for a store call, one
	// timer (and a context) less per decision. Default false: the server
	// bounds every store call.
	StoreBounded bool
	// MaxRequestBytes bounds request bodies (HTTP) and messages (gRPC).
	// Default 128 KiB: four times the largest request the service accepts
	// (32 KiB of descriptors), room for JSON's escapes. gRPC buffers a
	// message whole before it is refused: at 1 MiB, 256 concurrent calls
	// of refused messages took the service from 24 to 520 MiB.
	MaxRequestBytes int64
	// ReadTimeout, WriteTimeout and IdleTimeout configure the HTTP server.
	// Defaults 10 s, 10 s and 2 min.
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// ShutdownTimeout bounds the graceful shutdown: in-flight requests get
	// this long to finish. Default 30 s.
	ShutdownTimeout time.Duration
	// DrainDelay is how long the server keeps serving, with /readyz
	// failing, after shutdown begins, so that load balancers stop sending
	// traffic first. Default 0.
	DrainDelay time.Duration
	// HealthChecksStore makes the gRPC health service and /healthcheck
	// report the store: NOT_SERVING (500) while it does not answer the
	// probe the server sends every StoreCheckInterval, as
	// envoyproxy/ratelimit's REDIS_HEALTH_CHECK_ACTIVE_CONNECTION does.
	// Off, they report the process only, and /readyz alone asks the
	// store. Either way the server logs when the store stops and starts
	// answering.
	HealthChecksStore bool
	// AuthTokens, when not empty, are the bearer tokens accepted on the
	// APIs (everything but /healthz, /readyz and /metrics), each with
	// Access.DefaultScopes.
	AuthTokens []string
	// Access says who may do what: tokens with scopes, what a caller
	// without a token may do, and the key that signs grants.
	Access AccessOptions
	// TLS, when set, serves HTTP and gRPC over TLS (gRPC only with
	// PlainHTTP).
	TLS *tls.Config
	// PlainHTTP keeps HTTP unencrypted when TLS is set, as
	// envoyproxy/ratelimit's GRPC_SERVER_USE_TLS does: its deployments
	// probe /healthcheck over plain HTTP, and a kubelet's probe sends no
	// client certificate.
	PlainHTTP bool
	// ResponseHeaders adds the IETF draft's RateLimit-Policy and RateLimit
	// fields to RLS responses (response_headers_to_add), as httplimit
	// sends them.
	ResponseHeaders bool
	// LimitHeaders add envoyproxy/ratelimit's RateLimit-Limit,
	// RateLimit-Remaining and RateLimit-Reset headers (limitheaders.go).
	LimitHeaders LimitHeaders
	// GRPC configures gRPC connections: ageing and keepalive (grpcconn.go).
	GRPC GRPCOptions
	// ShadowMode makes every RLS response OK while still counting, as
	// envoyproxy/ratelimit's global SHADOW_MODE does.
	ShadowMode bool
	// QuotaMode puts every descriptor in quota mode, as
	// envoyproxy/ratelimit's global QUOTA_MODE does: a request is denied
	// only when all its limited descriptors are over their limits.
	QuotaMode bool
	// FixedWindow serves RLS limits of unit minute, hour, day or week as
	// envoyproxy/ratelimit's fixed windows in UTC (config.Rule.Enforced).
	FixedWindow bool
	// ResponseDynamicMetadata adds dynamic metadata to RLS responses, as
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA does: the domain,
	// the descriptors, hits_addend, and the merged metadata of the rules
	// of the descriptors that passed.
	ResponseDynamicMetadata bool
	// DisableStoreAPI turns off the raw store API (/v1/store/...).
	DisableStoreAPI bool
	// LocalCacheBytes, when positive, puts an over-limit cache of that
	// many bytes (package overlimit) in front of the store: a bucket the
	// store denied n tokens until t is denied at once, without a store
	// call, until t, as envoyproxy/ratelimit's LOCAL_CACHE_SIZE_IN_BYTES
	// does. The store's metrics count the calls that reach it; the
	// cache's are fleetrate_overlimit_cache_*. Its clock is Clock.
	LocalCacheBytes int64
	// NearLimitRatio is the fraction of a limit's burst in use above which
	// the tokens an RLS take uses count in fleetrate_near_limit_total, as
	// envoyproxy/ratelimit's near_limit statistic (NEAR_LIMIT_RATIO). It
	// must be in (0, 1]. Default DefaultNearLimitRatio (0.8).
	NearLimitRatio float64
	// MaxMetricDescriptors bounds the descriptor label values of
	// fleetrate_decisions_total and fleetrate_near_limit_total: beyond
	// it, decisions of other descriptors count under OverflowDescriptor
	// (and in fleetrate_metric_descriptors_dropped_total). Rules with
	// detailed_metric or value_to_metric label each request's values.
	// Default DefaultMaxMetricDescriptors (10,000).
	MaxMetricDescriptors int64
	// Pages are extra handlers served on the HTTP listener behind the same
	// bearer tokens as the APIs, keyed by http.ServeMux pattern, e.g. the
	// status page at "/status/". A browser cannot send a bearer token, so
	// these also accept a token as the password of HTTP Basic
	// authentication, and ask for it.
	Pages map[string]http.Handler
	// Logger receives the service's logs. Default slog.Default().
	Logger *slog.Logger
	// Tracer, when set, traces every RLS call and API request: a server
	// span per call, a child of the trace context the caller sent (W3C
	// traceparent, else B3), with the decision's domain, descriptor count
	// and overall code (tracing.go). Nil, the default, traces nothing.
	Tracer trace.TracerProvider
	// HealthyWithConfig keeps the gRPC health service, /healthcheck and
	// /readyz failing while the configuration in force has no domain, as
	// envoyproxy/ratelimit's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED
	// does: a replica started on an empty configuration directory takes
	// no traffic until a configuration with limits loads.
	HealthyWithConfig bool
	// Clock is used to turn /v1/drain's "until" into a duration. Default
	// time.Now.
	Clock func() time.Time
	// MaxInFlight is the hard cap on decisions in flight (RLS calls, API
	// requests); beyond the concurrency limit, which never exceeds it,
	// they are shed (shed.go). Default DefaultMaxInFlight().
	MaxInFlight int64
	// LatencyTarget is the queue the concurrency limit keeps the median
	// decision under (package inflight): while more than half of the
	// decisions take longer than the fastest of the last minute or so by
	// more, the limit falls, down to 1 in flight; while they do not and
	// the limit is reached, it climbs back to MaxInFlight. Default
	// DefaultLatencyTarget (5 ms); negative: the limit stays at
	// MaxInFlight.
	LatencyTarget time.Duration
	// Breaker, when set, is the circuit breaker in front of Store
	// (failsafe.Store): /readyz reports its state (breaker.go).
	Breaker Breaker
	// ReportWithin is how long a ticket of the outbound API waits for
	// its report before it is abandoned. Default DefaultReportWithin.
	ReportWithin time.Duration
	// Registry receives the metrics. Default a new registry, so that
	// several servers can live in one process.
	Registry *prometheus.Registry
}

// Server is the rate-limit service. Create it with New, run it with
// Serve.
type Server struct {
	opts     Options
	store    fleetrate.Store
	log      *slog.Logger
	metrics  *metrics
	state    atomic.Pointer[state]
	draining atomic.Bool
	reloadMu sync.Mutex
	tried    [32]byte // hash of the last file Reload looked at
	handler  http.Handler
	grpc     *grpc.Server
	health   *health.Server
	// stopping closes when shutdown begins: gRPC streams end (grpcStream).
	stopping chan struct{}
	stopOnce sync.Once
	// storeDown is set while the store does not answer the background
	// probe (see checkStore).
	storeDown atomic.Bool
	access    *access
	shed      *shedder
	tickets   tickets  // the outbound API's booked sends
	tracing   *tracing // nil without Options.Tracer
}

// state is a loaded configuration with its buckets resolved.
type state struct {
	cfg     *config.Config
	buckets map[string]fleetrate.Bucket
	rules   map[*config.Rule]ruleLimits
	// outbound are the transports of the upstreams section, by channel.
	outbound map[string]*outUpstream
}

// ruleLimits are the token limits of a rule that takes tokens, and a
// Limiter of them over Options.Store (nil with the over-limit cache, whose
// Take every take goes through, or if the Limiter refused the limits:
// the store then says why). An RLS take through the Limiter takes from
// its store's bound taker when the store binds one (fleetrate.Binder),
// without building a request, and gives the store limits it checked once:
// the store's check of each take is then a comparison. The server times
// these takes itself, as instrumented times the others.
type ruleLimits struct {
	limits []fleetrate.Limit
	// quotas and quotaSpec are as config.Enforcement's.
	quotas    []fleetrate.Quota
	quotaSpec []int
	lim       *fleetrate.Limiter
	// current are the rule's limits as a status's current_limit reports
	// them, built once and shared by the responses (which never change
	// them).
	current []*rlspb.RateLimitResponse_RateLimit
}

func (s *Server) newState(cfg *config.Config) *state {
	st := &state{cfg: cfg, buckets: map[string]fleetrate.Bucket{}, rules: map[*config.Rule]ruleLimits{}}
	for _, b := range cfg.Buckets {
		fb := fleetrate.Bucket{Prefix: s.opts.Prefix, Key: b.Key, Limits: b.TokenLimits(), InFlight: b.InFlight, Quotas: b.Quotas}
		st.buckets[b.Name] = fb
		st.buckets[b.Key] = fb
	}
	for _, d := range cfg.Domains {
		d.Walk(func(r *config.Rule) {
			if !r.Unlimited && !r.Denies() {
				st.rules[r] = s.ruleLimits(r)
			}
		})
	}
	st.outbound = s.outboundFor(cfg, s.state.Load())
	return st
}

// New returns a Server, or an error naming the invalid option.
func New(opts Options) (*Server, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	s := &Server{opts: opts, log: opts.Logger, stopping: make(chan struct{})}
	s.metrics = newMetrics(opts.Registry, opts.MaxMetricDescriptors)
	var err error
	if s.access, err = newAccess(opts); err != nil {
		return nil, err
	}
	s.store = instrumented{Store: opts.Store, m: s.metrics}
	if opts.LocalCacheBytes > 0 {
		s.store = overlimit.New(s.store, overlimit.Options{MaxBytes: opts.LocalCacheBytes, Clock: opts.Clock, Registerer: opts.Registry})
	}
	s.state.Store(s.newState(opts.Config))
	s.logNotices(opts.Config)
	s.tried = opts.Config.Hash
	s.metrics.lastReload.SetToCurrentTime()
	if s.shed, err = newShedder(opts.MaxInFlight, opts.LatencyTarget, opts.Registry); err != nil {
		return nil, err
	}
	s.tracing = newTracing(opts.Tracer)
	s.handler = s.shedHTTP(s.routes())
	s.grpc = s.newGRPC()
	s.refreshHealth()
	return s, nil
}

// validate checks the options New cannot default.
func (opts Options) validate() error {
	if opts.Store == nil {
		return fmt.Errorf("%w: server: store is required", fleetrate.ErrInvalid)
	}
	if opts.Config == nil {
		return fmt.Errorf("%w: server: config is required", fleetrate.ErrInvalid)
	}
	if opts.MaxWait < 0 || opts.MaxWait > fleetrate.MaxWaitCap {
		return fmt.Errorf("%w: server: max wait must be between 0 and %v, got %v", fleetrate.ErrInvalid, fleetrate.MaxWaitCap, opts.MaxWait)
	}
	if err := opts.LimitHeaders.validate(); err != nil {
		return err
	}
	if err := opts.GRPC.validate(); err != nil {
		return err
	}
	return opts.Access.validate(opts.AuthTokens)
}

// withDefaults returns opts with every zero field that has a default set
// to it.
func (opts Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	def(&opts.MaxWait, DefaultMaxWait)
	def(&opts.StoreTimeout, DefaultStoreTimeout)
	def(&opts.ReadTimeout, DefaultReadTimeout)
	def(&opts.WriteTimeout, DefaultWriteTimeout)
	def(&opts.IdleTimeout, DefaultIdleTimeout)
	def(&opts.ShutdownTimeout, DefaultShutdownTimeout)
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight()
	}
	if opts.MaxMetricDescriptors <= 0 {
		opts.MaxMetricDescriptors = DefaultMaxMetricDescriptors
	}
	if opts.NearLimitRatio <= 0 || opts.NearLimitRatio > 1 {
		opts.NearLimitRatio = DefaultNearLimitRatio
	}
	opts.LimitHeaders = opts.LimitHeaders.withDefaults()
	if opts.StoreName == "" {
		opts.StoreName = "store"
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	return opts
}

// MetricsHandler serves the metrics alone, in Prometheus text format, for
// a listener of their own.
func (s *Server) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(s.opts.Registry, promhttp.HandlerOpts{})
}

// Config returns the configuration in force.
func (s *Server) Config() *config.Config { return s.state.Load().cfg }

// Handler returns the HTTP handler: /json, /v1/..., /healthz, /readyz and
// /metrics.
func (s *Server) Handler() http.Handler { return s.handler }

// GRPCServer returns the gRPC server, with RateLimitService and the gRPC
// health service registered.
func (s *Server) GRPCServer() *grpc.Server { return s.grpc }

// Serve serves HTTP on httpLn and gRPC on grpcLn (either may be nil) until
// ctx ends, then shuts down gracefully: /readyz starts failing, new
// connections are refused, and in-flight requests finish (up to
// ShutdownTimeout) before Serve returns. It closes the listeners.
func (s *Server) Serve(ctx context.Context, httpLn, grpcLn net.Listener) error {
	if httpLn == nil && grpcLn == nil {
		return fmt.Errorf("%w: server: no listener", fleetrate.ErrInvalid)
	}
	if s.opts.TLS != nil && !s.opts.PlainHTTP && httpLn != nil {
		httpLn = tls.NewListener(httpLn, s.opts.TLS)
	}
	hs := s.newHTTPServer()
	errc := make(chan error, 2)
	running := s.start(hs, httpLn, grpcLn, errc)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if s.opts.ConfigPath != "" && s.opts.ReloadInterval > 0 {
		go s.watch(wctx)
	}
	go s.checkStore(wctx)
	s.logStart(httpLn, grpcLn)

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		running--
	}
	s.draining.Store(true)
	s.setHealth(false)
	if err == nil && s.opts.DrainDelay > 0 {
		s.log.Info("shutting down: draining", "delay", s.opts.DrainDelay)
		time.Sleep(s.opts.DrainDelay)
	}
	s.shutdown(ctx, hs, httpLn != nil, grpcLn != nil)
	for ; running > 0; running-- {
		if e := <-errc; e != nil && err == nil {
			err = e
		}
	}
	s.log.Info("stopped")
	return err
}

func (s *Server) newHTTPServer() *http.Server {
	return &http.Server{
		Handler:           s.handler,
		ReadTimeout:       s.opts.ReadTimeout,
		ReadHeaderTimeout: s.opts.ReadTimeout,
		WriteTimeout:      s.opts.WriteTimeout,
		IdleTimeout:       s.opts.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          log.New(httpErrors{log: s.log, handshakes: &ratelog.Writer{Log: s.log, Source: "http"}}, "", 0),
	}
}

// httpErrors is the HTTP server's ErrorLog. Failed TLS handshakes, which
// any peer causes at its connection rate, are written at most once a
// second, counted (ratelog), and a prober's (a connection closed before
// its handshake: EOF) not at all, as gRPC does; every other line (an
// accept error, a handler's panic) is written as it comes.
type httpErrors struct {
	log        *slog.Logger
	handshakes *ratelog.Writer
}

// Write logs one line of the HTTP server.
func (h httpErrors) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	switch {
	case !strings.Contains(line, "TLS handshake error"):
		h.log.Warn(line, "source", "http")
	case strings.HasSuffix(line, ": EOF"):
	default:
		return h.handshakes.Write(p)
	}
	return len(p), nil
}

// start serves hs on httpLn and gRPC on grpcLn, those that are not nil,
// each in a goroutine that sends its end to errc (nil for a shutdown), and
// returns how many it started.
func (s *Server) start(hs *http.Server, httpLn, grpcLn net.Listener, errc chan<- error) (running int) {
	if httpLn != nil {
		running++
		go func() {
			if err := hs.Serve(httpLn); !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("http: %w", err)
				return
			}
			errc <- nil
		}()
	}
	if grpcLn != nil {
		running++
		go func() { errc <- wrapErr("grpc", s.grpc.Serve(grpcLn)) }()
	}
	return running
}

// shutdown stops the HTTP server hs and the gRPC server (those serving)
// gracefully, closing their connections when requests in flight take
// longer than ShutdownTimeout.
func (s *Server) shutdown(ctx context.Context, hs *http.Server, httpOn, grpcOn bool) {
	s.log.Info("shutting down: finishing in-flight requests", "timeout", s.opts.ShutdownTimeout)
	s.stopOnce.Do(func() { close(s.stopping) })
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.ShutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		if httpOn {
			if e := hs.Shutdown(sctx); e != nil {
				s.log.Warn("http shutdown timed out; closing connections", "error", e.Error())
				hs.Close()
			}
		}
	})
	wg.Go(func() {
		if !grpcOn {
			return
		}
		done := make(chan struct{})
		go func() { s.grpc.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-sctx.Done():
			s.log.Warn("grpc shutdown timed out; closing connections")
			s.grpc.Stop()
			<-done
		}
	})
	wg.Wait()
	// No report can come any more: the tickets' permits lapse at their
	// leases' end, and the transports stop listening.
	s.tickets.abandonAll()
	for _, o := range s.state.Load().outbound {
		_ = o.tr.Close()
	}
}

func wrapErr(what string, err error) error {
	if err == nil || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (s *Server) logStart(httpLn, grpcLn net.Listener) {
	addr := func(l net.Listener) string {
		if l == nil {
			return "off"
		}
		return l.Addr().String()
	}
	cfg := s.Config()
	domains, rules, buckets := cfg.Summary()
	s.log.Info("fleetrate serving",
		"http", addr(httpLn), "grpc", addr(grpcLn), "store", s.opts.StoreName,
		"config", cfg.Path, "domains", domains, "rules", rules, "buckets", buckets,
		"tls", s.opts.TLS != nil, "auth", len(s.access.tokens) > 0,
		"store_api", !s.opts.DisableStoreAPI, "shadow_mode", s.opts.ShadowMode,
		"reload_interval", s.opts.ReloadInterval)
	mtls := s.opts.TLS != nil && s.opts.TLS.ClientAuth == tls.RequireAndVerifyClientCert
	s.access.logStart(httpLn, grpcLn, mtls && !s.opts.PlainHTTP, mtls)
}

// loopback reports whether a listener's address is only reachable from
// this host.
func loopback(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return true // a Unix socket: the file's permissions guard it
	}
	return tcp.IP.IsLoopback()
}

// storeCtx bounds a store call by StoreTimeout, unless the store does
// (Options.StoreBounded) or ctx ends sooner anyway (Envoy's RLS filter
// sends a deadline of 20 ms by default).
func (s *Server) storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.opts.StoreBounded {
		return ctx, noCancel
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= s.opts.StoreTimeout {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, s.opts.StoreTimeout)
}

func noCancel() {}
