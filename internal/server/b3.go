package server

import (
	"context"
	"encoding/hex"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// b3 reads a Zipkin B3 trace context, which Envoy sends with its Zipkin
// tracer (and envoyproxy/ratelimit reads): the single "b3" header
// ("{trace}-{span}[-{sampled}[-{parent}]]") or the x-b3-* headers. A
// context W3C's traceparent already gave wins. It only extracts: the
// server starts traces, it never sends them on.
type b3 struct{}

var _ propagation.TextMapPropagator = b3{}

// Inject does nothing: the server sends no requests on.
func (b3) Inject(context.Context, propagation.TextMapCarrier) {}

// Fields are the headers Extract reads.
func (b3) Fields() []string {
	return []string{"b3", "x-b3-traceid", "x-b3-spanid", "x-b3-sampled", "x-b3-flags"}
}

// Extract returns ctx with the B3 context of c as its remote span
// context, when c holds a valid one and ctx has none yet.
func (b3) Extract(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	if trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	var tid, sid, sampled string
	if single := c.Get("b3"); single != "" {
		parts := strings.Split(single, "-")
		if len(parts) < 2 || len(parts) > 4 {
			return ctx // "0", "1", "d" alone: a sampling decision without a context
		}
		tid, sid = parts[0], parts[1]
		if len(parts) > 2 {
			sampled = parts[2]
		}
	} else {
		tid, sid, sampled = c.Get("x-b3-traceid"), c.Get("x-b3-spanid"), c.Get("x-b3-sampled")
		if c.Get("x-b3-flags") == "1" {
			sampled = "d"
		}
	}
	sc, ok := parseB3(tid, sid, sampled)
	if !ok {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// parseB3 builds a span context from B3's trace id (16 or 32 lower-case
// hex digits), span id (16) and sampling state ("1", "d", "true" sample;
// "0", "false" or empty do not).
func parseB3(tid, sid, sampled string) (trace.SpanContext, bool) {
	if len(tid) == 16 {
		tid = "0000000000000000" + tid
	}
	if len(tid) != 32 || len(sid) != 16 || strings.ToLower(tid) != tid || strings.ToLower(sid) != sid {
		return trace.SpanContext{}, false
	}
	var t trace.TraceID
	var s trace.SpanID
	if _, err := hex.Decode(t[:], []byte(tid)); err != nil {
		return trace.SpanContext{}, false
	}
	if _, err := hex.Decode(s[:], []byte(sid)); err != nil {
		return trace.SpanContext{}, false
	}
	cfg := trace.SpanContextConfig{TraceID: t, SpanID: s, Remote: true}
	switch sampled {
	case "1", "d", "true":
		cfg.TraceFlags = trace.FlagsSampled
	case "", "0", "false":
	default:
		return trace.SpanContext{}, false
	}
	sc := trace.NewSpanContext(cfg)
	return sc, sc.IsValid()
}
