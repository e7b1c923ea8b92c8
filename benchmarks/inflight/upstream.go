// Package inflight measures fleetrate's in-flight bound where the upstream
// stands: real worker processes share a credential's bucket on a real
// redis-server and call an upstream that counts the requests it is
// serving at each instant and refuses any beyond its bound, while workers
// are killed with kill -9 and paused with SIGSTOP.
package inflight

import (
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// upstream serves GET with a latency drawn from [minLatency, maxLatency]
// and answers 429 to a request that arrives while bound requests are in
// flight. It records the requests in flight after every arrival and
// departure.
type upstream struct {
	bound                  int
	minLatency, maxLatency time.Duration

	mu       sync.Mutex
	rng      *rand.Rand
	inFlight int
	peak     int
	served   int // answered 200
	refused  int // answered 429: over the bound
	cut      int // ended early: the client went away (a killed worker)
	timeline []point
}

// point is the requests in flight from at on.
type point struct {
	at time.Time
	n  int
}

func newUpstream(bound int, minLatency, maxLatency time.Duration) *upstream {
	return &upstream{bound: bound, minLatency: minLatency, maxLatency: maxLatency, rng: rand.New(rand.NewPCG(1, 2))}
}

// ServeHTTP serves one request.
func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.inFlight++
	u.peak = max(u.peak, u.inFlight)
	u.timeline = append(u.timeline, point{time.Now(), u.inFlight})
	over := u.inFlight > u.bound
	lat := u.minLatency + time.Duration(u.rng.Int64N(int64(u.maxLatency-u.minLatency)+1))
	u.mu.Unlock()
	done := func(outcome *int) {
		u.mu.Lock()
		u.inFlight--
		*outcome++
		u.timeline = append(u.timeline, point{time.Now(), u.inFlight})
		u.mu.Unlock()
	}
	if over {
		done(&u.refused)
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	t := time.NewTimer(lat)
	defer t.Stop()
	select {
	case <-t.C:
		done(&u.served)
		w.WriteHeader(http.StatusOK)
	case <-r.Context().Done():
		done(&u.cut)
	}
}

// stats returns what the upstream saw.
func (u *upstream) stats() (peak, served, refused, cut int, timeline []point) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.peak, u.served, u.refused, u.cut, append([]point(nil), u.timeline...)
}

// fullAgain returns how long after at the requests in flight first came
// back to the bound, having fallen below it, or -1 if they never did.
func fullAgain(tl []point, at time.Time, bound int) time.Duration {
	fell := false
	for _, p := range tl {
		if p.at.Before(at) {
			continue
		}
		if p.n < bound {
			fell = true
		}
		if fell && p.n >= bound {
			return p.at.Sub(at)
		}
	}
	return -1
}

// busy returns the mean number of requests in flight between from and to.
func busy(tl []point, from, to time.Time) float64 {
	var area float64
	n, last := 0, from
	for _, p := range tl {
		if p.at.After(to) {
			break
		}
		if p.at.After(from) {
			area += float64(n) * p.at.Sub(last).Seconds()
			last = p.at
		}
		n = p.n
	}
	area += float64(n) * to.Sub(last).Seconds()
	return area / to.Sub(from).Seconds()
}
