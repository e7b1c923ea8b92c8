package mockota

import (
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// Concurrent is an upstream that limits requests in flight, not only
// their rate: it serves GET with a latency drawn from [MinLatency,
// MaxLatency] and answers 429 to a request that arrives while Bound
// requests are in flight. It records the requests in flight after every
// arrival and departure, so that a test reads what the upstream saw at
// each instant. A request whose client goes away (a killed worker) ends
// at once.
type Concurrent struct {
	Bound                  int
	MinLatency, MaxLatency time.Duration
	// By, when set, names a request header whose value identifies the
	// caller (a worker process): InFlightOf counts its requests in flight.
	By string

	mu       sync.Mutex
	rng      *rand.Rand
	inFlight int
	of       map[string]int
	stats    ConcurrentStats
	timeline []InFlightPoint
	served   []time.Time // when each served request was answered
}

// ConcurrentStats is what a Concurrent upstream saw.
type ConcurrentStats struct {
	// Peak is the most requests it had in flight at once.
	Peak int
	// Served, Refused and Cut count the requests answered 200, answered
	// 429 (over the bound) and ended early (the client went away).
	Served, Refused, Cut int
	// Busy is the latency of the served requests, summed: Served / Busy
	// is their mean rate per request in flight.
	Busy time.Duration
}

// InFlightPoint is the number of requests in flight from At on.
type InFlightPoint struct {
	At time.Time
	N  int
}

// ServeHTTP serves one request.
func (c *Concurrent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	if c.rng == nil {
		c.rng = rand.New(rand.NewPCG(1, 2))
	}
	c.inFlight++
	who := ""
	if c.By != "" {
		if c.of == nil {
			c.of = map[string]int{}
		}
		who = r.Header.Get(c.By)
		c.of[who]++
	}
	c.stats.Peak = max(c.stats.Peak, c.inFlight)
	c.timeline = append(c.timeline, InFlightPoint{time.Now(), c.inFlight})
	over := c.inFlight > c.Bound
	lat := c.MinLatency + time.Duration(c.rng.Int64N(int64(c.MaxLatency-c.MinLatency)+1))
	c.mu.Unlock()
	done := func(outcome *int) {
		c.mu.Lock()
		c.inFlight--
		if c.By != "" {
			c.of[who]--
		}
		*outcome++
		c.timeline = append(c.timeline, InFlightPoint{time.Now(), c.inFlight})
		c.mu.Unlock()
	}
	if over {
		done(&c.stats.Refused)
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	t := time.NewTimer(lat)
	defer t.Stop()
	select {
	case <-t.C:
		c.mu.Lock()
		c.stats.Busy += lat
		c.served = append(c.served, time.Now())
		c.mu.Unlock()
		done(&c.stats.Served)
		w.WriteHeader(http.StatusOK)
	case <-r.Context().Done():
		done(&c.stats.Cut)
	}
}

// InFlightOf returns how many requests whose By header is v are in
// flight.
func (c *Concurrent) InFlightOf(v string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.of[v]
}

// Stats returns what the upstream saw so far.
func (c *Concurrent) Stats() ConcurrentStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// ServedBetween returns how many requests were answered 200 between from
// and to.
func (c *Concurrent) ServedBetween(from, to time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, at := range c.served {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// Timeline returns the requests in flight at each change, in time order.
func (c *Concurrent) Timeline() []InFlightPoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]InFlightPoint(nil), c.timeline...)
}

// FullAgain returns how long after at the requests in flight of tl first
// came back to bound, having fallen below it, or -1 if they never did.
func FullAgain(tl []InFlightPoint, at time.Time, bound int) time.Duration {
	fell := false
	for _, p := range tl {
		if p.At.Before(at) {
			continue
		}
		if p.N < bound {
			fell = true
		}
		if fell && p.N >= bound {
			return p.At.Sub(at)
		}
	}
	return -1
}

// MeanInFlight returns the mean number of requests in flight of tl between
// from and to.
func MeanInFlight(tl []InFlightPoint, from, to time.Time) float64 {
	var area float64
	n, last := 0, from
	for _, p := range tl {
		if p.At.After(to) {
			break
		}
		if p.At.After(from) {
			area += float64(n) * p.At.Sub(last).Seconds()
			last = p.At
		}
		n = p.N
	}
	area += float64(n) * to.Sub(last).Seconds()
	return area / to.Sub(from).Seconds()
}
