package meter

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/internal/harness/workerproc"
)

// Scenario is one upstream and how the fleet is configured against it.
type Scenario struct {
	// Upstream is the mock API's configuration (Cost says what its
	// answers really cost).
	Upstream UpstreamConfig
	// Estimate is what the fleet books for a request on its tokens meter
	// before it is sent (transport.Endpoint.Costs), settled from the
	// answer's usage.
	Estimate int64
	// MeterRate and MeterBurst are the tokens meter's limit (tokens a
	// second, tokens).
	MeterRate  float64
	MeterBurst int64
	// RequestRate and RequestBurst are the endpoint's requests limit.
	RequestRate  float64
	RequestBurst int64
	// InFlight bounds the requests booked or in flight across the fleet
	// (transport.Endpoint.InFlight): at most InFlight requests are
	// unsettled at once.
	InFlight int64
}

// Name names the scenario in logs.
func (s Scenario) Name() string {
	return fmt.Sprintf("real %s, estimate %d", s.Upstream.Cost, s.Estimate)
}

// DefaultUpstream is the upstream of docs/BENCHMARKS.md's table: 1,800
// requests a minute (burst 5) and 360,000 tokens a minute (6,000 a
// second, burst 24,000: four seconds' worth), answers after 100 to 500 ms.
func DefaultUpstream(c Cost) UpstreamConfig {
	return UpstreamConfig{RPS: 30, RequestBurst: 5, TPS: 6000, TokenBurst: 24000,
		MinLatency: 100 * time.Millisecond, MaxLatency: 500 * time.Millisecond, Cost: c, Seed: 1}
}

// ScenarioFor is the fleet configured as docs/ARCHITECTURE.md advises
// against DefaultUpstream(c), with estimate est: the tokens meter at the
// upstream's rate and a quarter of its burst (6,000 tokens a second,
// burst 6,000), the requests at 28 a second (burst 2), 16 requests booked
// or in flight at most. The upstream's burst then covers the meter's, the
// under-estimates of the 16 requests unsettled (at most 500 tokens each)
// and what the spread of latencies (400 ms) lets answers bunch: 6,000 +
// 8,000 + 2,400 <= 24,000.
func ScenarioFor(c Cost, est int64) Scenario {
	return Scenario{Upstream: DefaultUpstream(c), Estimate: est, MeterRate: 6000, MeterBurst: 6000,
		RequestRate: 28, RequestBurst: 2, InFlight: 16}
}

// Scenarios are the rows of docs/BENCHMARKS.md's table: each real cost
// with the estimate at its mean (500) and at its floor (250).
func Scenarios() []Scenario {
	var ss []Scenario
	for _, est := range []int64{500, 250} {
		for _, c := range []Cost{Spread, High, Low} {
			ss = append(ss, ScenarioFor(c, est))
		}
	}
	return ss
}

// Options size a run.
type Options struct {
	Processes, Goroutines int
	Duration              time.Duration
}

// Result is what the upstream saw, and the store calls the fleet made.
type Result struct {
	Scenario Scenario
	// TokensPerMinute and RequestsPerMinute are what the upstream
	// answered over the steady window (the run less its first sixth),
	// real costs counted.
	TokensPerMinute, RequestsPerMinute float64
	// Utilisation is TokensPerMinute over the upstream's tokens a minute.
	Utilisation float64
	// Limited counts the upstream's 429s over the whole run.
	Limited int
	// Over is the most the upstream's tokens bucket was ever below zero.
	Over float64
	// Answered counts the answers over the whole run.
	Answered int
	// CallsPerRequest is the store's script calls (INFO commandstats) per
	// request the upstream received, over the whole run.
	CallsPerRequest float64
	// Outcomes count what the callers got instead of an answer.
	Outcomes
}

// Outcomes count what a fleet's callers got instead of an answer.
type Outcomes struct {
	Backpressure, GaveUp, Limited int
	// Errors are the first of the other errors.
	Errors []string
}

// Run runs the scenario against a fresh mock upstream and the Redis at
// addr, and reports what the upstream saw.
func Run(t testing.TB, addr string, s Scenario, o Options) Result {
	t.Helper()
	if o.Processes == 0 {
		o.Processes = 4
	}
	if o.Goroutines == 0 {
		o.Goroutines = 16
	}
	up, err := NewUpstream(s.Upstream)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(up)
	defer srv.Close()
	before, err := redistest.ScriptCalls(addr)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now().Add(1500 * time.Millisecond)
	sp := spec{Scenario: s, Addr: addr, URL: srv.URL, Prefix: fmt.Sprintf("fleetrate:meterbench:%d:", time.Now().UnixNano()),
		Goroutines: o.Goroutines, StartAt: start, Until: start.Add(o.Duration)}
	specs := make([]spec, o.Processes)
	for p := range specs {
		specs[p] = sp
	}
	var res Result
	res.Scenario = s
	workerproc.Run(t, workerEnv, specs, func(_ int, out Outcomes, err error) {
		if err != nil {
			res.Errors = append(res.Errors, err.Error())
			return
		}
		res.Backpressure += out.Backpressure
		res.GaveUp += out.GaveUp
		res.Outcomes.Limited += out.Limited
		res.Errors = append(res.Errors, out.Errors...)
	})
	after, err := redistest.ScriptCalls(addr)
	if err != nil {
		t.Fatal(err)
	}
	res.measure(up, start.Add(o.Duration/6), start.Add(o.Duration), after-before)
	return res
}

// measure fills r with what up saw: the answers between from and to, the
// whole run's 429s and answers, and calls store calls over its requests.
func (r *Result) measure(up *Upstream, from, to time.Time, calls int64) {
	answers, refused := up.Answers(), up.Refused()
	var tokens, n int64
	for _, a := range answers {
		if !a.At.Before(from) && a.At.Before(to) {
			tokens += a.Cost
			n++
		}
	}
	minutes := to.Sub(from).Minutes()
	r.TokensPerMinute = float64(tokens) / minutes
	r.RequestsPerMinute = float64(n) / minutes
	r.Utilisation = r.TokensPerMinute / (r.Scenario.Upstream.TPS * 60)
	r.Limited = len(refused)
	r.Over = up.Over()
	r.Answered = len(answers)
	if reqs := len(answers) + len(refused); reqs > 0 {
		r.CallsPerRequest = float64(calls) / float64(reqs)
	}
}

// Table formats results as the Markdown table docs/BENCHMARKS.md shows.
func Table(rs []Result) string {
	var b strings.Builder
	b.WriteString("| real cost (tokens) | estimate | tokens/min admitted | of the upstream's | upstream 429s | most over its tokens limit | requests/min | store calls per request |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %d | %.0f | %.1f %% of %.0f | %d | %.0f | %.0f | %.2f |\n",
			r.Scenario.Upstream.Cost, r.Scenario.Estimate, r.TokensPerMinute, 100*r.Utilisation, r.Scenario.Upstream.TPS*60,
			r.Limited, r.Over, r.RequestsPerMinute, r.CallsPerRequest)
	}
	return b.String()
}
