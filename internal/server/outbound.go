package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/server/wire"
	"github.com/fleetrate/fleetrate/transport"
)

// The outbound API: the transport's protocol for workers in any language.
// A worker books each send of a request to an upstream of the upstreams
// section (POST /v1/outbound/book: the service waits for its turn, as a Go
// worker's transport.Transport does, on the same code), sends it itself,
// and reports the answer (POST /v1/outbound/report): a 429 pauses the
// fleet, the rate adapts, rate-limit fields steer it, and the answer says
// whether and when to send again. Go and non-Go workers of one fleet share
// the store's buckets, pauses and rates.

// Codes of the outbound API's errors, beside the service's own.
const (
	CodeBackpressure   = "backpressure"
	CodeNoRoute        = "no_route"
	CodeUnknownChannel = "unknown_channel"
	CodeUnknownTicket  = "unknown_ticket"
)

// outboundBookPath is the path of the outbound API's booking.
const outboundBookPath = "/v1/outbound/book"

// DefaultReportWithin is how long a booked ticket waits for its report:
// past it, the ticket is abandoned and its in-flight permit lapses at the
// end of its lease.
const DefaultReportWithin = time.Minute

// Limits of the outbound API's fields.
const (
	maxMethodLen  = 32
	maxPathLen    = 8 << 10
	maxHeaderVals = 256
)

// outUpstream is one upstream's transport, over the service's store.
type outUpstream struct {
	cfg config.Upstream
	tr  *transport.Transport
}

// outboundFor builds the transports of cfg's upstreams, keeping those of
// old whose configuration did not change (they keep what they learned:
// rates, pauses, their subscription), and closing the others once their
// tickets can no longer be reported.
//
// An upstream whose transport cannot be built (the configuration checks
// every field first, so this is not expected) is logged and left out.
func (s *Server) outboundFor(cfg *config.Config, old *state) map[string]*outUpstream {
	out := make(map[string]*outUpstream, len(cfg.Upstreams))
	for _, u := range cfg.Upstreams {
		if o := old.upstream(u.Channel); o != nil && sameUpstream(o.cfg, u) {
			out[u.Channel] = o
			continue
		}
		o, err := s.newOutUpstream(u)
		if err != nil {
			s.log.Error("outbound_upstream_error", "channel", u.Channel, "error", err)
			continue
		}
		out[u.Channel] = o
	}
	if old != nil {
		for ch, o := range old.outbound {
			if out[ch] != o {
				time.AfterFunc(s.reportWithin(), func() { _ = o.tr.Close() })
			}
		}
	}
	return out
}

// upstream returns the named upstream of st, or nil.
func (st *state) upstream(channel string) *outUpstream {
	if st == nil {
		return nil
	}
	return st.outbound[channel]
}

// sameUpstream reports whether two entries configure the same upstream.
func sameUpstream(a, b config.Upstream) bool {
	a.File, a.Line, b.File, b.Line = "", 0, "", 0
	return reflect.DeepEqual(a, b)
}

// newOutUpstream builds the transport of u over the service's store.
func (s *Server) newOutUpstream(u config.Upstream) (*outUpstream, error) {
	lim, err := fleetrate.New(s.store, fleetrate.Config{Prefix: s.opts.Prefix, Buckets: u.Buckets(), MaxWait: s.opts.MaxWait})
	if err != nil {
		return nil, fmt.Errorf("upstream %q: %w", u.Channel, err)
	}
	classify, err := u.Classifier()
	if err != nil {
		return nil, err
	}
	tr, err := transport.New(lim, classify, transport.Options{
		// The worker sends: the base transport is never used.
		Base:        noSend{},
		MaxWait:     min(s.opts.MaxWait, 10*time.Minute),
		MaxAttempts: u.MaxAttempts,
		Logger:      s.log,
		Registerer:  s.opts.Registry,
	})
	if err != nil {
		return nil, fmt.Errorf("upstream %q: %w", u.Channel, err)
	}
	return &outUpstream{cfg: u, tr: tr}, nil
}

// noSend is the base transport of the outbound API's transports, which
// book and observe but never send.
type noSend struct{}

func (noSend) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("server: the outbound API's transport sends nothing")
}

// reportWithin is how long a ticket waits for its report.
func (s *Server) reportWithin() time.Duration {
	if s.opts.ReportWithin > 0 {
		return s.opts.ReportWithin
	}
	return DefaultReportWithin
}

// ticket is a booked send waiting for its report.
type ticket struct {
	a      *transport.Attempt
	caller string // the token's identity that booked it
	timer  *time.Timer
}

// tickets are the booked sends not yet reported, by ticket id.
type tickets struct {
	mu sync.Mutex
	m  map[string]*ticket
}

// add files a booked attempt under a new random id for caller, abandoned
// after within unless taken before.
func (ts *tickets) add(a *transport.Attempt, caller string, within time.Duration) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	tk := &ticket{a: a, caller: caller}
	ts.mu.Lock()
	if ts.m == nil {
		ts.m = map[string]*ticket{}
	}
	ts.m[id] = tk
	tk.timer = time.AfterFunc(within, func() {
		if tk := ts.take(id, caller); tk != nil {
			tk.a.Abandon()
		}
	})
	ts.mu.Unlock()
	return id
}

// take removes and returns caller's ticket id, or nil.
func (ts *tickets) take(id, caller string) *ticket {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	tk := ts.m[id]
	if tk == nil || tk.caller != caller {
		return nil
	}
	delete(ts.m, id)
	tk.timer.Stop()
	return tk
}

// abandonAll abandons every ticket, at shutdown.
func (ts *tickets) abandonAll() {
	ts.mu.Lock()
	m := ts.m
	ts.m = nil
	ts.mu.Unlock()
	for _, tk := range m {
		tk.timer.Stop()
		tk.a.Abandon()
	}
}

// BookRequest is the body of POST /v1/outbound/book: a send of a request
// to an upstream of the upstreams section. See docs/API.md.
type BookRequest struct {
	Channel string `json:"channel"`
	Method  string `json:"method"`
	Path    string `json:"path"`
	Host    string `json:"host,omitempty"`
	// Attempt is which send of the request this is, 1 (the default) for
	// the first; a retry books attempt Report said.
	Attempt   *int             `json:"attempt,omitempty"`
	MaxWaitMS *float64         `json:"max_wait_ms,omitempty"`
	Priority  string           `json:"priority,omitempty"`
	Entity    string           `json:"entity,omitempty"`
	Costs     map[string]int64 `json:"costs,omitempty"`
}

// BookAnswer is the answer of POST /v1/outbound/book: send the request
// now, then report its answer with the ticket within ReportWithinMS.
type BookAnswer struct {
	Ticket         string  `json:"ticket"`
	Endpoint       string  `json:"endpoint"`
	WaitedMS       float64 `json:"waited_ms"`
	ReportWithinMS float64 `json:"report_within_ms"`
}

// ReportRequest is the body of POST /v1/outbound/report: what the
// upstream answered a booked send.
type ReportRequest struct {
	Ticket  string                     `json:"ticket"`
	Status  int                        `json:"status,omitempty"`
	Headers map[string]json.RawMessage `json:"headers,omitempty"`
	Error   string                     `json:"error,omitempty"`
	Sent    *bool                      `json:"sent,omitempty"`
	Costs   map[string]int64           `json:"costs,omitempty"`
	// SentAfterMS and RTTMS are the worker's own timing: how long after
	// it received the booking (plus the time the booking took to reach
	// it) the request went out, and how long the upstream took to answer
	// it (transport.Answer.SentAfter and RTT).
	SentAfterMS *float64 `json:"sent_after_ms,omitempty"`
	RTTMS       *float64 `json:"rtt_ms,omitempty"`
}

// ReportAnswer is the answer of POST /v1/outbound/report: whether to send
// the request again (Retry, after RetryInMS, booking Attempt), or that
// the request gave up (GaveUp, with Error, Attempts, Status and the
// upstream's RetryAfterMS).
type ReportAnswer struct {
	Retry        bool    `json:"retry"`
	RetryInMS    float64 `json:"retry_in_ms,omitempty"`
	Attempt      int     `json:"attempt,omitempty"`
	GaveUp       bool    `json:"gave_up,omitempty"`
	Error        string  `json:"error,omitempty"`
	Attempts     int     `json:"attempts,omitempty"`
	Status       int     `json:"status,omitempty"`
	RetryAfterMS float64 `json:"retry_after_ms,omitempty"`
}

// backpressure is the outbound API's 429: the wait would exceed the max
// wait; nothing was booked.
type backpressure struct {
	Error        string  `json:"error"`
	Code         string  `json:"code"`
	RetryAfterMS float64 `json:"retry_after_ms"`
	MaxWaitMS    float64 `json:"max_wait_ms"`
}

// mountOutbound adds the outbound API.
func (s *Server) mountOutbound(mux *http.ServeMux) {
	mux.HandleFunc(outboundBookPath, s.api(http.MethodPost, ScopeDecide, s.book))
	mux.HandleFunc("/v1/outbound/report", s.api(http.MethodPost, ScopeDecide, s.report))
}

// book serves POST /v1/outbound/book.
func (s *Server) book(w http.ResponseWriter, r *http.Request) error {
	var req BookRequest
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	o := s.state.Load().upstream(req.Channel)
	if req.Channel == "" {
		return badRequest(wire.CodeInvalid, "channel: required")
	}
	if o == nil {
		return &httpError{status: http.StatusNotFound, code: CodeUnknownChannel, msg: fmt.Sprintf("channel: no upstream %q in the upstreams section", req.Channel)}
	}
	out, attempt, maxWait, err := s.bookRequest(r.Context(), &req)
	if err != nil {
		return err
	}
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(maxWait + s.opts.WriteTimeout))
	a, err := o.tr.Book(out.WithContext(transport.WithMaxWait(out.Context(), maxWait)), attempt)
	var bp *bookBackpressure
	switch err = bookFailure(s, err, maxWait); {
	case errors.As(err, &bp):
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(bp.retryAfter.Seconds())), 10))
		writeJSON(w, http.StatusTooManyRequests, backpressure{Error: bp.msg, Code: CodeBackpressure, RetryAfterMS: millis(bp.retryAfter), MaxWaitMS: millis(maxWait)})
		return nil
	case err != nil:
		return err
	}
	within := s.reportWithin()
	id := s.tickets.add(a, callerOf(r.Context()).id, within)
	writeJSON(w, http.StatusOK, BookAnswer{Ticket: id, Endpoint: a.Endpoint(), WaitedMS: millis(a.Waited()), ReportWithinMS: millis(within)})
	return nil
}

// bookRequest checks req and returns the request to book, its attempt
// and its max wait.
func (s *Server) bookRequest(ctx context.Context, req *BookRequest) (*http.Request, int, time.Duration, error) {
	switch {
	case req.Method == "" || len(req.Method) > maxMethodLen || strings.ContainsFunc(req.Method, func(r rune) bool { return r <= ' ' || r > '~' }):
		return nil, 0, 0, badRequest(wire.CodeInvalid, "method: want an HTTP method such as GET or POST, got %q", req.Method)
	case !strings.HasPrefix(req.Path, "/") || len(req.Path) > maxPathLen:
		return nil, 0, 0, badRequest(wire.CodeInvalid, "path: want a path starting with / of at most %d bytes, got %q", maxPathLen, truncate(req.Path))
	case strings.ContainsAny(req.Host, "/?#@ ") || len(req.Host) > 255:
		return nil, 0, 0, badRequest(wire.CodeInvalid, "host: want a host name, got %q", truncate(req.Host))
	}
	attempt := 1
	if req.Attempt != nil {
		attempt = *req.Attempt
		if attempt < 1 || attempt > config.MaxUpstreamAttempts {
			return nil, 0, 0, badRequest(wire.CodeInvalid, "attempt: must be between 1 and %d, got %d", config.MaxUpstreamAttempts, attempt)
		}
	}
	maxWait := s.opts.MaxWait
	if req.MaxWaitMS != nil {
		ms := *req.MaxWaitMS
		if math.IsNaN(ms) || ms < 0 || ms > float64(maxWait/time.Millisecond) {
			return nil, 0, 0, badRequest(wire.CodeInvalid, "max_wait_ms: must be between 0 and the server's max wait %v, got %v", maxWait, ms)
		}
		maxWait = time.Duration(ms * float64(time.Millisecond))
	}
	for name, n := range req.Costs {
		if n < 0 || n > fleetrate.MaxBurst {
			return nil, 0, 0, badRequest(wire.CodeInvalid, "costs.%s: must be between 0 and %d, got %d", name, int64(fleetrate.MaxBurst), n)
		}
	}
	host := req.Host
	if host == "" {
		host = "upstream.invalid"
	}
	u, err := url.Parse("http://" + host + req.Path)
	if err != nil {
		return nil, 0, 0, badRequest(wire.CodeInvalid, "path: %v", err)
	}
	if req.Priority != "" {
		ctx = fleetrate.WithPriority(ctx, req.Priority)
	}
	if req.Entity != "" {
		ctx = transport.WithEntity(ctx, req.Entity)
	}
	if req.Costs != nil {
		ctx = transport.WithCosts(ctx, req.Costs)
	}
	out := (&http.Request{Method: req.Method, URL: u, Host: req.Host, Header: http.Header{}, Body: http.NoBody}).WithContext(ctx)
	return out, attempt, maxWait, nil
}

// bookFailure maps a failed booking to its answer: backpressure is a 429
// that says when to try again, a bad request a 400 naming what is wrong,
// and anything else the store failing (503), never a denial.
func bookFailure(s *Server, err error, maxWait time.Duration) error {
	var bp *fleetrate.BackpressureError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &bp):
		return &bookBackpressure{msg: err.Error(), retryAfter: bp.RetryAfter, maxWait: maxWait}
	case errors.Is(err, context.DeadlineExceeded):
		return &bookBackpressure{msg: fmt.Sprintf("the request's turn did not come within the max wait %v", maxWait), maxWait: maxWait}
	case errors.Is(err, transport.ErrNoRoute):
		return badRequest(CodeNoRoute, "%v", err)
	case errors.Is(err, context.Canceled):
		return &httpError{status: 499, code: "canceled", msg: "the caller went away while waiting"}
	}
	return s.failure(err)
}

// bookBackpressure is a booking refused because its wait would exceed
// the max wait.
type bookBackpressure struct {
	msg                 string
	retryAfter, maxWait time.Duration
}

func (e *bookBackpressure) Error() string { return e.msg }

// report serves POST /v1/outbound/report.
func (s *Server) report(w http.ResponseWriter, r *http.Request) error {
	var req ReportRequest
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	ans, err := reportAnswer(&req)
	if err != nil {
		return err
	}
	tk := s.tickets.take(req.Ticket, callerOf(r.Context()).id)
	if tk == nil {
		return &httpError{status: http.StatusNotFound, code: CodeUnknownTicket,
			msg: "ticket: unknown: never booked, already reported, or not reported within its time"}
	}
	next, err := tk.a.Report(ans)
	var g *transport.GaveUpError
	switch {
	case errors.As(err, &g):
		writeJSON(w, http.StatusOK, ReportAnswer{GaveUp: true, Error: g.Error(), Attempts: g.Attempts, Status: g.StatusCode, RetryAfterMS: millis(g.RetryAfter)})
		return nil
	case err != nil:
		return s.failure(err)
	}
	writeJSON(w, http.StatusOK, ReportAnswer{Retry: next.Retry, RetryInMS: millis(next.After), Attempt: next.Attempt})
	return nil
}

// reportAnswer checks req and returns the answer it reports.
func reportAnswer(req *ReportRequest) (transport.Answer, error) {
	var ans transport.Answer
	switch {
	case req.Ticket == "":
		return ans, badRequest(wire.CodeInvalid, "ticket: required")
	case req.Error == "" && (req.Status < 100 || req.Status > 599):
		return ans, badRequest(wire.CodeInvalid, "status: want the upstream's HTTP status (100 to 599), or error when there was no answer, got %d", req.Status)
	case req.Error != "" && req.Status != 0:
		return ans, badRequest(wire.CodeInvalid, "error: give error (no answer) or status (an answer), not both")
	case len(req.Headers) > maxHeaderVals:
		return ans, badRequest(wire.CodeInvalid, "headers: at most %d, got %d", maxHeaderVals, len(req.Headers))
	}
	for name, n := range req.Costs {
		if n < 0 || n > fleetrate.MaxBurst {
			return ans, badRequest(wire.CodeInvalid, "costs.%s: must be between 0 and %d, got %d", name, int64(fleetrate.MaxBurst), n)
		}
	}
	for _, f := range []struct {
		name string
		ms   *float64
		to   *time.Duration
	}{{"sent_after_ms", req.SentAfterMS, &ans.SentAfter}, {"rtt_ms", req.RTTMS, &ans.RTT}} {
		if f.ms == nil {
			continue
		}
		// NaN fails both comparisons.
		if !(*f.ms >= 0 && *f.ms <= maxTimingMS) {
			return ans, badRequest(wire.CodeInvalid, "%s: must be between 0 and %d (ms), got %v", f.name, maxTimingMS, *f.ms)
		}
		*f.to = time.Duration(*f.ms * float64(time.Millisecond))
	}
	if req.Error != "" {
		ans.Err = errors.New(truncate(req.Error))
		ans.Sent = req.Sent == nil || *req.Sent
		return ans, nil
	}
	h := make(http.Header, len(req.Headers))
	for name, raw := range req.Headers {
		var one string
		var many []string
		switch {
		case json.Unmarshal(raw, &one) == nil:
			h.Add(name, one)
		case json.Unmarshal(raw, &many) == nil:
			for _, v := range many {
				h.Add(name, v)
			}
		default:
			return ans, badRequest(wire.CodeInvalid, "headers.%s: want a string or a list of strings", truncate(name))
		}
	}
	ans.Response = &http.Response{StatusCode: req.Status, Status: strconv.Itoa(req.Status), Header: h, Body: http.NoBody}
	ans.Sent, ans.Costs = true, req.Costs
	return ans, nil
}

// maxTimingMS bounds a report's sent_after_ms and rtt_ms: a ticket is
// reported within ReportWithin (a minute), so neither can be longer.
const maxTimingMS = 3_600_000

// truncate shortens a caller's value for an error message.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
