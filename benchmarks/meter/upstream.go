// Package meter measures the transport's meters where the upstream
// stands: a fleet of worker processes (each its own Limiter and Transport
// over one real redis-server) calls a mock LLM API that enforces requests
// per minute and tokens per minute strictly, and whose answers really cost
// more or less than the fleet estimated. The fleet settles each request
// from the usage its answer reports (transport.Endpoint.Settle); the
// upstream's own log says how many tokens it admitted, and by how much its
// tokens bucket was ever over.
//
// A test package that uses Run must call Main from its TestMain, so that
// the test binary can re-execute itself as a worker process.
package meter

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// Cost is how the upstream draws an answer's real cost, in tokens.
type Cost int

// The real costs of the scenarios, around a mean of 500 tokens.
const (
	// Spread: 250 to 750 tokens at random, uniformly (500 ± 50 %).
	Spread Cost = iota
	// High: 750 tokens every time (500 + 50 %).
	High
	// Low: 250 tokens every time (500 − 50 %).
	Low
)

// String names the cost in a table row.
func (c Cost) String() string {
	switch c {
	case Spread:
		return "250–750 at random (500 ± 50 %)"
	case High:
		return "750 (500 + 50 %)"
	case Low:
		return "250 (500 − 50 %)"
	}
	return fmt.Sprintf("Cost(%d)", int(c))
}

// UpstreamConfig is the mock LLM API's limits and latency.
type UpstreamConfig struct {
	// RPS and RequestBurst are its requests limit: a token bucket of RPS
	// requests a second holding RequestBurst.
	RPS          float64
	RequestBurst float64
	// TPS and TokenBurst are its tokens limit: a token bucket of TPS
	// tokens a second holding TokenBurst, charged each answer's real cost
	// when it is answered.
	TPS        float64
	TokenBurst float64
	// MinLatency and MaxLatency bound an answer's latency, drawn
	// uniformly between them.
	MinLatency, MaxLatency time.Duration
	// Cost draws the real costs.
	Cost Cost
	// Seed seeds the draws of costs and latencies.
	Seed uint64
}

// Upstream is a mock LLM API, one path: a request is refused (429) when
// its requests bucket holds less than one request or its tokens bucket is
// empty (at or below zero); otherwise it is answered after its latency,
// and its real cost is charged to the tokens bucket then. An answer that
// takes the tokens bucket below zero is one the real API would have
// refused: Upstream records by how much (Over). It is an http.Handler safe
// for concurrent use.
type Upstream struct {
	cfg UpstreamConfig

	mu       sync.Mutex
	rng      *rand.Rand
	req, tok bucket
	over     float64
	answers  []Answer
	refused  []time.Time
}

// Answer is a request the upstream answered: when, and its real cost.
type Answer struct {
	At   time.Time
	Cost int64
}

// bucket is an exact token bucket in float64 units that may go below
// zero (a charge after the fact).
type bucket struct {
	rate, burst float64
	level       float64
	last        time.Time
}

func (b *bucket) refill(now time.Time) {
	if b.last.IsZero() {
		b.level, b.last = b.burst, now
		return
	}
	if now.After(b.last) {
		b.level = min(b.burst, b.level+b.rate*now.Sub(b.last).Seconds())
		b.last = now
	}
}

// NewUpstream returns an Upstream, or an error naming the invalid field.
func NewUpstream(cfg UpstreamConfig) (*Upstream, error) {
	switch {
	case !(cfg.RPS > 0) || cfg.RequestBurst < 1:
		return nil, fmt.Errorf("meter: upstream requests limit: rate %v and burst %v, want a positive rate and a burst of at least 1", cfg.RPS, cfg.RequestBurst)
	case !(cfg.TPS > 0) || !(cfg.TokenBurst > 0):
		return nil, fmt.Errorf("meter: upstream tokens limit: rate %v and burst %v, want both positive", cfg.TPS, cfg.TokenBurst)
	case cfg.MinLatency < 0 || cfg.MaxLatency < cfg.MinLatency:
		return nil, fmt.Errorf("meter: upstream latency %v to %v, want 0 <= min <= max", cfg.MinLatency, cfg.MaxLatency)
	}
	return &Upstream{
		cfg: cfg,
		rng: rand.New(rand.NewPCG(cfg.Seed, 38)),
		req: bucket{rate: cfg.RPS, burst: cfg.RequestBurst},
		tok: bucket{rate: cfg.TPS, burst: cfg.TokenBurst},
	}, nil
}

// draw returns an answer's latency and real cost.
func (u *Upstream) draw() (time.Duration, int64) {
	lat := u.cfg.MinLatency
	if span := u.cfg.MaxLatency - u.cfg.MinLatency; span > 0 {
		lat += time.Duration(u.rng.Int64N(int64(span) + 1))
	}
	switch u.cfg.Cost {
	case High:
		return lat, 750
	case Low:
		return lat, 250
	}
	return lat, 250 + u.rng.Int64N(501)
}

// ServeHTTP answers a request as the API would, with its usage.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	u.mu.Lock()
	u.req.refill(now)
	u.tok.refill(now)
	if u.req.level < 1 || u.tok.level <= 0 {
		u.refused = append(u.refused, now)
		u.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		http.Error(w, "rate limited", http.StatusTooManyRequests)
		return
	}
	u.req.level--
	lat, cost := u.draw()
	u.mu.Unlock()
	time.Sleep(lat)
	u.mu.Lock()
	at := time.Now()
	u.tok.refill(at)
	u.tok.level -= float64(cost)
	u.over = max(u.over, -u.tok.level)
	u.answers = append(u.answers, Answer{At: at, Cost: cost})
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"choices":[{"message":{"content":"..."}}],"usage":{"total_tokens":%d}}`, cost)
}

// Over is the most the tokens bucket was ever below zero, in tokens: 0
// when no answer took it past its limit.
func (u *Upstream) Over() float64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.over
}

// Answers returns the answers so far, in the order they were answered.
func (u *Upstream) Answers() []Answer {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Answer(nil), u.answers...)
}

// Refused returns when each refused request arrived.
func (u *Upstream) Refused() []time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]time.Time(nil), u.refused...)
}
