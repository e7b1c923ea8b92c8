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
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/ratelog"
	"github.com/fleetrate/fleetrate/overlimit"
)

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
