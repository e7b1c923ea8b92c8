package server

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

func TestB3Extract(t *testing.T) {
	t.Parallel()
	const tid, sid = "80f198ee56343ba864fe8b2a57d3eff7", "e457b5a2e4d86bd1"
	for _, c := range []struct {
		name    string
		headers map[string]string
		trace   string // "" for none
		sampled bool
	}{
		{"single", map[string]string{"b3": tid + "-" + sid + "-1-05e3ac9a4f6e3b90"}, tid, true},
		{"single unsampled", map[string]string{"b3": tid + "-" + sid + "-0"}, tid, false},
		{"single debug", map[string]string{"b3": tid + "-" + sid + "-d"}, tid, true},
		{"single 64-bit trace", map[string]string{"b3": "64fe8b2a57d3eff7-" + sid}, "000000000000000064fe8b2a57d3eff7", false},
		{"sampling only", map[string]string{"b3": "1"}, "", false},
		{"multi", map[string]string{"X-B3-TraceId": tid, "X-B3-SpanId": sid, "X-B3-Sampled": "1"}, tid, true},
		{"multi debug flag", map[string]string{"X-B3-TraceId": tid, "X-B3-SpanId": sid, "X-B3-Flags": "1"}, tid, true},
		{"upper case", map[string]string{"b3": "80F198EE56343BA864FE8B2A57D3EFF7-" + sid}, "", false},
		{"zero trace", map[string]string{"b3": "00000000000000000000000000000000-" + sid}, "", false},
		{"bad sampling", map[string]string{"b3": tid + "-" + sid + "-yes"}, "", false},
		{"short span", map[string]string{"X-B3-TraceId": tid, "X-B3-SpanId": "e457"}, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			for k, v := range c.headers {
				h.Set(k, v)
			}
			sc := trace.SpanContextFromContext(b3{}.Extract(context.Background(), propagation.HeaderCarrier(h)))
			if c.trace == "" {
				if sc.IsValid() {
					t.Fatalf("got %v, want no context", sc)
				}
				return
			}
			if sc.TraceID().String() != c.trace || sc.SpanID().String() != sid || sc.IsSampled() != c.sampled || !sc.IsRemote() {
				t.Errorf("got trace %s span %s sampled %v remote %v; want %s %s %v", sc.TraceID(), sc.SpanID(), sc.IsSampled(), sc.IsRemote(), c.trace, sid, c.sampled)
			}
		})
	}
	// W3C's traceparent wins over B3.
	h := http.Header{}
	h.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	h.Set("b3", tid+"-"+sid+"-1")
	p := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, b3{})
	if got := trace.SpanContextFromContext(p.Extract(context.Background(), propagation.HeaderCarrier(h))).TraceID().String(); got != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("with both: trace %s, want traceparent's", got)
	}
}

// FuzzB3 feeds B3 headers to the extractor: it never panics, and a
// context it returns is valid and remote.
func FuzzB3(f *testing.F) {
	f.Add("80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90", "", "", "")
	f.Add("", "80f198ee56343ba864fe8b2a57d3eff7", "e457b5a2e4d86bd1", "1")
	f.Add("1", "", "", "")
	f.Fuzz(func(t *testing.T, single, tid, sid, sampled string) {
		h := http.Header{}
		h.Set("b3", single)
		h.Set("x-b3-traceid", tid)
		h.Set("x-b3-spanid", sid)
		h.Set("x-b3-sampled", sampled)
		ctx := b3{}.Extract(context.Background(), propagation.HeaderCarrier(h))
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() != sc.IsRemote() {
			t.Fatalf("span context %v: valid %v, remote %v", sc, sc.IsValid(), sc.IsRemote())
		}
	})
}
