package server

import (
	"context"
	"net/http"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TracerName is the instrumentation scope of the server's spans.
const TracerName = "github.com/fleetrate/fleetrate/internal/server"

// Attribute keys of the spans of rate-limit decisions (RLS over gRPC and
// POST /json).
const (
	AttrDomain      = "ratelimit.domain"
	AttrDescriptors = "ratelimit.descriptors"
	AttrOverallCode = "ratelimit.overall_code"
)

// tracing makes the server's spans. It is nil when Options.Tracer is nil,
// and every call site checks that first, so that a server without tracing
// spends one comparison per request on it.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// newTracing is the span maker of tp, nil without one. It reads the W3C
// trace context (traceparent, tracestate) of each request, which Envoy's
// OpenTelemetry tracer sends, else its B3 headers (Envoy's Zipkin tracer),
// and its baggage, so that a decision's span is a child of the request's.
func newTracing(tp trace.TracerProvider) *tracing {
	if tp == nil {
		return nil
	}
	return &tracing{
		tracer: tp.Tracer(TracerName),
		prop:   propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, b3{}, propagation.Baggage{}),
	}
}

// metadataCarrier reads a trace context from incoming gRPC metadata.
type metadataCarrier metadata.MD

// Get returns the first value of key.
func (m metadataCarrier) Get(key string) string {
	if v := metadata.MD(m).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set is unused: the server only reads a trace context.
func (m metadataCarrier) Set(key, value string) { metadata.MD(m).Set(key, value) }

// Keys lists the metadata's keys.
func (m metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// startGRPC starts the server span of a gRPC call to method (its full
// name), a child of the caller's trace context; end ends it with the
// call's error.
func (t *tracing) startGRPC(ctx context.Context, method string) (_ context.Context, end func(error)) {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		ctx = t.prop.Extract(ctx, metadataCarrier(md))
	}
	ctx, span := t.tracer.Start(ctx, method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("rpc.system", "grpc"), attribute.String("rpc.method", method)))
	return ctx, func(err error) {
		st, _ := status.FromError(err)
		span.SetAttributes(attribute.Int("rpc.grpc.status_code", int(st.Code())))
		if err != nil {
			span.SetStatus(codes.Error, st.Message())
		}
		span.End()
	}
}

// statusWriter remembers the status code of a response.
type statusWriter struct {
	http.ResponseWriter
	code int
}

// WriteHeader records code and writes it.
func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write records an implicit 200.
func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap gives http.ResponseController the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// traced wraps an API handler in a server span named after the method and
// path ("POST /v1/take": the API's paths are fixed, so the names are few),
// a child of the request's trace context. Without tracing it returns h.
func (s *Server) traced(h http.HandlerFunc) http.HandlerFunc {
	t := s.tracing
	if t == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := t.tracer.Start(ctx, r.Method+" "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w}
		h(sw, r.WithContext(ctx))
		code := sw.code
		if code == 0 {
			code = http.StatusOK
		}
		span.SetAttributes(attribute.Int("http.response.status_code", code))
		if code >= 500 {
			span.SetStatus(codes.Error, http.StatusText(code))
		}
	}
}

// annotateRLS adds a rate-limit decision to the span in ctx: the domain,
// the number of descriptors and the overall code (absent when the request
// failed).
func (s *Server) annotateRLS(ctx context.Context, req *rlspb.RateLimitRequest, resp *rlspb.RateLimitResponse) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String(AttrDomain, req.GetDomain()), attribute.Int(AttrDescriptors, len(req.GetDescriptors())))
	if resp != nil {
		span.SetAttributes(attribute.String(AttrOverallCode, resp.GetOverallCode().String()))
	}
}
