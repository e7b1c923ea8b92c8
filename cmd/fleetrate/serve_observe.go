package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// tracingSettings say whether and where serve exports its spans.
type tracingSettings struct {
	enabled    bool
	protocol   string // http or grpc
	endpoint   string // empty: the OTLP exporter's environment, else localhost
	sampling   float64
	service    string
	namespace  string
	instanceID string // empty: a random one per process
}

// observeSettings are serve's tracing, debug listener and readiness
// settings (envoyproxy/ratelimit's TRACING_*, DEBUG_HOST/DEBUG_PORT and
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
type observeSettings struct {
	tracing           tracingSettings
	debugAddr         string
	healthyWithConfig bool
	redisPerSecond    string // the per-second limits' Redis (perSecondStore); empty: --redis
}

// Defaults of the tracing flags.
const (
	defaultTracingService = "fleetrate"
	shutdownTracingWithin = 5 * time.Second
)

// addObserveFlags adds the flags of observeSettings.
func addObserveFlags(f *pflag.FlagSet) {
	f.Bool("tracing", false, "export OpenTelemetry spans of RLS calls and API requests over OTLP (envoyproxy/ratelimit's TRACING_ENABLED)")
	f.String("tracing-protocol", "http", "OTLP protocol: http (protobuf over HTTP, port 4318) or grpc (port 4317) (TRACING_EXPORTER_PROTOCOL)")
	f.String("tracing-endpoint", "", "OTLP endpoint URL, e.g. http://collector:4318/v1/traces or, with grpc, http://collector:4317; empty: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, else localhost")
	f.Float64("tracing-sampling-rate", 1, "fraction of traces sampled, 0 to 1, when the caller sent no sampled trace context (TRACING_SAMPLING_RATE)")
	f.String("tracing-service-name", defaultTracingService, "the spans' service.name (TRACING_SERVICE_NAME)")
	f.String("tracing-service-namespace", "", "the spans' service.namespace (TRACING_SERVICE_NAMESPACE)")
	f.String("tracing-service-instance-id", "", "the spans' service.instance.id; empty: a random one per process (TRACING_SERVICE_INSTANCE_ID)")
	f.String("debug-addr", "", "serve envoyproxy/ratelimit's debug endpoints (/rlconfig, /stats, Go's pprof under /debug/pprof/) at this address, e.g. 127.0.0.1:6070; empty: off. No access control: keep it on loopback")
	f.String("redis-per-second", "", "a second Redis URL (as --redis) for the buckets whose limits all refill within a second (unit: second), to spread load as envoyproxy/ratelimit's REDIS_PERSECOND does; empty: --redis holds every bucket")
	f.Bool("healthy-with-config", false, "report unhealthy (gRPC health, /healthcheck, /readyz) while the configuration in force has no domain (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED)")
}

// observe resolves observeSettings; none has a key in the file's server
// section.
func (r *resolver) observe() observeSettings {
	o := observeSettings{
		tracing: tracingSettings{
			enabled:    r.boolean("tracing", nil),
			protocol:   r.str("tracing-protocol", nil),
			endpoint:   r.str("tracing-endpoint", nil),
			service:    r.str("tracing-service-name", nil),
			namespace:  r.str("tracing-service-namespace", nil),
			instanceID: r.str("tracing-service-instance-id", nil),
		},
		debugAddr:         r.str("debug-addr", nil),
		healthyWithConfig: r.boolean("healthy-with-config", nil),
		redisPerSecond:    r.str("redis-per-second", nil),
	}
	o.tracing.sampling, _ = r.fs.GetFloat64("tracing-sampling-rate")
	if v, ok := r.source("tracing-sampling-rate"); ok {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f >= 0 && f <= 1) {
			r.fail("tracing-sampling-rate", v, errors.New("want a number from 0 to 1"))
		}
		o.tracing.sampling = f
	}
	return o
}

// check reports the first tracing, debug or per-second store setting that
// cannot work; redis is --redis.
func (o observeSettings) check(redis string) error {
	if o.redisPerSecond != "" && redis == "" {
		return errors.New("--redis-per-second (REDIS_PERSECOND) needs --redis (REDIS_URL): the in-memory store has no second store")
	}
	t := o.tracing
	if t.protocol != "http" && t.protocol != "grpc" {
		return fmt.Errorf("--tracing-protocol (TRACING_EXPORTER_PROTOCOL) must be http or grpc, got %q", t.protocol)
	}
	if t.endpoint != "" {
		u, err := url.Parse(t.endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--tracing-endpoint must be an http:// or https:// URL, got %q", t.endpoint)
		}
	}
	if t.enabled && t.service == "" {
		return errors.New("--tracing-service-name must not be empty")
	}
	if o.debugAddr != "" {
		if _, _, err := net.SplitHostPort(o.debugAddr); err != nil {
			return fmt.Errorf("--debug-addr must be host:port, got %q: %v", o.debugAddr, err)
		}
	}
	return nil
}

// startTracing returns the tracer provider of t, exporting over OTLP, and
// its stop, which flushes the spans not yet sent; nil and a no-op stop
// when tracing is off. The exporter reads the OTEL_EXPORTER_OTLP_*
// variables it knows (headers, timeout, certificates, compression; the
// endpoint unless --tracing-endpoint gives one) from the environment.
func startTracing(ctx context.Context, t tracingSettings, log *slog.Logger) (*sdktrace.TracerProvider, func(), error) {
	if !t.enabled {
		return nil, func() {}, nil
	}
	var client otlptrace.Client
	if t.protocol == "grpc" {
		var opts []otlptracegrpc.Option
		if t.endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(t.endpoint))
		}
		client = otlptracegrpc.NewClient(opts...)
	} else {
		var opts []otlptracehttp.Option
		if t.endpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(t.endpoint))
		}
		client = otlptracehttp.NewClient(opts...)
	}
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	id := t.instanceID
	if id == "" {
		id = rand.Text()
	}
	res := resource.NewSchemaless(
		attribute.String("service.name", t.service),
		attribute.String("service.namespace", t.namespace),
		attribute.String("service.instance.id", id),
	)
	tp := sdktrace.NewTracerProvider(
		// A caller's sampled trace is always followed; a new one is
		// sampled at the rate, as envoyproxy/ratelimit does.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.sampling))),
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
	)
	// The exporter reports failed exports to OpenTelemetry's global
	// handler: send them to the service's log.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing: " + err.Error()) }))
	log.Info("tracing: exporting spans over OTLP", "protocol", t.protocol, "endpoint", t.endpoint,
		"service_name", t.service, "service_namespace", t.namespace, "service_instance_id", id, "sampling_rate", t.sampling)
	return tp, func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTracingWithin)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("tracing: flushing the last spans", "err", err)
		}
	}, nil
}

// serveDebug serves the debug handler on a listener of its own at addr
// (--debug-addr), until the returned server is closed. It warns when addr
// is not a loopback address: the endpoints have no access control, and
// pprof shows the process's memory.
func serveDebug(addr string, readTimeout time.Duration, h http.Handler, log *slog.Logger) (*http.Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("debug-addr: %w", err)
	}
	host, _, _ := net.SplitHostPort(l.Addr().String())
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		log.Warn("debug listener on a non-loopback address: /rlconfig, /stats and pprof have no access control", "addr", l.Addr().String())
	}
	ds := &http.Server{Handler: h, ReadHeaderTimeout: readTimeout}
	go func() { _ = ds.Serve(l) }()
	log.Info("debug listener: /rlconfig, /stats, /debug/pprof/", "addr", l.Addr().String())
	return ds, nil
}
