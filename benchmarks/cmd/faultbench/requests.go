package main

// The generator's requests: built and marshalled once, and sent and read
// through lean, a codec that skips what the measurement does not need.

import (
	"fmt"
	"strconv"
	"sync"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// request returns call i's request: descriptors buckets of the 1000,
// from bucket i*descriptors on. The requests repeat every
// 1000/gcd(descriptors, 1000) calls and are built once, so that at 10
// times the service's decisions the generator's own CPU goes to sending
// calls rather than building them (it is read-only, and proto.Marshal may
// read it from many goroutines).
func request(i int) *rlspb.RateLimitRequest {
	requestsOnce.Do(func() {
		period := 1000
		for g := 1000; g > 0; g-- {
			if descriptors%g == 0 && 1000%g == 0 {
				period = 1000 / g
				break
			}
		}
		for n := range period {
			req := &rlspb.RateLimitRequest{Domain: "bench", HitsAddend: 1}
			for d := range descriptors {
				req.Descriptors = append(req.Descriptors, &rlcommon.RateLimitDescriptor{
					Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "key" + strconv.Itoa((n*descriptors+d)%1000)}}})
			}
			requests = append(requests, req)
			if b, err := proto.Marshal(req); err == nil {
				wire[req] = b // else lean marshals it on every call
			}
		}
	})
	return requests[i%len(requests)]
}

var (
	requestsOnce sync.Once
	requests     []*rlspb.RateLimitRequest
	wire         = map[*rlspb.RateLimitRequest][]byte{} // requests' bytes, for lean
)

// lean is the generator's codec: a request is marshalled once (see
// request) and a response read only for its overall code, so that at 10
// times the service's decisions the generator's CPU goes to making calls
// rather than to protobuf. With 32 descriptors a call, unmarshalling each
// answer's 32 statuses cost the generator more than the service's
// decision cost the service.
type lean struct{}

// Name is the content subtype the service's proto codec serves.
func (lean) Name() string { return "proto" }

// Marshal returns a request's bytes, marshalled once.
func (lean) Marshal(v any) ([]byte, error) {
	if req, ok := v.(*rlspb.RateLimitRequest); ok {
		if b, ok := wire[req]; ok {
			return b, nil
		}
	}
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("faultbench: cannot marshal %T", v)
	}
	return proto.Marshal(m)
}

// Unmarshal reads a RateLimitResponse's overall_code (field 1) and skips
// the rest; any other message in full.
func (lean) Unmarshal(data []byte, v any) error {
	resp, ok := v.(*rlspb.RateLimitResponse)
	if !ok {
		m, ok := v.(proto.Message)
		if !ok {
			return fmt.Errorf("faultbench: cannot unmarshal into %T", v)
		}
		return proto.Unmarshal(data, m)
	}
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		if num == 1 && typ == protowire.VarintType {
			code, m := protowire.ConsumeVarint(data)
			if m < 0 {
				return protowire.ParseError(m)
			}
			resp.OverallCode = rlspb.RateLimitResponse_Code(code)
			return nil
		}
		m := protowire.ConsumeFieldValue(num, typ, data)
		if m < 0 {
			return protowire.ParseError(m)
		}
		data = data[m:]
	}
	return nil
}
