package httplimit

import (
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/manualclock"
	"github.com/fleetrate/fleetrate/internal/headers"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

func TestQuotaWindow(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		limit fleetrate.Limit
		q, w  int64
	}{
		{"10/s burst 20", fleetrate.PerSecond(10, 20), 20, 2},
		{"100 per minute", fleetrate.PerPeriod(100, time.Minute), 100, 60},
		{"10000 a day", fleetrate.PerPeriod(10_000, 24*time.Hour), 10_000, 86_400},
		{"one an hour", fleetrate.Every(time.Hour, 1), 1, 3600},
		{"1000/s burst 1: sub-second fill time", fleetrate.PerSecond(1000, 1), 1000, 1},
		{"1e6/s burst 100", fleetrate.PerSecond(1e6, 100), 1_000_000, 1},
		{"2/s burst 3: 1.5 s fill, 2 per second is exact", fleetrate.PerSecond(2, 3), 2, 1},
		{"3/s burst 3: 1.000000002 s fill", fleetrate.PerSecond(3, 3), 2, 1},
		{"3/s burst 30", fleetrate.PerSecond(3, 30), 29, 10},
		{"0.7/s burst 2", fleetrate.PerSecond(0.7, 2), 2, 3},
		{"one every 1.5 s", fleetrate.Every(1500*time.Millisecond, 1), 1, 2},
	}
	for _, tt := range tests {
		q, w := headers.QuotaWindow(tt.limit.Interval(), tt.limit.Burst)
		if q != tt.q || w != tt.w {
			t.Errorf("%s: q=%d w=%d, want q=%d w=%d", tt.name, q, w, tt.q, tt.w)
		}
	}
}

// randomLimit draws a valid limit: mostly log-uniform rates and bursts
// over the whole range a policy may hold, sometimes the round figures
// people write.
func randomLimit(rng *rand.Rand) fleetrate.Limit {
	for {
		var l fleetrate.Limit
		switch rng.IntN(4) {
		case 0:
			l = fleetrate.PerSecond(float64(1+rng.IntN(1000)), int64(1+rng.IntN(100)))
		case 1:
			periods := []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour}
			l = fleetrate.PerPeriod(int64(1+rng.IntN(10_000)), periods[rng.IntN(len(periods))])
		default:
			rate := math.Pow(10, -4+rng.Float64()*11) // 1e-4 to 1e7 per second
			burst := int64(math.Pow(10, rng.Float64()*6))
			l = fleetrate.PerSecond(rate, max(burst, 1))
		}
		if l.Validate() == nil {
			return l
		}
	}
}

// promiseCase is one random policy under test, driven through the
// middleware on a manual clock.
type promiseCase struct {
	t      *testing.T
	clock  *manualclock.Clock
	h      http.Handler
	limits []fleetrate.Limit
	upt    int64
	items  []headers.Policy // as advertised, parsed back
}

// send makes one request of the given cost in tokens for a client.
func (pc *promiseCase) send(key string, cost int64) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("X-API-Key", key)
	r.Header.Set("X-Cost", strconv.FormatInt(cost, 10))
	w := httptest.NewRecorder()
	pc.h.ServeHTTP(w, r)
	return w
}

// rateLimit returns the RateLimit item of a response, in tokens.
func (pc *promiseCase) rateLimit(w *httptest.ResponseRecorder) (r int64, t time.Duration) {
	pc.t.Helper()
	l := rateLimit(pc.t, w)
	if l.Remaining%pc.upt != 0 || !l.HasReset {
		pc.t.Fatalf("RateLimit %+v: not whole tokens of %d units, or no t", l, pc.upt)
	}
	return l.Remaining / pc.upt, l.Reset
}

func (pc *promiseCase) fatalf(format string, args ...any) {
	pc.t.Helper()
	pc.t.Fatalf("limits %v, %d units per token: %s", pc.limits, pc.upt, fmt.Sprintf(format, args...))
}

// TestHeadersKeepTheirPromises checks every number the middleware
// advertises against the decisions of the bucket behind it, for thousands
// of random policies (one to three limits of any rate and burst, costs,
// and content-bytes policies whose token is 1 KiB):
//
//   - RateLimit-Policy: a client pacing itself at q per w is never
//     refused; when q is at most the burst (fill time of a second or
//     more), any q units in any w seconds are admitted, however bunched;
//     q/w is never above the bucket's rate, nor below half of it, and for
//     sub-second fill times it is the rate less under one unit a second.
//   - RateLimit: exactly r units are admitted at once, and no more until t
//     has passed; with one limit, one more is admitted within a second
//     after t (t understates by under a second).
//   - a refusal carries a Retry-After no earlier than t, and obeying it
//     admits the request; a cost above the burst is refused with complete
//     RateLimit fields.
func TestHeadersKeepTheirPromises(t *testing.T) {
	t.Parallel()
	cases := 2000
	if testing.Short() {
		cases = 500
	}
	rng := rand.New(rand.NewPCG(14, 2026))
	for n := range cases {
		seed := rng.Uint64()
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			pc := newPromiseCase(t, rand.New(rand.NewPCG(seed, 1)))
			pc.checkArithmetic()
			pc.checkPacing()
			pc.checkWindow(rand.New(rand.NewPCG(seed, 2)))
			pc.checkRemaining(rand.New(rand.NewPCG(seed, 3)))
		})
	}
}

func newPromiseCase(t *testing.T, rng *rand.Rand) *promiseCase {
	pc := &promiseCase{t: t, clock: manualclock.New(time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)), upt: 1}
	nl := 1 + rng.IntN(3)
	for i := range nl {
		l := randomLimit(rng)
		if nl > 1 {
			l = l.Named("l" + strconv.Itoa(i))
		}
		pc.limits = append(pc.limits, l)
	}
	p := Policy{
		Name:   "p",
		Limits: pc.limits,
		Cost: func(r *http.Request) (int64, error) {
			return strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64)
		},
	}
	if rng.IntN(4) == 0 {
		p.Unit, p.UnitsPerToken, pc.upt = headers.UnitContentBytes, 1024, 1024
	}
	m, err := New(Config{
		Store:  memstore.New(memstore.Options{Clock: pc.clock.Now, Shards: 1}),
		Key:    APIKey("X-API-Key"),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := m.Limit(p)
	if err != nil {
		pc.fatalf("Limit: %v", err)
	}
	pc.h = mw(&okHandler{})
	w := pc.send("first", 0)
	if pc.items, err = headers.ParsePolicy(w.Header().Values(HeaderRateLimitPolicy)...); err != nil || len(pc.items) != nl {
		pc.fatalf("RateLimit-Policy %q: %v", w.Header().Get(HeaderRateLimitPolicy), err)
	}
	return pc
}

// quota returns the advertised q (in tokens) and w of limit i.
func (pc *promiseCase) quota(i int) (q int64, w time.Duration) {
	it := pc.items[i]
	if it.Quota%pc.upt != 0 {
		pc.fatalf("q=%d is not whole tokens of %d units", it.Quota, pc.upt)
	}
	return it.Quota / pc.upt, it.Window
}

// checkArithmetic holds q/w between half the bucket's rate (exact to a
// unit for sub-second fill times) and the rate itself, with the bucket's
// own interval.
func (pc *promiseCase) checkArithmetic() {
	for i, l := range pc.limits {
		q, w := pc.quota(i)
		iv := l.Interval()
		if q < 1 || w < time.Second || w%time.Second != 0 {
			pc.fatalf("item %d: q=%d w=%v", i, q, w)
		}
		if q*iv > int64(w) {
			pc.fatalf("item %d: q=%d per w=%v is faster than the bucket's one token per %v", i, q, w, time.Duration(iv))
		}
		if iv >= 2*int64(time.Microsecond) && 2*q*iv <= int64(w) {
			pc.fatalf("item %d: q=%d per w=%v is below half the bucket's rate, one token per %v", i, q, w, time.Duration(iv))
		}
		if paced := headers.PacedInterval(iv, l.Burst); l.FillTime() < time.Second && ((q+1)*paced <= int64(w) || paced >= iv+int64(time.Microsecond)) {
			pc.fatalf("item %d: sub-second fill time, but q=%d per w=%v is more than a unit below one token per %v, or that is 1 µs or more above the bucket's %v",
				i, q, w, time.Duration(paced), time.Duration(iv))
		}
		if l.FillTime()%time.Second == 0 && (q != l.Burst || w != l.FillTime()) {
			pc.fatalf("item %d: fill time %v is whole seconds, but q=%d w=%v", i, l.FillTime(), q, w)
		}
	}
}

// checkPacing sends one token at a time at the slowest advertised rate
// and expects every request admitted.
func (pc *promiseCase) checkPacing() {
	slow := 0
	for i := range pc.items {
		qi, wi := pc.quota(i)
		qs, ws := pc.quota(slow)
		if float64(qi)/float64(wi) < float64(qs)/float64(ws) {
			slow = i
		}
	}
	q, w := pc.quota(slow)
	start := pc.clock.Now()
	for k := range int64(20) {
		// The k-th request at ceil(k·w/q), from a full bucket.
		at := time.Duration((k*int64(w) + q - 1) / q)
		pc.clock.Advance(start.Add(at).Sub(pc.clock.Now()))
		if resp := pc.send("pace", 1); resp.Code != http.StatusOK {
			pc.fatalf("pacing at q=%d per w=%v: request %d refused (%d)", q, w, k, resp.Code)
		}
	}
}

// checkWindow sends bunched requests of random costs, keeping every
// item's use within (now−w, now] at most q, and expects all admitted.
// It applies only when every q is at most its limit's burst.
func (pc *promiseCase) checkWindow(rng *rand.Rand) {
	maxCost := int64(math.MaxInt64)
	for i, l := range pc.limits {
		q, _ := pc.quota(i)
		if q > l.Burst {
			return // a rate only, not a window: see headers.QuotaWindow
		}
		maxCost = min(maxCost, q)
	}
	type sent struct {
		at   time.Time
		cost int64
	}
	var log []sent
	q0, w0 := pc.quota(0)
	for range 30 {
		if rng.IntN(3) > 0 {
			pc.clock.Advance(time.Duration(rng.Int64N(2*int64(w0)/q0 + 1)))
		}
		now := pc.clock.Now()
		cost := 1 + rng.Int64N(maxCost)
		fits := true
		for i := range pc.items {
			q, w := pc.quota(i)
			used := cost
			for _, s := range log {
				if s.at.After(now.Add(-w)) {
					used += s.cost
				}
			}
			fits = fits && used <= q
		}
		if !fits {
			continue
		}
		if w := pc.send("window", cost); w.Code != http.StatusOK {
			pc.fatalf("cost %d within every advertised window refused (%d); sent before: %v", cost, w.Code, log)
		}
		log = append(log, sent{now, cost})
	}
}

// checkRemaining drives one client with random costs and pauses, and
// after some responses spends exactly the advertised r at once and probes
// the effective window t.
func (pc *promiseCase) checkRemaining(rng *rand.Rand) {
	minBurst := pc.limits[0].Burst
	var longest time.Duration
	for _, l := range pc.limits {
		minBurst, longest = min(minBurst, l.Burst), max(longest, l.FillTime())
	}
	if frac := pc.clock.Now().Nanosecond() % 1000; frac != 0 {
		pc.clock.Advance(time.Duration(1000 - frac))
	}
	for range 20 {
		// The store's clock, like Redis's TIME, reads whole microseconds;
		// r and t speak of the instant it decided.
		pc.clock.Advance(time.Duration(rng.Int64N(int64(longest)/4 + 1)).Truncate(time.Microsecond))
		cost := rng.Int64N(min(minBurst, 5) + 1)
		if rng.IntN(10) == 0 {
			cost = minBurst + 1
		}
		w := pc.send("probe", cost)
		r, t := pc.rateLimit(w)
		switch {
		case cost > minBurst:
			want := http.StatusTooManyRequests
			if pc.upt > 1 {
				want = http.StatusRequestEntityTooLarge
			}
			if w.Code != want || w.Header().Get(HeaderRetryAfter) != "" {
				pc.fatalf("cost %d above burst %d: %d, Retry-After %q; want %d without", cost, minBurst, w.Code, w.Header().Get(HeaderRetryAfter), want)
			}
			decodeProblem(pc.t, w)
		case w.Code == http.StatusTooManyRequests:
			pc.checkRefusal(w, cost, t)
			continue
		case w.Code != http.StatusOK:
			pc.fatalf("cost %d: status %d", cost, w.Code)
		}
		if rng.IntN(2) == 0 {
			pc.probe(r, t)
		}
	}
}

// checkRefusal obeys a refusal's Retry-After, which must not end before
// t, and expects the same request admitted then.
func (pc *promiseCase) checkRefusal(w *httptest.ResponseRecorder, cost int64, t time.Duration) {
	ra, ok := transport.ParseRetryAfter(w.Header().Get(HeaderRetryAfter), pc.clock.Now(), 400*24*time.Hour)
	if !ok || ra < time.Second || ra < t {
		pc.fatalf("refusal of cost %d: Retry-After %q (%v, %v) with t=%v", cost, w.Header().Get(HeaderRetryAfter), ra, ok, t)
	}
	decodeProblem(pc.t, w)
	pc.clock.Advance(ra)
	if w := pc.send("probe", cost); w.Code != http.StatusOK {
		pc.fatalf("cost %d refused (%d) after obeying Retry-After %v", cost, w.Code, ra)
	}
}

// probe spends r at once (admitted), then one more token (refused), then
// one token just before t ends (refused); with one limit, one token a
// second after t is admitted.
func (pc *promiseCase) probe(r int64, t time.Duration) {
	start := pc.clock.Now()
	if r > 0 {
		if w := pc.send("probe", r); w.Code != http.StatusOK {
			pc.fatalf("r=%d advertised, but a request of cost %d at once refused (%d)", r, r, w.Code)
		}
	}
	if w := pc.send("probe", 1); w.Code != http.StatusTooManyRequests {
		pc.fatalf("r=%d advertised, but one more token at once admitted (%d)", r, w.Code)
	}
	if t > 0 {
		pc.clock.Advance(t - time.Nanosecond)
		if w := pc.send("probe", 1); w.Code != http.StatusTooManyRequests {
			pc.fatalf("r=%d;t=%v advertised, but one more token admitted %v later (%d)", r, t, t-time.Nanosecond, w.Code)
		}
	}
	if len(pc.limits) > 1 {
		// Back to a whole microsecond, where the store's clock reads, so
		// that the next r and t speak of the instant the probe sends.
		pc.clock.Advance(start.Add(t).Sub(pc.clock.Now()))
		return
	}
	pc.clock.Advance(start.Add(t + time.Second).Sub(pc.clock.Now()))
	if w := pc.send("probe", 1); w.Code != http.StatusOK {
		pc.fatalf("r=%d;t=%v advertised, but no token %v later (%d): t understates by a second or more", r, t, t+time.Second, w.Code)
	}
}
