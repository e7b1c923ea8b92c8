package server

import (
	"strconv"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// dynamicMetadata is the dynamic metadata of an RLS response, in
// envoyproxy/ratelimit's layout: "domain", "descriptors" (each with
// "entries" as "key=value", and "limit" (overrideText) and "hitsAddend" when the
// descriptor has them), "hitsAddend" when the request sets it, and
// "metadata": the metadata of the rules of the descriptors that passed,
// merged (the first value of a name wins; mappings merge recursively).
func dynamicMetadata(req *rlspb.RateLimitRequest, plans []plan, outs []outcome) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.GetDomain())}
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		entries := make([]*structpb.Value, len(d.GetEntries()))
		for i, e := range d.GetEntries() {
			entries[i] = structpb.NewStringValue(e.GetKey() + "=" + e.GetValue())
		}
		df := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if l := d.GetLimit(); l != nil {
			df["limit"] = structpb.NewStringValue(overrideText(l))
		}
		if h := d.GetHitsAddend(); h != nil {
			df["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: df}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: descs})
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i, o := range outs {
		r := plans[i].rule
		if r == nil || r.Unlimited || r.Metadata == nil || o.status == nil || o.status.Code == rlspb.RateLimitResponse_OVER_LIMIT {
			continue
		}
		mergeStruct(passed, r.Metadata)
	}
	if len(passed.Fields) > 0 {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: fields}
}

// mergeStruct adds src's fields to dst: a name dst lacks is copied (a
// deep copy, so that the rule's metadata is never shared with a
// response); a mapping present in both is merged; otherwise dst keeps its
// value.
func mergeStruct(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		old, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = cloneValue(v)
			continue
		}
		if os, ss := old.GetStructValue(), v.GetStructValue(); os != nil && ss != nil {
			mergeStruct(os, ss)
		}
	}
}

func cloneValue(v *structpb.Value) *structpb.Value {
	c, _ := structpb.NewValue(v.AsInterface())
	return c
}

// overrideText is a descriptor's limit override as envoyproxy/ratelimit
// writes it in dynamic metadata, the message's String(): protobuf's
// one-line text format, such as "requests_per_unit:100 unit:MINUTE", each
// field that is not zero as name:value, an enum by its name (its number
// when it has none), separated by one space. (protobuf-go's String() may
// put two spaces in a given binary, to keep its output from being relied
// on; one is its canonical form.)
func overrideText(l *rlcommon.RateLimitDescriptor_RateLimitOverride) string {
	var parts []string
	if n := l.GetRequestsPerUnit(); n != 0 {
		parts = append(parts, "requests_per_unit:"+strconv.FormatUint(uint64(n), 10))
	}
	if u := l.GetUnit(); u != 0 {
		name := u.String() // the number, when the enum has no such value
		parts = append(parts, "unit:"+name)
	}
	return strings.Join(parts, " ")
}
