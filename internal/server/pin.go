package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/fleetrate/fleetrate"
)

// rlsKeyPrefix starts the keys (after the prefix) of the RLS rules'
// buckets (config.DescriptorKey).
const rlsKeyPrefix = "rls:"

// pinned keeps the raw store API off the buckets the configuration
// defines, so that no client rewrites a shared bucket's limits (a store
// converts a bucket's state to the limits a take gives):
//
//   - the keys of RLS rules ("<prefix>rls:...") and of given-back grants
//     ("<prefix>_grant:...") are refused outright: their limits come from
//     requests the client does not see;
//   - a bucket of the configuration's buckets section is served only with
//     the configuration's limits (rate and burst, in order) and in-flight
//     bound (in_flight; see pinnedInFlight) and calendar quotas (see
//     pinnedQuotas), and a drain
//     or a reset of one (admin, true) needs the admin scope, as /v1/drain
//     and /v1/reset do.
//
// bs have passed ownBuckets (every key starts with the prefix).
func (s *Server) pinned(ctx context.Context, bs []fleetrate.Bucket, admin bool) error {
	for i, b := range bs {
		if err := s.pinnedKey(ctx, fmt.Sprintf("buckets[%d]", i), b.StoreKey(), b.Limits, admin); err != nil {
			return err
		}
		if err := s.pinnedInFlight(ctx, fmt.Sprintf("buckets[%d]", i), b); err != nil {
			return err
		}
		if err := s.pinnedQuotas(ctx, fmt.Sprintf("buckets[%d]", i), b); err != nil {
			return err
		}
	}
	return nil
}

// pinnedKey is pinned for one key; limits nil (a reset) checks the key
// alone.
func (s *Server) pinnedKey(ctx context.Context, field, key string, limits []fleetrate.Limit, admin bool) error {
	c := callerOf(ctx)
	rest := strings.TrimPrefix(key, s.opts.Prefix)
	if strings.HasPrefix(rest, rlsKeyPrefix) || strings.HasPrefix(rest, grantKeyPrefix) {
		return s.access.refuse(c, reasonReserved, http.StatusForbidden, codePinned, fmt.Sprintf(
			"%s: key %q belongs to the service's RLS rules or grants: the raw store API does not serve it", field, key))
	}
	fb, ok := s.state.Load().buckets[rest]
	if !ok || fb.Key != rest {
		return nil
	}
	if admin {
		if err := s.access.need(c, ScopeAdmin); err != nil {
			return err
		}
	}
	if limits != nil && !sameLimits(limits, fb.Limits) {
		return s.access.refuse(c, reasonPinned, http.StatusForbidden, codePinned, fmt.Sprintf(
			"%s: key %q is a configured bucket: the raw store API serves it only with the configuration's limits %s, got %s",
			field, key, limitList(fb.Limits), limitList(limits)))
	}
	return nil
}

func sameLimits(a, b []fleetrate.Limit) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Rate != b[i].Rate || a[i].Burst != b[i].Burst {
			return false
		}
	}
	return true
}

func limitList(ls []fleetrate.Limit) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = fmt.Sprintf("{rate %g/s, burst %d}", l.Rate, l.Burst)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// pinnedInFlight keeps a configured bucket's in-flight bound: a client
// that gave another (or none, to take without a permit) would hold more
// permits than the configuration allows.
func (s *Server) pinnedInFlight(ctx context.Context, field string, b fleetrate.Bucket) error {
	rest := strings.TrimPrefix(b.StoreKey(), s.opts.Prefix)
	fb, ok := s.state.Load().buckets[rest]
	if !ok || fb.Key != rest || fb.InFlight == b.InFlight {
		return nil
	}
	c := callerOf(ctx)
	return s.access.refuse(c, reasonPinned, http.StatusForbidden, codePinned, fmt.Sprintf(
		"%s.in_flight: key %q is a configured bucket: the raw store API serves it only with the configuration's in_flight %d, got %d",
		field, b.StoreKey(), fb.InFlight, b.InFlight))
}

// pinnedQuotas keeps a configured bucket's calendar quotas: a client that
// gave others (or none) would take what the quotas do not count, or
// count against a window the configuration does not have.
func (s *Server) pinnedQuotas(ctx context.Context, field string, b fleetrate.Bucket) error {
	rest := strings.TrimPrefix(b.StoreKey(), s.opts.Prefix)
	fb, ok := s.state.Load().buckets[rest]
	if !ok || fb.Key != rest || sameQuotas(fb.Quotas, b.Quotas) {
		return nil
	}
	return s.access.refuse(callerOf(ctx), reasonPinned, http.StatusForbidden, codePinned, fmt.Sprintf(
		"%s.quotas: key %q is a configured bucket: the raw store API serves it only with the configuration's quotas %v, got %v",
		field, b.StoreKey(), fb.Quotas, b.Quotas))
}

// sameQuotas reports whether a and b are the same quotas in the same
// order: count and period (names label only).
func sameQuotas(a, b []fleetrate.Quota) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Count != b[i].Count || a[i].Key() != b[i].Key() {
			return false
		}
	}
	return true
}
