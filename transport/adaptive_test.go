package transport_test

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

// fleetOf builds n transports over one memory store, each with a Limiter
// of its own, as n processes sharing a Redis have.
func fleetOf(t *testing.T, n int, up transport.Upstream, base http.RoundTripper, opts transport.Options) ([]*transport.Transport, fleetrate.Store) {
	t.Helper()
	store := memstore.New(memstore.Options{})
	return fleetOver(t, store, n, up, base, opts), store
}

// gaps returns the time between consecutive arrivals from from on.
func gaps(got []arrival, from time.Time) []time.Duration {
	var out []time.Duration
	var last time.Time
	for _, a := range got {
		if a.at.Before(from) {
			continue
		}
		if !last.IsZero() {
			out = append(out, a.at.Sub(last))
		}
		last = a.at
	}
	return out
}

// TestAdaptiveLowersTheRateFleetWide: one process's 429 lowers the
// effective rate of every process sharing the store (they read it within
// Refresh), and the rate then climbs back linearly to the documented one.
func TestAdaptiveLowersTheRateFleetWide(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{script: []reply{{200, ""}, {http.StatusTooManyRequests, "1"}}}
		reg := prometheus.NewRegistry()
		a := transport.Adaptive{Decrease: 0.5, Recovery: 20 * time.Second, Refresh: time.Second}
		trs, store := fleetOf(t, 2, bookingCom(10), inMemory(srv), transport.Options{Adaptive: a, Backoff: fixedBackoff(0), Registerer: reg})
		// Process 0 gets the 429.
		for range 2 {
			if _, err := get(t, t.Context(), trs[0], "/availability"); err != nil {
				t.Fatal(err)
			}
		}
		limitedAt := srv.got()[1].at
		lim, _ := fleetrate.New(store, fleetrate.Config{Buckets: bookingCom(10).Buckets()})
		b, _ := lim.Bucket(transport.EndpointBucket("booking_com", "availability"))
		f, err := transport.EffectiveFactor(t.Context(), store, b, a)
		// Lowered to 0.5 at the 429, climbing back since (the retry waited
		// out the 1 s pause): 0.5 + 1/20 at most, rounded up to 1/128.
		if err != nil || f < 0.5 || f > 0.5625 {
			t.Fatalf("effective factor after one 429 = %v, %v; want 0.5 to 0.5625", f, err)
		}
		// Process 1 paces at the lowered rate: 5/s, a request every 200 ms.
		time.Sleep(2 * time.Second)
		from := time.Now()
		for range 5 {
			if _, err := get(t, t.Context(), trs[1], "/availability"); err != nil {
				t.Fatal(err)
			}
		}
		// Lowered to 5/s, the rate climbs by 10/s over 20 s: 2 to 4 s after
		// the 429, process 1 paces at 6 to 7/s, every 143 to 167 ms.
		for i, g := range gaps(srv.got(), from) {
			if g < 140*time.Millisecond || g > 170*time.Millisecond {
				t.Errorf("process 1, gap %d: %v, want the lowered rate's 140-170 ms (the documented rate's is 100 ms)", i, g)
			}
		}
		if v := gauge(t, reg, transport.MetricEffectiveRate); v < 6 || v > 7.2 {
			t.Errorf("%s = %v, want the lowered rate, 6 to 7/s", transport.MetricEffectiveRate, v)
		}
		// Recovery: 20 s after the 429 the rate is back at 10/s.
		time.Sleep(time.Until(limitedAt.Add(21 * time.Second)))
		from = time.Now()
		for range 5 {
			if _, err := get(t, t.Context(), trs[1], "/availability"); err != nil {
				t.Fatal(err)
			}
		}
		for i, g := range gaps(srv.got(), from) {
			if g != 100*time.Millisecond {
				t.Errorf("after recovery, gap %d: %v, want the documented 100 ms", i, g)
			}
		}
	})
}

// TestPersistentLimitAtTheFloor: a 429 answered at the floor rate is an
// error an operator can alert on, not one more silent retry.
func TestPersistentLimitAtTheFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{always: &reply{http.StatusTooManyRequests, "1"}}
		reg := prometheus.NewRegistry()
		tr, _ := setup(t, bookingCom(10), inMemory(srv), transport.Options{
			Adaptive: transport.Adaptive{Decrease: 0.5, Floor: 0.5}, Backoff: fixedBackoff(0), MaxAttempts: 3, Registerer: reg,
		})
		_, err := get(t, t.Context(), tr, "/availability")
		var gu *transport.GaveUpError
		if !errors.As(err, &gu) || !errors.Is(err, transport.ErrPersistentLimit) {
			t.Fatalf("got %v, want a *GaveUpError wrapping ErrPersistentLimit", err)
		}
		if n := testutil.ToFloat64(counter(t, reg, transport.MetricPersistent)); n < 1 {
			t.Fatalf("%s = %v, want >= 1", transport.MetricPersistent, n)
		}
	})
}

// gauge returns the value of the first series of the named gauge in reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// counter returns the one series of the named metric in reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return collected{v: mf.GetMetric()[0].GetCounter().GetValue(), name: name}
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// collected is a constant collector of one counter value, for testutil.
type collected struct {
	v    float64
	name string
}

func (c collected) Describe(ch chan<- *prometheus.Desc) {
	ch <- prometheus.NewDesc(c.name, "test", nil, nil)
}

func (c collected) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(c.name, "test", nil, nil), prometheus.CounterValue, c.v)
}

// TestFixedUpstreamIsNotAdapted: Upstream.Fixed keeps the documented rate.
func TestFixedUpstreamIsNotAdapted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{script: []reply{{http.StatusTooManyRequests, "1"}}}
		up := bookingCom(10)
		up.Fixed = true
		tr, lim := setup(t, up, inMemory(srv), transport.Options{Backoff: fixedBackoff(0)})
		if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
			t.Fatal(err)
		}
		b, _ := lim.Bucket(transport.EndpointBucket("booking_com", "availability"))
		if f, err := transport.EffectiveFactor(t.Context(), lim.Store(), b, transport.Adaptive{}); err != nil || f != 1 {
			t.Fatalf("factor of a fixed upstream after a 429 = %v, %v; want 1", f, err)
		}
	})
}

// TestRateLimitWithoutRetryAfterPausesTheFleet: a 429 with no usable
// Retry-After still pauses every process, for the backoff ceiling.
func TestRateLimitWithoutRetryAfterPausesTheFleet(t *testing.T) {
	for _, ra := range []string{"", "garbage"} {
		t.Run("retry-after="+ra, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &upstream{script: []reply{{200, ""}, {http.StatusTooManyRequests, ra}}}
				const pause = 800 * time.Millisecond
				trs, _ := fleetOf(t, 2, bookingCom(100), inMemory(srv), transport.Options{
					BackoffMin: pause, Backoff: fixedBackoff(0), MaxAttempts: 1, Adaptive: transport.Adaptive{Off: true},
				})
				var wg sync.WaitGroup
				start := time.Now()
				for _, tr := range trs {
					wg.Go(func() {
						for time.Since(start) < 2*time.Second {
							_, _ = get(t, t.Context(), tr, "/availability")
						}
					})
				}
				wg.Wait()
				got := srv.got()
				t429 := got[1].at
				for _, a := range got[2:] {
					if a.at.Before(t429.Add(pause)) {
						t.Fatalf("a request arrived %v after a 429 without Retry-After, inside the %v pause", a.at.Sub(t429), pause)
					}
				}
				if len(got) < 10 {
					t.Fatalf("only %d requests: the fleet did not resume", len(got))
				}
			})
		})
	}
}

// TestBackpressureReportsTheBudgetLeft: the error names what the wait
// exceeded, the budget left, not the configured max wait.
func TestBackpressureReportsTheBudgetLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{}
		tr, _ := setup(t, bookingCom(1), inMemory(srv), transport.Options{MaxWait: 5 * time.Second})
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Go(func() {
				_, err := get(t, t.Context(), tr, "/availability")
				errs <- err
			})
			synctest.Wait() // booked in order
		}
		wg.Wait()
		close(errs)
		var bps int
		for err := range errs {
			var bp *fleetrate.BackpressureError
			if errors.As(err, &bp) {
				bps++
				if bp.MaxWait > 5*time.Second || bp.RetryAfter <= bp.MaxWait || !strings.Contains(err.Error(), "exceeds max wait") {
					t.Errorf("backpressure %v: retry-after %v, budget %v", err, bp.RetryAfter, bp.MaxWait)
				}
			}
		}
		if bps != 2 {
			t.Fatalf("%d requests refused with backpressure, want the 2 beyond 5 s of queue", bps)
		}
	})
}

// TestRateLimitRightAfterAPauseLengthensThePause: a 429 on the first
// request after a pause the transport chose itself (no Retry-After) says
// the upstream's own pause is longer, not that the rate is too high: the
// next pause is twice as long and the rate stays where the first 429 put
// it. A 429 after the upstream admitted requests again lowers the rate,
// to below what the fleet had sent since the pause (see limitRange).
func TestRateLimitRightAfterAPauseLengthensThePause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const pause = 500 * time.Millisecond
		srv := &upstream{script: []reply{
			{200, ""}, {http.StatusTooManyRequests, ""}, // lowers the rate, pauses 500 ms
			{http.StatusTooManyRequests, ""}, // at once after the pause: pauses 1 s
			{200, ""}, {200, ""}, {200, ""}, {200, ""}, {200, ""}, {200, ""}, {200, ""},
			{http.StatusTooManyRequests, ""}, // after 7 admitted: lowers the rate again
		}}
		tr, lim := setup(t, bookingCom(10), inMemory(srv), transport.Options{
			BackoffMin: pause, Backoff: fixedBackoff(0), MaxAttempts: 1,
		})
		b, _ := lim.Bucket(transport.EndpointBucket("booking_com", "availability"))
		factor := func() float64 {
			f, err := transport.EffectiveFactor(t.Context(), lim.Store(), b, transport.Adaptive{})
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
		for range 2 {
			_, _ = get(t, t.Context(), tr, "/availability")
		}
		first := factor()
		if first >= 1 {
			t.Fatalf("factor after the first 429 = %v, want it lowered", first)
		}
		_, _ = get(t, t.Context(), tr, "/availability") // the 429 right after the pause
		if f := factor(); f < first {
			t.Fatalf("factor after a 429 right after the pause = %v, want it kept at %v", f, first)
		}
		for range 8 {
			_, _ = get(t, t.Context(), tr, "/availability")
		}
		got := srv.got()
		if gap := got[3].at.Sub(got[2].at); gap < 2*pause {
			t.Errorf("the request after the second 429 went %v after it, want the doubled pause %v", gap, 2*pause)
		}
		// 7 admitted since the pause at 8.5/s, then a 429: the limit is
		// below 8.5 × (1 − 1/8) of 10/s, and the rate starts lower still.
		if f := factor(); f > first*(1-1.0/8)*transport.DefaultDecrease+0.01 {
			t.Errorf("factor after a 429 following 7 admitted requests = %v, want at most %v", f, first*(1-1.0/8)*transport.DefaultDecrease)
		}
	})
}

// TestClimbAtTheDocumentedRateReadsAsLowered: a 429 at the documented
// rate records a climb whose #rate and #peak markers hold equal states.
// They are written one after the other and read one after the other, and
// both states fall with time: when more time passes between the two reads
// than between the two writes, the #peak state reads a little below the
// #rate one. That climb was taken for no climb at all, so the processes
// that read it went on at the documented rate (seen in the benchmark's
// worker logs, about half the times). The store's clock here moves a
// little more at each call, so the reads are always the further apart.
func TestClimbAtTheDocumentedRateReadsAsLowered(t *testing.T) {
	var mu sync.Mutex
	now, step := time.Unix(1000, 0), time.Duration(0)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		step += time.Microsecond
		now = now.Add(step)
		return now
	}
	store := memstore.New(memstore.Options{Clock: clock})
	lim, err := fleetrate.New(store, fleetrate.Config{Buckets: bookingCom(10).Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := lim.Bucket(transport.EndpointBucket("booking_com", "availability"))
	a := transport.Adaptive{}
	for _, want := range []float64{0.95, 0.9, 0.86, 0.5} {
		if err := transport.SetEffectiveFactor(t.Context(), store, b, a, want); err != nil {
			t.Fatal(err)
		}
		got, err := transport.EffectiveFactor(t.Context(), store, b, a)
		// Read on the local clock, a little before the store's: the
		// factor is the set one, or a step of 1/128 above it.
		if err != nil || got < want-0.01 || got > want+0.02 {
			t.Errorf("effective factor set to %v reads %v, %v", want, got, err)
		}
	}
}

// TestProvenLimitIsLearnedFleetWide: a strict window's jitter 429 soon
// after a resume, drawn by another process than the one whose 429 caused
// the pause, keeps the limit the minute before it proved: every process
// records that proof when it learns of a pause (see view.proven), so the
// rate falls by the half drop, not to what the three requests since the
// resume allow (about 0.6 of it, as run H's strict window did).
func TestProvenLimitIsLearnedFleetWide(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		script := make([]reply, 0, 210)
		for range 200 {
			script = append(script, reply{200, ""})
		}
		script = append(script,
			reply{http.StatusTooManyRequests, "1"}, // process 0, after 200 admitted
			reply{200, ""}, reply{200, ""},         // process 1, after the pause
			reply{http.StatusTooManyRequests, "1"}, // process 1's third: jitter
		)
		srv := &upstream{script: script}
		trs, store := fleetOf(t, 2, bookingCom(10), inMemory(srv), transport.Options{Backoff: fixedBackoff(0), MaxAttempts: 1})
		for range 100 {
			for _, tr := range trs {
				if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
					t.Fatal(err)
				}
			}
		}
		_, _ = get(t, t.Context(), trs[0], "/availability") // the first 429
		for range 3 {
			_, _ = get(t, t.Context(), trs[1], "/availability")
		}
		if n := len(srv.got()); n != 204 {
			t.Fatalf("upstream got %d requests, want 204", n)
		}
		lim, _ := fleetrate.New(store, fleetrate.Config{Buckets: bookingCom(10).Buckets()})
		b, _ := lim.Bucket(transport.EndpointBucket("booking_com", "availability"))
		time.Sleep(time.Second) // the second 429's pause: its climb begins
		f, err := transport.EffectiveFactor(t.Context(), store, b, transport.Adaptive{})
		// Half drop (0.925) of the limit proven by ~200 admitted at 10/s
		// (at least 10 × (1 − 4/199)).
		if want := 0.925 * (1 - 4.0/199); err != nil || f < want-0.01 {
			t.Fatalf("effective factor after a jitter 429 three requests after a resume = %v, %v; want about %v (half the drop below the proven limit)", f, err, want)
		}
	})
}
