package server

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
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
