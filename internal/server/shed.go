package server

// This file bounds the decisions in flight: beyond the concurrency limit
// (package inflight: it adapts to the decisions' latency, under the hard
// cap Options.MaxInFlight), an RLS call is answered RESOURCE_EXHAUSTED and
// an API request 503 with Retry-After at once, rather than queued, so that
// an overloaded service keeps answering what it admits within Envoy's
// deadline, and its goroutines and memory stay bounded by the limit, not
// by the offered load.

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/concurrency"
)

// DefaultMaxInFlightPerCPU is the default Options.MaxInFlight per CPU
// (runtime.NumCPU): 64 decisions of one descriptor (about 50 µs of CPU
// each, 20,000/s on one CPU) queue for about 3 ms, well within Envoy's
// 20 ms, and leave room for bursts of a large Envoy fleet. Decisions of
// many descriptors need a lower bound: 64 of 32 descriptors queued for
// about 58 ms; the concurrency limit (Options.LatencyTarget) finds it
// (docs/OPERATIONS.md, "Failure policy, breaker and load shedding").
const DefaultMaxInFlightPerCPU = 64

// DefaultLatencyTarget is the default Options.LatencyTarget.
const DefaultLatencyTarget = concurrency.DefaultTarget

// DefaultMaxInFlight is the default Options.MaxInFlight on this machine.
func DefaultMaxInFlight() int64 { return DefaultMaxInFlightPerCPU * int64(runtime.NumCPU()) }

// codeOverloaded is the error code of an API request shed under overload.
const codeOverloaded = "overloaded"

// shedRetryAfter is the Retry-After, in seconds, of a shed HTTP request:
// the smallest the header can say.
const shedRetryAfter = "1"

// shedder bounds the decisions in flight with an concurrency.Limiter: a
// limit that adapts to their latency (Options.LatencyTarget) under the
// hard cap Options.MaxInFlight.
type shedder struct {
	lim  *concurrency.Limiter
	shed *prometheus.CounterVec
}

func newShedder(max int64, target time.Duration, reg prometheus.Registerer) (*shedder, error) {
	lim, err := concurrency.New(concurrency.Options{Max: max, Target: target})
	if err != nil {
		return nil, fmt.Errorf("%w: server: %v", fleetrate.ErrInvalid, err)
	}
	sh := &shedder{lim: lim, shed: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Name:      "shed_total",
		Help:      "Decisions refused at once because the concurrency limit was in flight (gRPC RESOURCE_EXHAUSTED, HTTP 503).",
	}, []string{"api"})}
	capacity := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: metricsNamespace,
		Name:      "max_in_flight",
		Help:      "The hard cap on decisions in flight (--max-in-flight); the concurrency limit never exceeds it.",
	})
	capacity.Set(float64(max))
	limit := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: metricsNamespace,
		Name:      "concurrency_limit",
		Help:      "The current limit on decisions in flight: it falls while decisions take longer than --latency-target and climbs back to --max-in-flight while they do not; beyond it they are shed.",
	}, func() float64 { return float64(lim.Limit()) })
	sh.shed.WithLabelValues("grpc")
	sh.shed.WithLabelValues("http")
	reg.MustRegister(sh.shed, capacity, limit)
	return sh, nil
}

// acquire claims a slot, or reports that the limit is reached; a claimed
// slot is given back with release(admitted, ...).
func (sh *shedder) acquire() (admitted time.Time, ok bool) {
	if !sh.lim.Acquire() {
		return time.Time{}, false
	}
	return time.Now(), true
}

// release gives back a slot claimed at admitted; the latency of a
// decision made (decided) moves the concurrency limit, that of a failure
// does not (concurrency.Limiter.Forget).
func (sh *shedder) release(admitted time.Time, decided bool) {
	if decided {
		sh.lim.Release(admitted, time.Now())
	} else {
		sh.lim.Forget()
	}
}

// shedRLS is the RLS service behind the bound.
type shedRLS struct {
	rlsService
	sh *shedder
}

// ShouldRateLimit implements the Envoy rate limit service, answering
// RESOURCE_EXHAUSTED at once when MaxInFlight calls are in flight.
func (r shedRLS) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	admitted, ok := r.sh.acquire()
	if !ok {
		r.sh.shed.WithLabelValues("grpc").Inc()
		return nil, errShed
	}
	if err := ctx.Err(); err != nil {
		// The caller gave up while the call waited to be read: deciding
		// it would spend, on an answer nobody reads, the CPU the calls
		// still waited for need.
		r.sh.release(admitted, false)
		return nil, status.FromContextError(err).Err()
	}
	resp, err := r.rlsService.ShouldRateLimit(ctx, req)
	r.sh.release(admitted, err == nil)
	return resp, err
}

// tap refuses an RLS call with RESOURCE_EXHAUSTED before gRPC reads and
// decodes its request when every slot is taken: at 10 times the
// decisions a CPU makes, decoding the calls it then refuses took the
// CPU the admitted ones needed (docs/OPERATIONS.md, Overload). The
// slot itself is claimed in ShouldRateLimit, which sheds the calls
// that pass this check in a race.
func (sh *shedder) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if info.FullMethodName == rlsMethod && sh.lim.Full() {
		sh.shed.WithLabelValues("grpc").Inc()
		return ctx, errShed
	}
	return ctx, nil
}

// rlsMethod is the full gRPC name of ShouldRateLimit.
const rlsMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// shedMessage says why a decision was shed.
const shedMessage = "fleetrate: overloaded: the concurrency limit of decisions in flight is reached (fleetrate_concurrency_limit, at most --max-in-flight); try again"

// errShed is a shed RLS call's answer, built once: under overload the
// service sheds many times what it decides, and each shed must cost
// little.
var errShed = status.Error(codes.ResourceExhausted, shedMessage)

// shedHTTP puts the API's requests behind the bound; the probes, metrics
// and pages are always served.
func (s *Server) shedHTTP(next http.Handler) http.Handler {
	sh := s.shed
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !bounded(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		admitted, ok := sh.acquire()
		if !ok {
			sh.shed.WithLabelValues("http").Inc()
			w.Header().Set("Retry-After", shedRetryAfter)
			writeError(w, &httpError{status: http.StatusServiceUnavailable, code: codeOverloaded, msg: shedMessage})
			return
		}
		// A failure (5xx) is not a sample of the concurrency limit.
		sw := &statusWriter{ResponseWriter: w}
		defer func() { sh.release(admitted, sw.code < http.StatusInternalServerError) }()
		next.ServeHTTP(sw, r)
	})
}

// bounded reports whether a request to path is a decision (or another
// store call) that counts towards MaxInFlight.
//
// An outbound booking is not: it waits for its turn, up to the max wait,
// which would read as a slow decision and bring the limit down for every
// caller; the callers waiting bound its number.
func bounded(path string) bool {
	return path == "/json" || strings.HasPrefix(path, "/v1/") && path != outboundBookPath
}
