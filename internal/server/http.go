package server

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/headers"
	"github.com/fleetrate/fleetrate/internal/server/wire"
)

// httpError is a request the HTTP API refuses.
type httpError struct {
	status int
	code   string
	msg    string
}

// Error returns the message.
func (e *httpError) Error() string { return e.msg }

func badRequest(code, format string, args ...any) *httpError {
	return &httpError{status: http.StatusBadRequest, code: code, msg: fmt.Sprintf(format, args...)}
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", s.open(http.MethodGet, s.healthz))
	mux.HandleFunc("/readyz", s.open(http.MethodGet, s.readyz))
	mux.HandleFunc("/healthcheck", s.open(http.MethodGet, s.healthcheck))
	mux.Handle("/metrics", s.open(http.MethodGet, promhttp.HandlerFor(s.opts.Registry, promhttp.HandlerOpts{}).ServeHTTP))
	// Each endpoint's scope (see scope.go; docs/API.md lists them).
	mux.HandleFunc("/json", s.api(http.MethodPost, ScopeDecide, s.handleJSON))
	v := service{s}
	mux.HandleFunc("/v1/take", s.api(http.MethodPost, ScopeDecide, endpoint(s, v.take)))
	mux.HandleFunc("/v1/wait", s.api(http.MethodPost, ScopeDecide, endpoint(s, v.wait)))
	mux.HandleFunc("/v1/refund", s.api(http.MethodPost, ScopeDecide, endpoint(s, v.refund)))
	mux.HandleFunc("/v1/cancel", s.api(http.MethodPost, ScopeDecide, endpoint(s, v.cancel)))
	mux.HandleFunc("/v1/drain", s.api(http.MethodPost, ScopeAdmin, endpoint(s, v.drain)))
	mux.HandleFunc("/v1/reset", s.api(http.MethodPost, ScopeAdmin, endpoint(s, v.reset)))
	mux.HandleFunc("/v1/config", s.api(http.MethodGet, ScopeAdmin, s.handleConfig))
	mux.HandleFunc(UsagePath, s.api(http.MethodGet, ScopeDecide, s.handleUsage))
	mux.HandleFunc(wire.TakePath, s.api(http.MethodPost, ScopeStore, s.storeAPI(endpoint(s, v.storeTake))))
	mux.HandleFunc(wire.RefundPath, s.api(http.MethodPost, ScopeStore, s.storeAPI(endpoint(s, v.storeRefund))))
	mux.HandleFunc(wire.CancelPath, s.api(http.MethodPost, ScopeStore, s.storeAPI(endpoint(s, v.storeCancel))))
	mux.HandleFunc(wire.DrainPath, s.api(http.MethodPost, ScopeStore, s.storeAPI(endpoint(s, v.storeDrain))))
	mux.HandleFunc(wire.ResetPath, s.api(http.MethodPost, ScopeStore, s.storeAPI(endpoint(s, v.storeReset))))
	s.mountPermits(mux, v)
	s.mountOutbound(mux)
	s.mountPages(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &httpError{status: http.StatusNotFound, code: wire.CodeNotFound, msg: fmt.Sprintf("no such endpoint %s %s", r.Method, r.URL.Path)})
	})
	return s.recoverPanics(mux)
}

func (s *Server) recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic serving HTTP", "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
				writeError(w, &httpError{status: http.StatusInternalServerError, code: wire.CodeInternal, msg: "internal error"})
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// open serves an endpoint that needs no token.
func (s *Server) open(method string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
			w.Header().Set("Allow", method)
			writeError(w, &httpError{status: http.StatusMethodNotAllowed, code: wire.CodeMethod, msg: fmt.Sprintf("%s needs %s, got %s", r.URL.Path, method, r.Method)})
			return
		}
		h(w, r)
	}
}

// api serves an API endpoint: method check, the caller's scope (need),
// body limit.
func (s *Server) api(method string, need Scope, h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return s.open(method, s.traced(func(w http.ResponseWriter, r *http.Request) {
		s.metrics.inflight.Inc()
		defer s.metrics.inflight.Dec()
		ctx, ok := s.access.admit(w, r, r.URL.Path, need)
		if !ok {
			return
		}
		r = r.WithContext(ctx)
		r.Body = http.MaxBytesReader(w, r.Body, s.opts.MaxRequestBytes)
		if err := h(w, r); err != nil {
			var he *httpError
			if !errors.As(err, &he) {
				he = s.failure(err)
			}
			writeError(w, he)
		}
	}))
}

func (s *Server) storeAPI(h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.opts.DisableStoreAPI {
			return &httpError{status: http.StatusForbidden, code: wire.CodeDisabled, msg: "the raw store API is disabled on this server (store_api: false)"}
		}
		return h(w, r)
	}
}

// failure maps an error from deciding to an HTTP error: a bad argument is
// 400, anything else is the store failing (503), never a denial.
func (s *Server) failure(err error) *httpError {
	switch {
	case errors.Is(err, fleetrate.ErrBurstExceeded):
		return badRequest(wire.CodeBurstExceeded, "%v", err)
	case errors.Is(err, fleetrate.ErrInvalid):
		return badRequest(wire.CodeInvalid, "%v", err)
	}
	return &httpError{status: http.StatusServiceUnavailable, code: wire.CodeStoreUnavailable, msg: err.Error()}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status, data = http.StatusInternalServerError, []byte(`{"error":"encoding the response failed","code":"internal"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(data, '\n'))
}

func writeError(w http.ResponseWriter, e *httpError) {
	writeJSON(w, e.status, wire.Error{Error: e.msg, Code: e.code})
}

// readBody reads the whole (size-limited) body.
func readBody(r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, badRequest(wire.CodeBodyTooLarge, "request body is larger than the limit of %d bytes", mbe.Limit)
		}
		return nil, badRequest(wire.CodeInvalidJSON, "reading the request body: %v", err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, badRequest(wire.CodeInvalidJSON, "request body is empty; want a JSON object")
	}
	return data, nil
}

// decodeJSON decodes one JSON object strictly: unknown fields, wrong types
// and trailing data are errors that name the field.
func decodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return badRequest(wire.CodeInvalidJSON, "malformed JSON at byte %d: %v", se.Offset, se)
		case errors.As(err, &te):
			return badRequest(wire.CodeInvalidJSON, "field %q: want %s, got JSON %s", te.Field, te.Type, te.Value)
		case errors.Is(err, io.ErrUnexpectedEOF):
			return badRequest(wire.CodeInvalidJSON, "malformed JSON: unexpected end of the body")
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			return badRequest(wire.CodeInvalidJSON, "unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
		}
		return badRequest(wire.CodeInvalidJSON, "malformed JSON: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badRequest(wire.CodeInvalidJSON, "unexpected data after the JSON object")
	}
	return nil
}

// endpoint is the one adapter between HTTP and an operation of the API
// (see service): it decodes the body strictly into a Req, runs op within
// the store timeout, and writes what op returns as JSON with status 200,
// with the answer's own headers when it has some. An error goes back to
// api, which writes it.
func endpoint[Req, Resp any](s *Server, op func(context.Context, *Req) (Resp, error)) func(http.ResponseWriter, *http.Request) error {
	return endpointWith(s, op, true)
}

// endpointWith is endpoint; bounded false leaves op to bound each of its
// store calls itself (an operation that waits, such as /v1/acquire).
func endpointWith[Req, Resp any](s *Server, op func(context.Context, *Req) (Resp, error), bounded bool) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		var req Req
		if err := decodeBody(r, &req); err != nil {
			return err
		}
		ctx, cancel := r.Context(), noCancel
		if bounded {
			ctx, cancel = s.storeCtx(ctx)
		} else {
			// It may wait up to the max wait before it writes.
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.opts.MaxWait + s.opts.WriteTimeout))
		}
		defer cancel()
		resp, err := op(ctx, &req)
		if err != nil {
			return err
		}
		out := any(resp)
		if h, ok := out.(interface{ setHeaders(http.Header) }); ok {
			h.setHeaders(w.Header())
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}
}

func decodeBody(r *http.Request, v any) error {
	data, err := readBody(r)
	if err != nil {
		return err
	}
	return decodeJSON(data, v)
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// healthcheck is envoyproxy/ratelimit's /healthcheck, for the manifests
// that probe it: 200 with the body "OK" while serving, 500 from the moment
// shutdown begins. As there, it does not ask the store (a liveness probe
// must not restart the service because Redis is away; /readyz does),
// unless Options.HealthChecksStore says to (500 while the background
// probe finds the store down), as REDIS_HEALTH_CHECK_ACTIVE_CONNECTION.
func (s *Server) healthcheck(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() || s.opts.HealthChecksStore && s.storeDown.Load() || s.configMissing() {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("OK"))
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	err := s.configReady()
	if err == nil {
		err = s.ready(r.Context())
	}
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, s.readyBody(map[string]string{"status": "not ready", "error": err.Error()}))
		return
	}
	writeJSON(w, http.StatusOK, s.readyBody(map[string]string{"status": "ready"}))
}

// handleJSON is envoyproxy/ratelimit's /json: a RateLimitRequest in
// proto3 JSON; 200 when OK, 429 when over limit, the RateLimitResponse in
// proto3 JSON either way.
func (s *Server) handleJSON(w http.ResponseWriter, r *http.Request) error {
	data, err := readBody(r)
	if err != nil {
		return err
	}
	req := &rlspb.RateLimitRequest{}
	if err := protojson.Unmarshal(data, req); err != nil {
		msg := strings.TrimPrefix(err.Error(), "proto: ")
		if strings.Contains(msg, "invalid value for uint") {
			msg += " (hits_addend, requests_per_unit and unit_multiplier must be whole numbers >= 0)"
		}
		return badRequest(wire.CodeInvalidJSON, "%s", msg)
	}
	resp, err := s.shouldRateLimit(r.Context(), req)
	if s.tracing != nil {
		s.annotateRLS(r.Context(), req, resp)
	}
	if err != nil {
		return err
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		return err
	}
	code := http.StatusOK
	if resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT {
		code = http.StatusTooManyRequests
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(out, '\n'))
	return nil
}

// BucketsRequest names the buckets of a /v1 request: one in Bucket, or
// several (taken together, all or nothing) in Buckets.
type BucketsRequest struct {
	Bucket  string   `json:"bucket,omitempty"`
	Buckets []string `json:"buckets,omitempty"`
}

// TakeRequest is the body of POST /v1/take. N defaults to 1; 0 peeks.
// Reserve makes the take one of a lower priority class: it is granted
// only if every bucket keeps Reserve tokens after it (fleetrate.Priority).
//
// Costs, instead of Bucket, Buckets and N, take a cost from each bucket
// by name, all or nothing ("1 request and 1,200 tokens").
type TakeRequest struct {
	Bucket  string           `json:"bucket,omitempty"`
	Buckets []string         `json:"buckets,omitempty"`
	N       *int64           `json:"n,omitempty"`
	Reserve int64            `json:"reserve,omitempty"`
	Costs   map[string]int64 `json:"costs,omitempty"`
}

// WaitRequest is the body of POST /v1/wait. MaxWaitMS defaults to, and
// is capped at, the server's max wait. Reserve is as in TakeRequest; with
// it, MaxWaitMS is the class's horizon.
type WaitRequest struct {
	Bucket    string   `json:"bucket,omitempty"`
	Buckets   []string `json:"buckets,omitempty"`
	N         *int64   `json:"n,omitempty"`
	MaxWaitMS *float64 `json:"max_wait_ms,omitempty"`
	Reserve   int64    `json:"reserve,omitempty"`
	// Costs are as in TakeRequest.
	Costs map[string]int64 `json:"costs,omitempty"`
}

// RefundRequest is the body of POST /v1/refund: give back N (default 1)
// tokens of a grant that was not used. AtUnixMicro, required, is the
// grant's time (its decision's at_unix_micro); Reserve is the largest
// reserve the takes from these buckets use (see fleetrate.Store.Refund).
//
// Grant is the decision's grant: with it, N defaults to the tokens
// granted, AtUnixMicro may be left out, and the decide scope suffices;
// without it, the refund needs the admin scope.
type RefundRequest struct {
	Bucket      string   `json:"bucket,omitempty"`
	Buckets     []string `json:"buckets,omitempty"`
	N           *int64   `json:"n,omitempty"`
	AtUnixMicro int64    `json:"at_unix_micro"`
	Reserve     int64    `json:"reserve,omitempty"`
	Grant       string   `json:"grant,omitempty"`
}

// CancelRequest is the body of POST /v1/cancel: give back a booking of
// /v1/wait that will not be used, with the decision's n and booking (whose
// grant proves it; without one, the cancel needs the admin scope).
type CancelRequest struct {
	Bucket  string        `json:"bucket,omitempty"`
	Buckets []string      `json:"buckets,omitempty"`
	N       *int64        `json:"n,omitempty"`
	Booking *wire.Booking `json:"booking"`
}

// DrainRequest is the body of POST /v1/drain: pause for PauseMS, or
// until Until (RFC 3339), whichever is given: the buckets grant nothing
// until then, and then refill from empty.
type DrainRequest struct {
	Bucket  string     `json:"bucket,omitempty"`
	Buckets []string   `json:"buckets,omitempty"`
	PauseMS *float64   `json:"pause_ms,omitempty"`
	Until   *time.Time `json:"until,omitempty"`
}

// Decision is the response of /v1/take and /v1/wait. Durations are
// milliseconds, with microsecond precision, rounded up.
type Decision struct {
	Allowed      bool       `json:"allowed"`
	N            int64      `json:"n"`
	Remaining    int64      `json:"remaining"`
	WaitMS       float64    `json:"wait_ms"`
	RetryAfterMS float64    `json:"retry_after_ms"`
	ResetAfterMS float64    `json:"reset_after_ms"`
	MaxWaitMS    *float64   `json:"max_wait_ms,omitempty"`
	Bucket       string     `json:"bucket"`
	Limit        wire.Limit `json:"limit"`
	// AtUnixMicro is the store's clock at the decision: what a refund of
	// the grant gives as its at_unix_micro.
	AtUnixMicro int64 `json:"at_unix_micro"`
	// Booking, for a booking of /v1/wait, is what /v1/cancel needs to
	// give it back, with its grant.
	Booking *wire.Booking `json:"booking,omitempty"`
	// Grant, for a grant of n > 0 tokens, is what /v1/refund presents to
	// give them back: signed by the service, for this caller's token, once.
	Grant string `json:"grant,omitempty"`
	// SettleGrant, for a grant of tokens, is what /v1/settle presents to
	// adjust it to its real cost: the grant's other form (either spends
	// both).
	SettleGrant string `json:"settle_grant,omitempty"`
	// Costs, for a take of costs by bucket, are its costs in the order of
	// Buckets (what /v1/settle names).
	Costs   []int64  `json:"costs,omitempty"`
	Buckets []string `json:"buckets,omitempty"`
	// InFlight, when a bucket bounds in-flight takes, is where the
	// tightest one stands; Permit, for a granted /v1/acquire, is what
	// /v1/renew and /v1/release present.
	InFlight *InFlightView `json:"in_flight,omitempty"`
	Permit   *PermitView   `json:"permit,omitempty"`
	// Quotas, when buckets of the take have calendar quotas, are where
	// each stands after the decision; QuotaDenied is set when one of them
	// refused the take (retry_after_ms is then the time until its window
	// ends).
	Quotas      []QuotaView `json:"quotas,omitempty"`
	QuotaDenied bool        `json:"quota_denied,omitempty"`
	// retryAfter is RetryAfter unrounded, for the Retry-After header.
	retryAfter time.Duration
}

// setHeaders sets Retry-After on a refusal.
func (d Decision) setHeaders(h http.Header) {
	if !d.Allowed {
		h.Set(headers.RetryAfter, headers.FormatRetryAfter(d.retryAfter))
	}
}

// Done is the response of /v1/refund, /v1/drain and /v1/reset.
type Done struct {
	OK      bool     `json:"ok"`
	PauseMS *float64 `json:"pause_ms,omitempty"`
}

func millis(d time.Duration) float64 {
	us := (d + time.Microsecond - 1) / time.Microsecond
	return float64(us) / 1000
}

// fromMillis converts a client's millisecond count, naming field.
func fromMillis(field string, ms float64, limit time.Duration) (time.Duration, error) {
	if math.IsNaN(ms) || ms < 0 || ms > float64(limit/time.Millisecond) {
		return 0, badRequest(wire.CodeInvalid, "%s: must be between 0 and %d, got %v", field, limit/time.Millisecond, ms)
	}
	return time.Duration(ms * float64(time.Millisecond)), nil
}

// configView is the JSON of GET /v1/config.
type configView struct {
	Path    string       `json:"path"`
	SHA256  string       `json:"sha256"`
	Domains []domainView `json:"domains"`
	Buckets []bucketView `json:"buckets"`
}

type domainView struct {
	Name  string     `json:"name"`
	Rules []ruleView `json:"rules"`
}

type ruleView struct {
	ID         string   `json:"id"`
	Limits     []string `json:"limits,omitempty"`
	Quotas     []string `json:"quotas,omitempty"`
	Unlimited  bool     `json:"unlimited,omitempty"`
	ShadowMode bool     `json:"shadow_mode,omitempty"`
	Line       int      `json:"line"`
}

type bucketView struct {
	Name     string   `json:"name"`
	Key      string   `json:"key"`
	Limits   []string `json:"limits"`
	Quotas   []string `json:"quotas,omitempty"`
	InFlight int64    `json:"in_flight,omitempty"`
	Line     int      `json:"line"`
}

// quotaSpecs describes quotas as "10000/month Europe/Paris".
func quotaSpecs(qs []fleetrate.Quota) []string {
	var out []string
	for _, q := range qs {
		out = append(out, q.String())
	}
	return out
}

func specs(ls []config.LimitSpec) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.String()
	}
	return out
}

func (s *Server) handleConfig(w http.ResponseWriter, r *http.Request) error {
	cfg := s.Config()
	v := configView{Path: cfg.Path, SHA256: hex.EncodeToString(cfg.Hash[:]), Domains: []domainView{}, Buckets: []bucketView{}}
	names, _, _ := cfg.Summary()
	for _, name := range names {
		dv := domainView{Name: name, Rules: []ruleView{}}
		cfg.Domains[name].Walk(func(r *config.Rule) {
			dv.Rules = append(dv.Rules, ruleView{ID: r.ID, Limits: specs(r.Limits), Quotas: quotaSpecs(r.Quotas), Unlimited: r.Unlimited, ShadowMode: r.ShadowMode, Line: r.Line})
		})
		slices.SortFunc(dv.Rules, func(a, b ruleView) int { return strings.Compare(a.ID, b.ID) })
		v.Domains = append(v.Domains, dv)
	}
	for _, b := range cfg.Buckets {
		v.Buckets = append(v.Buckets, bucketView{Name: b.Name, Key: s.opts.Prefix + b.Key, Limits: specs(b.Limits), Quotas: quotaSpecs(b.Quotas), InFlight: b.InFlight, Line: b.Line})
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}
