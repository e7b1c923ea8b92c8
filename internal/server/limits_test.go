package server

import (
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestOversizedDescriptorsRejected checks the service-level bounds on
// descriptor bytes: an oversized key, value, descriptor or request is
// INVALID_ARGUMENT (400 on /json), the message gives sizes and never
// echoes the input, and nothing reaches the store.
func TestOversizedDescriptorsRejected(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig)
	big := strings.Repeat("Q", MaxEntryBytes+1)
	mid := strings.Repeat("Q", MaxEntryBytes)
	many := make([]*rlcommon.RateLimitDescriptor, 0, MaxDescriptors)
	for range 40 {
		many = append(many, desc("a", mid))
	}
	tests := []struct {
		name string
		ds   []*rlcommon.RateLimitDescriptor
		want string
	}{
		{"value", []*rlcommon.RateLimitDescriptor{desc("remote_address", big)}, "descriptors[0].entries[0].value: 1025 bytes, at most 1024"},
		{"key", []*rlcommon.RateLimitDescriptor{desc(big, "v")}, "descriptors[0].entries[0].key: 1025 bytes"},
		{"descriptor", []*rlcommon.RateLimitDescriptor{desc("a", mid, "b", mid, "c", mid, "d", mid, "e", "x")}, "descriptors[0].entries: keys and values total 4102 bytes, at most 4096"},
		{"request", many, "descriptors: keys and values total more than 32768 bytes"},
	}
	for _, tt := range tests {
		_, err := ts.rls.ShouldRateLimit(ctxT(t), &rlspb.RateLimitRequest{Domain: "edge", Descriptors: tt.ds})
		st, _ := status.FromError(err)
		if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tt.want) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT %q", tt.name, err, tt.want)
		}
		if strings.Contains(st.Message(), "QQ") {
			t.Errorf("%s: the error echoes the input: %.200s", tt.name, st.Message())
		}
	}
	code := ts.post(t, "/json", `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"`+big+`"}]}]}`, nil)
	if code != 400 {
		t.Errorf("/json with an oversized value: %d, want 400", code)
	}
	if !metricHas(t, ts, `fleetrate_store_duration_seconds_count{op="take"} 0`) && metricHas(t, ts, `fleetrate_store_duration_seconds_count{op="take"}`) {
		t.Error("an oversized request reached the store")
	}
}
