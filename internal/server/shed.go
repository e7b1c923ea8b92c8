package server

// This file bounds the decisions in flight: beyond Options.MaxInFlight, an
// RLS call is answered RESOURCE_EXHAUSTED and an API request 503 with
// Retry-After at once, rather than queued, so that an overloaded service
// keeps answering what it admits within Envoy's deadline, and its
// goroutines and memory stay bounded by the bound, not by the offered load.

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// DefaultMaxInFlightPerCPU is the default Options.MaxInFlight per CPU
// (runtime.NumCPU): 64 decisions of one descriptor (about 50 µs of CPU
// each, 20,000/s on one CPU) queue for about 3 ms, well within Envoy's
// 20 ms, and leave room for bursts of a large Envoy fleet. Decisions of
// many descriptors need a lower bound: 64 of 32 descriptors queued for
// about 58 ms (docs/OPERATIONS.md, "Failure policy, breaker and load
// shedding").
const DefaultMaxInFlightPerCPU = 64

// DefaultMaxInFlight is the default Options.MaxInFlight on this machine.
func DefaultMaxInFlight() int64 { return DefaultMaxInFlightPerCPU * int64(runtime.NumCPU()) }

// codeOverloaded is the error code of an API request shed under overload.
const codeOverloaded = "overloaded"

// shedRetryAfter is the Retry-After, in seconds, of a shed HTTP request:
// the smallest the header can say.
const shedRetryAfter = "1"

// shedder counts the decisions in flight and refuses those beyond max.
type shedder struct {
	max      int64
	inFlight atomic.Int64
	shed     *prometheus.CounterVec
}

func newShedder(max int64, reg prometheus.Registerer) *shedder {
	sh := &shedder{max: max, shed: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Name:      "shed_total",
		Help:      "Decisions refused at once because MaxInFlight were in flight (gRPC RESOURCE_EXHAUSTED, HTTP 503).",
	}, []string{"api"})}
	limit := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: metricsNamespace,
		Name:      "max_in_flight",
		Help:      "The bound on decisions in flight (--max-in-flight); beyond it they are shed.",
	})
	limit.Set(float64(max))
	sh.shed.WithLabelValues("grpc")
	sh.shed.WithLabelValues("http")
	reg.MustRegister(sh.shed, limit)
	return sh
}

// acquire claims a slot, or reports that every slot is taken.
func (sh *shedder) acquire() bool {
	if sh.inFlight.Add(1) > sh.max {
		sh.inFlight.Add(-1)
		return false
	}
	return true
}

func (sh *shedder) release() { sh.inFlight.Add(-1) }

// shedRLS is the RLS service behind the bound.
type shedRLS struct {
	rlsService
	sh *shedder
}

// ShouldRateLimit implements the Envoy rate limit service, answering
// RESOURCE_EXHAUSTED at once when MaxInFlight calls are in flight.
func (r shedRLS) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	if !r.sh.acquire() {
		r.sh.shed.WithLabelValues("grpc").Inc()
		return nil, status.Error(codes.ResourceExhausted, r.sh.message())
	}
	defer r.sh.release()
	return r.rlsService.ShouldRateLimit(ctx, req)
}

// tap refuses an RLS call with RESOURCE_EXHAUSTED before gRPC reads and
// decodes its request when every slot is taken: at 10 times the
// decisions a CPU makes, decoding the calls it then refuses took the
// CPU the admitted ones needed (docs/OPERATIONS.md, Overload). The
// slot itself is claimed in ShouldRateLimit, which sheds the calls
// that pass this check in a race.
func (sh *shedder) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if info.FullMethodName == rlsMethod && sh.inFlight.Load() >= sh.max {
		sh.shed.WithLabelValues("grpc").Inc()
		return ctx, status.Error(codes.ResourceExhausted, sh.message())
	}
	return ctx, nil
}

// rlsMethod is the full gRPC name of ShouldRateLimit.
const rlsMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

func (sh *shedder) message() string {
	return fmt.Sprintf("fleetrate: overloaded: %d decisions in flight (--max-in-flight); try again", sh.max)
}

// shedHTTP puts the API's requests behind the bound; the probes, metrics
// and pages are always served.
func (s *Server) shedHTTP(next http.Handler) http.Handler {
	sh := s.shed
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !bounded(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		if !sh.acquire() {
			sh.shed.WithLabelValues("http").Inc()
			w.Header().Set("Retry-After", shedRetryAfter)
			writeError(w, &httpError{status: http.StatusServiceUnavailable, code: codeOverloaded, msg: sh.message()})
			return
		}
		defer sh.release()
		next.ServeHTTP(w, r)
	})
}

// bounded reports whether a request to path is a decision (or another
// store call) that counts towards MaxInFlight.
func bounded(path string) bool {
	return path == "/json" || strings.HasPrefix(path, "/v1/")
}
