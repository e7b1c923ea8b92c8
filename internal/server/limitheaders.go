package server

import (
	"fmt"
	"math"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http/httpguts"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/headers"
)

// Default names of envoyproxy/ratelimit's response headers, as its
// LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER
// default.
const (
	DefaultLimitHeader     = "RateLimit-Limit"
	DefaultRemainingHeader = "RateLimit-Remaining"
	DefaultResetHeader     = "RateLimit-Reset"
)

// LimitHeaders configure envoyproxy/ratelimit's response headers
// (LIMIT_RESPONSE_HEADERS_ENABLED). They are apart from the IETF draft's
// fields (Options.ResponseHeaders): either, both or neither may be on.
type LimitHeaders struct {
	// Enabled adds the three headers to every RLS response one of whose
	// descriptors matched a limit.
	Enabled bool
	// Limit, Remaining and Reset are the headers' names. Defaults
	// DefaultLimitHeader, DefaultRemainingHeader and DefaultResetHeader.
	Limit, Remaining, Reset string
}

// withDefaults returns h with each empty name set to its default.
func (h LimitHeaders) withDefaults() LimitHeaders {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&h.Limit, DefaultLimitHeader)
	def(&h.Remaining, DefaultRemainingHeader)
	def(&h.Reset, DefaultResetHeader)
	return h
}

// validate checks that each name given is an HTTP field name.
func (h LimitHeaders) validate() error {
	for _, n := range []struct{ what, name string }{{"limit", h.Limit}, {"remaining", h.Remaining}, {"reset", h.Reset}} {
		if n.name != "" && !httpguts.ValidHeaderFieldName(n.name) {
			return fmt.Errorf("%w: server: the %s header's name %q is not an HTTP field name (letters, digits and !#$%%&'*+-.^_`|~)", fleetrate.ErrInvalid, n.what, n.name)
		}
	}
	return nil
}

// limitHeaders are envoyproxy/ratelimit's three headers for a response,
// picked and computed as it does (src/service/ratelimit.go): the
// descriptor reported is the first with the fewest limit_remaining among
// those with a current_limit, unless a descriptor that is neither
// unlimited nor in quota mode is OVER_LIMIT, in which case it is the last
// such one. Limit is its current_limit's requests_per_unit, Remaining its
// limit_remaining (0 when over the limit), and Reset the seconds of its
// duration_until_reset, which envoyproxy/ratelimit computes with the same
// clock and formula as the header (the time until its fixed window ends),
// and fleetrate as the bucket's: the time until it is full again, or,
// for a denial, until the request would pass. A status without one (a
// cost above the burst, which no wait admits) reports the limit's period.
// The headers are absent when no descriptor matched a limit. Global
// shadow mode keeps them, as the statuses are kept.
func limitHeaders(h LimitHeaders, quotaMode bool, plans []plan, outs []outcome) []*corev3.HeaderValue {
	var pick *rlspb.RateLimitResponse_DescriptorStatus
	least := uint32(math.MaxUint32)
	for i := range outs {
		st, r := outs[i].status, plans[i].rule
		if st == nil {
			continue
		}
		if st.CurrentLimit != nil && st.LimitRemaining < least {
			pick, least = st, st.LimitRemaining
		}
		unlimited := r != nil && r.Unlimited
		inQuota := quotaMode || (r != nil && r.QuotaMode)
		if !unlimited && !inQuota && st.Code == rlspb.RateLimitResponse_OVER_LIMIT {
			pick, least = st, 0
		}
	}
	if pick == nil || pick.CurrentLimit == nil {
		return nil
	}
	// One allocation for the three values (and one for the slice).
	hv := &[3]corev3.HeaderValue{
		{Key: h.Limit, Value: strconv.FormatUint(uint64(pick.CurrentLimit.RequestsPerUnit), 10)},
		{Key: h.Remaining, Value: strconv.FormatUint(uint64(pick.LimitRemaining), 10)},
		{Key: h.Reset, Value: strconv.FormatInt(resetSeconds(pick), 10)},
	}
	return []*corev3.HeaderValue{&hv[0], &hv[1], &hv[2]}
}

// resetSeconds is RateLimit-Reset for a status: its
// duration_until_reset's whole seconds, else its limit's period.
func resetSeconds(st *rlspb.RateLimitResponse_DescriptorStatus) int64 {
	if d := st.GetDurationUntilReset(); d != nil {
		return max(d.GetSeconds(), 0)
	}
	cl := st.GetCurrentLimit()
	spec := config.LimitSpec{RequestsPerUnit: cl.GetRequestsPerUnit(), Unit: config.Unit(cl.GetUnit()), UnitMultiplier: cl.GetUnitMultiplier().GetValue()}
	return headers.DelaySeconds(spec.Period())
}
