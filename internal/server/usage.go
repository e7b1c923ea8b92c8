package server

import (
	"fmt"
	"net/http"
	"net/url"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/server/wire"
)

// UsagePath is the usage endpoint: GET /v1/usage?bucket=... for a
// configured bucket, or ?domain=...&key=...&value=... for the bucket of
// an RLS descriptor.
const UsagePath = "/v1/usage"

// UsageView is the answer of GET /v1/usage: where one bucket stands, read
// in one store call that takes nothing (a peek), for a customer's "my
// usage" page.
type UsageView struct {
	// Bucket is the configured bucket, for ?bucket=; Domain and Rule the
	// domain and the rule's ID, for a descriptor.
	Bucket string `json:"bucket,omitempty"`
	Domain string `json:"domain,omitempty"`
	Rule   string `json:"rule,omitempty"`
	// Unlimited is set for a descriptor whose rule is unlimited; DeniesAll
	// for one whose rule admits nothing (requests_per_unit 0). Neither asks
	// the store.
	Unlimited bool `json:"unlimited,omitempty"`
	DeniesAll bool `json:"denies_all,omitempty"`
	// AtUnixMicro is the store's clock when it was read.
	AtUnixMicro int64 `json:"at_unix_micro,omitempty"`
	// Limit is the token-bucket limit with the fewest tokens left, and
	// Remaining how many it holds; FullAfterMS is how long until every
	// limit is full again. Absent when every limit is served as a quota
	// (fixed_window).
	Limit       *wire.Limit `json:"limit,omitempty"`
	Remaining   *int64      `json:"remaining,omitempty"`
	FullAfterMS *float64    `json:"full_after_ms,omitempty"`
	// Quotas are the bucket's calendar quotas.
	Quotas []QuotaView `json:"quotas,omitempty"`
	// Available is how many takes of one token the bucket grants now, one
	// after the other: the least of Remaining and every quota's.
	Available int64 `json:"available"`
}

// QuotaView is where one calendar quota stands.
type QuotaView struct {
	// Bucket names the bucket holding the quota, in a take's answer.
	Bucket string `json:"bucket,omitempty"`
	Name   string `json:"name,omitempty"`
	Count  int64  `json:"count"`
	Period string `json:"period"`
	// Used and Remaining are what the window used and has left;
	// ResetUnixMicro is when it ends (the quota is whole again), on the
	// store's clock, and ResetAfterMS the time until then.
	Used           int64   `json:"used"`
	Remaining      int64   `json:"remaining"`
	ResetUnixMicro int64   `json:"reset_unix_micro"`
	ResetAfterMS   float64 `json:"reset_after_ms"`
}

// handleUsage serves GET /v1/usage: one peek of the bucket the query
// names. A store failure is a 503 with its error, never a usage.
func (s *Server) handleUsage(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	v, b, err := s.usageBucket(q)
	if err != nil || v.Unlimited || v.DeniesAll {
		if err == nil {
			writeJSON(w, http.StatusOK, v)
		}
		return err
	}
	ctx, cancel := s.storeCtx(r.Context())
	defer cancel()
	res, err := s.store.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{b}})
	if err != nil {
		return err
	}
	u := fleetrate.Usage{Bucket: b.Key, At: res.At, Limit: res.Limit, Remaining: res.Remaining, Full: res.At.Add(res.ResetAfter), Quotas: res.Quotas}
	fillUsage(&v, u)
	writeJSON(w, http.StatusOK, v)
	return nil
}

// fillUsage puts u in v.
func fillUsage(v *UsageView, u fleetrate.Usage) {
	v.AtUnixMicro = u.At.UnixMicro()
	v.Available = u.Available()
	if !config.IsPassThrough(u.Limit) {
		l, rem, full := wire.FromLimit(u.Limit), max(u.Remaining, 0), millis(u.Full.Sub(u.At))
		v.Limit, v.Remaining, v.FullAfterMS = &l, &rem, &full
	}
	v.Quotas = quotaViews(nil, fleetrate.Result{At: u.At, Quotas: u.Quotas})
}

// quotaViews reports the quotas of res, each naming its bucket when
// names are given (the names of the take's buckets, in order).
func quotaViews(names []string, res fleetrate.Result) []QuotaView {
	var out []QuotaView
	for _, q := range res.Quotas {
		qv := QuotaView{Name: q.Quota.Name, Count: q.Quota.Count, Period: q.Quota.Period.String(),
			Used: q.Used, Remaining: q.Remaining, ResetUnixMicro: q.Reset.UnixMicro(), ResetAfterMS: millis(max(q.Reset.Sub(res.At), 0))}
		if q.Bucket >= 0 && q.Bucket < len(names) {
			qv.Bucket = names[q.Bucket]
		}
		out = append(out, qv)
	}
	return out
}

// usageBucket resolves the query of GET /v1/usage to the bucket it
// names: ?bucket= for a configured bucket, or ?domain= with key= and
// value= (repeated, in order, for a descriptor of several entries) for
// the bucket of an RLS descriptor, as its rule takes it.
func (s *Server) usageBucket(q url.Values) (UsageView, fleetrate.Bucket, error) {
	for k := range q {
		if k != "bucket" && k != "domain" && k != "key" && k != "value" {
			return UsageView{}, fleetrate.Bucket{}, badRequest(wire.CodeInvalid, "unknown parameter %q: want bucket, or domain with key and value", k)
		}
	}
	if name := q.Get("bucket"); name != "" || q.Has("bucket") {
		if q.Has("domain") || q.Has("key") || q.Has("value") {
			return UsageView{}, fleetrate.Bucket{}, badRequest(wire.CodeInvalid, "give bucket, or domain with key and value, not both")
		}
		names, bs, err := s.resolve(name, nil)
		if err != nil {
			return UsageView{}, fleetrate.Bucket{}, err
		}
		return UsageView{Bucket: names[0]}, bs[0], nil
	}
	domain, keys, values := q.Get("domain"), q["key"], q["value"]
	switch {
	case domain == "":
		return UsageView{}, fleetrate.Bucket{}, badRequest(wire.CodeInvalid, "bucket, or domain with key and value: required")
	case len(keys) == 0:
		return UsageView{}, fleetrate.Bucket{}, badRequest(wire.CodeInvalid, "key: at least one descriptor entry is required")
	case len(values) > len(keys):
		return UsageView{}, fleetrate.Bucket{}, badRequest(wire.CodeInvalid, "value: %d values for %d keys", len(values), len(keys))
	}
	d := &rlcommon.RateLimitDescriptor{}
	for i, k := range keys {
		e := &rlcommon.RateLimitDescriptor_Entry{Key: k}
		if i < len(values) {
			e.Value = values[i]
		}
		d.Entries = append(d.Entries, e)
	}
	entries, _, err := descriptorEntries(0, d)
	if err != nil {
		return UsageView{}, fleetrate.Bucket{}, badRequest(wire.CodeInvalid, "%v", err)
	}
	return s.ruleBucket(domain, entries)
}

// ruleBucket is usageBucket for a descriptor of domain.
func (s *Server) ruleBucket(domain string, entries []config.Entry) (UsageView, fleetrate.Bucket, error) {
	st := s.state.Load()
	dom := st.cfg.Domain(domain)
	if dom == nil {
		return UsageView{}, fleetrate.Bucket{}, badRequest(wire.CodeInvalid, "domain %q is not configured", domain)
	}
	m := dom.Match(entries)
	if m.Rule == nil {
		return UsageView{}, fleetrate.Bucket{}, badRequest(wire.CodeInvalid, "no rule of domain %q matches the descriptor %s", domain, describeEntries(entries))
	}
	v := UsageView{Domain: domain, Rule: m.Rule.ID, Unlimited: m.Rule.Unlimited, DeniesAll: m.Rule.Denies()}
	rl, ok := st.rules[m.Rule]
	if v.Unlimited || v.DeniesAll || !ok {
		v.Unlimited = v.Unlimited || !v.DeniesAll && !ok
		return v, fleetrate.Bucket{}, nil
	}
	return v, fleetrate.Bucket{Prefix: s.opts.Prefix, Key: m.Key, Limits: rl.limits, Quotas: rl.quotas}, nil
}

// describeEntries writes entries as key=value pairs for an error.
func describeEntries(entries []config.Entry) string {
	s := ""
	for i, e := range entries {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%q=%q", e.Key, e.Value)
	}
	return s
}
