package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

const outboundConfig = `
upstreams:
  - channel: ota
    max_attempts: 2
    endpoints:
      - name: availability
        pattern: "POST /v1/hotels/{id}/availability"
        rate_limit: {unit: second, requests_per_unit: 10, burst: 1}
      - name: reservations
        pattern: "GET /v1/reservations"
        rate_limit: {unit: second, requests_per_unit: 100}
        in_flight: 1
`

type booked struct {
	Ticket         string  `json:"ticket"`
	Endpoint       string  `json:"endpoint"`
	WaitedMS       float64 `json:"waited_ms"`
	ReportWithinMS float64 `json:"report_within_ms"`
	Error          string  `json:"error"`
	Code           string  `json:"code"`
	RetryAfterMS   float64 `json:"retry_after_ms"`
}

type reportAns struct {
	Retry        bool    `json:"retry"`
	RetryInMS    float64 `json:"retry_in_ms"`
	Attempt      int     `json:"attempt"`
	GaveUp       bool    `json:"gave_up"`
	Attempts     int     `json:"attempts"`
	Status       int     `json:"status"`
	RetryAfterMS float64 `json:"retry_after_ms"`
	Error        string  `json:"error"`
	Code         string  `json:"code"`
}

// startOutbound runs a server of outboundConfig over a memory store on
// the real clock (the transport paces on it), returned for Go workers.
func startOutbound(t *testing.T, opts ...testOpt) (*testServer, fleetrate.Store) {
	t.Helper()
	store := memstore.New(memstore.Options{})
	opts = append([]testOpt{func(o *Options) { o.Store, o.Clock = store, nil }}, opts...)
	return start(t, outboundConfig, opts...), store
}

func (ts *testServer) book(t *testing.T, body string) (booked, int) {
	t.Helper()
	var b booked
	code := ts.post(t, "/v1/outbound/book", body, &b)
	return b, code
}

func (ts *testServer) report(t *testing.T, body string) (reportAns, int) {
	t.Helper()
	var r reportAns
	code := ts.post(t, "/v1/outbound/report", body, &r)
	return r, code
}

// TestOutboundBookAndReport: a booking waits its turn on the endpoint's
// bucket, a report of 200 ends it, and a ticket is reportAns once.
func TestOutboundBookAndReport(t *testing.T) {
	t.Parallel()
	ts, _ := startOutbound(t)
	req := `{"channel":"ota","method":"POST","path":"/v1/hotels/7/availability"}`
	first, code := ts.book(t, req)
	if code != http.StatusOK || first.Ticket == "" || first.Endpoint != "availability" || first.ReportWithinMS != 60000 {
		t.Fatalf("book: %d %+v", code, first)
	}
	second, code := ts.book(t, req)
	// 10/s, burst 1: the second waits about 100 ms (less what the first
	// call took on a loaded machine).
	if code != http.StatusOK || second.WaitedMS < 50 {
		t.Fatalf("second book: %d %+v, want a wait of about 100 ms", code, second)
	}
	for _, tk := range []string{first.Ticket, second.Ticket} {
		if r, code := ts.report(t, `{"ticket":"`+tk+`","status":200}`); code != http.StatusOK || r.Retry || r.GaveUp {
			t.Fatalf("report 200: %d %+v, want done", code, r)
		}
	}
	if r, code := ts.report(t, `{"ticket":"`+first.Ticket+`","status":200}`); code != http.StatusNotFound || r.Code != CodeUnknownTicket {
		t.Fatalf("second report: %d %+v, want 404 %s", code, r, CodeUnknownTicket)
	}
}

// TestOutboundPauseReachesGoWorkers: a 429 a worker of another language
// reports pauses the Go workers of the fleet too (the same buckets, the
// same transport code): a Go transport's request reaches the upstream
// only after the Retry-After. The retry is attempt 2, and attempt 2 still
// limited gives up (max_attempts 2).
func TestOutboundPauseReachesGoWorkers(t *testing.T) {
	t.Parallel()
	ts, store := startOutbound(t)
	var mu sync.Mutex
	var arrived time.Time
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrived = time.Now()
		mu.Unlock()
	}))
	defer up.Close()
	goWorker := goTransport(t, store, ts.Config())

	b, _ := ts.book(t, `{"channel":"ota","method":"POST","path":"/v1/hotels/7/availability"}`)
	limited := time.Now()
	r, code := ts.report(t, `{"ticket":"`+b.Ticket+`","status":429,"headers":{"Retry-After":"1"}}`)
	if code != http.StatusOK || !r.Retry || r.Attempt != 2 || r.RetryInMS < 1000 {
		t.Fatalf("report 429: %d %+v, want a retry as attempt 2 after at least 1000 ms", code, r)
	}
	req, _ := http.NewRequest(http.MethodPost, up.URL+"/v1/hotels/8/availability", nil)
	resp, err := goWorker.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	if d := arrived.Sub(limited); d < time.Second {
		t.Errorf("the Go worker's request reached the upstream %v after the reportAns 429, want after the 1 s pause", d)
	}
	mu.Unlock()

	b, _ = ts.book(t, `{"channel":"ota","method":"POST","path":"/v1/hotels/7/availability","attempt":2}`)
	r, code = ts.report(t, `{"ticket":"`+b.Ticket+`","status":429,"headers":{"retry-after":["1"]}}`)
	if code != http.StatusOK || r.Retry || !r.GaveUp || r.Attempts != 2 || r.Status != 429 || r.RetryAfterMS != 1000 {
		t.Fatalf("report 429 at the last attempt: %d %+v, want gave_up after 2 attempts", code, r)
	}
}

// TestGoPauseReachesOutboundWorkers is the other direction: a 429 a Go
// worker's transport draws pauses the workers that book through the
// service (a Python worker's PacedTransport, any language's client): a
// booking made during the pause is granted only after the Retry-After,
// counted from the upstream's answer.
func TestGoPauseReachesOutboundWorkers(t *testing.T) {
	t.Parallel()
	ts, store := startOutbound(t)
	limited := make(chan time.Time, 1)
	var mu sync.Mutex
	calls := 0
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		if first {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			limited <- time.Now()
		}
	}))
	defer up.Close()
	goWorker := goTransport(t, store, ts.Config())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, up.URL+"/v1/hotels/8/availability", nil)
		resp, err := goWorker.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	at := <-limited
	// Bookings made before the transport holds the buckets (one memory
	// store call after the 429 reached it) are granted at the endpoint's
	// 10/s; once it has, a booking waits for the rest of the pause. So
	// book until one waits: every booking granted without waiting must
	// come well within the pause's first half, and the one that waited
	// after the whole Retry-After.
	for {
		b, code := ts.book(t, `{"channel":"ota","method":"POST","path":"/v1/hotels/9/availability"}`)
		if code != http.StatusOK {
			t.Fatalf("book during the pause: %d %+v", code, b)
		}
		granted := time.Now()
		if r, code := ts.report(t, `{"ticket":"`+b.Ticket+`","status":200}`); code != http.StatusOK || r.Retry {
			t.Fatalf("report 200: %d %+v", code, r)
		}
		if b.WaitedMS >= 500 {
			if d := granted.Sub(at); d < time.Second {
				t.Errorf("a booking during the Go worker's pause was granted %v after the 429, want after its 1 s Retry-After", d)
			}
			break
		}
		if d := granted.Sub(at); d >= 500*time.Millisecond {
			t.Fatalf("a booking was granted %v into the Go worker's 1 s pause without waiting for it", d)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("the Go worker's retry: %v", err)
	}
}

// goTransport is a Go worker's transport for the upstream of cfg over
// store, as a Go process of the fleet builds it.
func goTransport(t *testing.T, store fleetrate.Store, cfg *config.Config) *transport.Transport {
	t.Helper()
	u := cfg.Upstreams[0].Upstream
	lim, err := fleetrate.New(store, fleetrate.Config{Buckets: u.Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	classify, err := u.Classifier()
	if err != nil {
		t.Fatal(err)
	}
	tr, err := transport.New(lim, classify, transport.Options{Logger: quietLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestOutboundInFlight: a booking holds its endpoint's permit until its
// report; another booking meanwhile waits, and one that cannot wait gets
// backpressure (429 with Retry-After). A failure before the send gives
// the permit back at once.
func TestOutboundInFlight(t *testing.T) {
	t.Parallel()
	ts, _ := startOutbound(t)
	req := `{"channel":"ota","method":"GET","path":"/v1/reservations"%s}`
	held, code := ts.book(t, strings.Replace(req, "%s", "", 1))
	if code != http.StatusOK {
		t.Fatalf("book: %d %+v", code, held)
	}
	bp, code := ts.book(t, strings.Replace(req, "%s", `,"max_wait_ms":0`, 1))
	if code != http.StatusTooManyRequests || bp.Code != CodeBackpressure {
		t.Fatalf("book while the permit is held, no wait: %d %+v, want 429 %s", code, bp, CodeBackpressure)
	}
	done := make(chan booked)
	go func() {
		b, _ := ts.book(t, strings.Replace(req, "%s", "", 1))
		done <- b
	}()
	if r, code := ts.report(t, `{"ticket":"`+held.Ticket+`","error":"connection refused","sent":false}`); code != http.StatusOK || r.Retry {
		t.Fatalf("report of a failure before the send: %d %+v", code, r)
	}
	select {
	case b := <-done:
		if b.Ticket == "" {
			t.Fatalf("the waiting booking: %+v", b)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting booking was not granted when the permit came back")
	}
}

// TestOutboundBadInput: every refusal names what is wrong.
func TestOutboundBadInput(t *testing.T) {
	t.Parallel()
	ts, _ := startOutbound(t)
	for _, tc := range []struct {
		path, body string
		status     int
		code, want string
	}{
		{"book", `{"method":"GET","path":"/v1/reservations"}`, 400, "invalid", "channel: required"},
		{"book", `{"channel":"nope","method":"GET","path":"/v1/reservations"}`, 404, CodeUnknownChannel, `"nope"`},
		{"book", `{"channel":"ota","method":"G T","path":"/v1/reservations"}`, 400, "invalid", "method:"},
		{"book", `{"channel":"ota","method":"GET","path":"v1/reservations"}`, 400, "invalid", "path:"},
		{"book", `{"channel":"ota","method":"GET","path":"/v1/reservations","attempt":0}`, 400, "invalid", "attempt: must be between 1"},
		{"book", `{"channel":"ota","method":"GET","path":"/v1/reservations","max_wait_ms":-1}`, 400, "invalid", "max_wait_ms:"},
		{"book", `{"channel":"ota","method":"GET","path":"/v1/other"}`, 400, CodeNoRoute, "/v1/other"},
		{"book", `{"channel":"ota","method":"GET","path":"/v1/reservations","costs":{"tokens":-1}}`, 400, "invalid", "costs.tokens"},
		{"book", `{"channel":"ota","method":"GET","path":"/v1/reservations","costs":{"tokens":5}}`, 400, "invalid", "tokens"},
		{"book", `{"channel":"ota","method":"GET","path":"/v1/reservations","priority":"bulk"}`, 400, "invalid", "bulk"},
		{"book", `{"channel":"ota","verb":"GET"}`, 400, "invalid_json", "verb"},
		{"report", `{"status":200}`, 400, "invalid", "ticket: required"},
		{"report", `{"ticket":"x","status":42}`, 400, "invalid", "status:"},
		{"report", `{"ticket":"x","status":200,"error":"boom"}`, 400, "invalid", "not both"},
		{"report", `{"ticket":"x","status":200,"headers":{"Retry-After":5}}`, 400, "invalid", "headers.Retry-After"},
		{"report", `{"ticket":"x","status":200,"sent_after_ms":-1}`, 400, "invalid", "sent_after_ms: must be between 0"},
		{"report", `{"ticket":"x","status":200,"rtt_ms":3600001}`, 400, "invalid", "rtt_ms: must be between 0"},
		{"report", `{"ticket":"x","status":200,"rtt_ms":"5"}`, 400, "invalid_json", "rtt_ms"},
		{"report", `{"ticket":"x","status":200}`, 404, CodeUnknownTicket, "ticket"},
	} {
		var r reportAns
		code := ts.post(t, "/v1/outbound/"+tc.path, tc.body, &r)
		if code != tc.status || r.Code != tc.code || !strings.Contains(r.Error, tc.want) {
			t.Errorf("%s %s: %d %s %q, want %d %s with %q", tc.path, tc.body, code, r.Code, r.Error, tc.status, tc.code, tc.want)
		}
	}
}

// TestOutboundTicketExpires: a ticket not reportAns within its time is
// abandoned: its permit lapses at its lease's end, and a late report is
// told the ticket is unknown.
func TestOutboundTicketExpires(t *testing.T) {
	t.Parallel()
	ts, _ := startOutbound(t, func(o *Options) { o.ReportWithin = 50 * time.Millisecond })
	b, code := ts.book(t, `{"channel":"ota","method":"GET","path":"/v1/reservations"}`)
	if code != http.StatusOK || b.ReportWithinMS != 50 {
		t.Fatalf("book: %d %+v", code, b)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		ts.tickets.mu.Lock()
		_, open := ts.tickets.m[b.Ticket]
		ts.tickets.mu.Unlock()
		if !open {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling for the timer, not a timing assumption
	}
	if r, code := ts.report(t, `{"ticket":"`+b.Ticket+`","status":200}`); code != http.StatusNotFound || r.Code != CodeUnknownTicket {
		t.Fatalf("report after the ticket's time: %d %+v, want 404 %s", code, r, CodeUnknownTicket)
	}
}
