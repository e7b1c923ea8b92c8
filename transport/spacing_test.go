package transport_test

import (
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

// strictWindow is a fake upstream that admits one request per 50 ms as it
// sees them: it records when each arrived, on the bubble's clock, after a
// one-way delay of 1 ms plus, for the requests late marks (counted from
// 1, in the order they were sent), 8 ms more on the way there and back.
type strictWindow struct {
	mu       sync.Mutex
	sent     int
	late     map[int]bool
	arrivals []time.Time
	// oneWay and extra replace the 1 ms and the 8 ms when set.
	oneWay, extra time.Duration
}

func (s *strictWindow) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.sent++
	oneWay, extra := time.Millisecond, 8*time.Millisecond
	if s.oneWay > 0 {
		oneWay, extra = s.oneWay, s.extra
	}
	if s.late[s.sent] {
		oneWay += extra
	}
	s.mu.Unlock()
	time.Sleep(oneWay)
	s.mu.Lock()
	s.arrivals = append(s.arrivals, time.Now())
	s.mu.Unlock()
	time.Sleep(oneWay)
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
}

// after returns the time from the i-th arrival (from 1) to the next.
func (s *strictWindow) after(i int) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.arrivals[i].Sub(s.arrivals[i-1])
}

// closest returns the shortest time between two arrivals, and how many
// arrived.
func (s *strictWindow) closest() (time.Duration, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	least := time.Duration(1<<63 - 1)
	for i := 1; i < len(s.arrivals); i++ {
		least = min(least, s.arrivals[i].Sub(s.arrivals[i-1]))
	}
	return least, len(s.arrivals)
}

// strictUpstream paces a 50 ms strict window at 19/s, with the window
// declared as Spacing when spaced.
func strictUpstream(spaced bool) transport.Upstream {
	up := transport.Upstream{
		Channel: "ota",
		Endpoints: []transport.Endpoint{
			{Name: "avail", Pattern: "/avail", Limits: []fleetrate.Limit{fleetrate.PerSecond(19, 1)}},
		},
	}
	if spaced {
		up.Endpoints[0].Spacing = 50 * time.Millisecond
	}
	return up
}

// runStrict sends 60 requests from 2 processes × 2 goroutines to up.
func runStrict(t *testing.T, up *strictWindow, spaced bool, reg prometheus.Registerer) {
	t.Helper()
	trs, _ := fleetOf(t, 2, strictUpstream(spaced), up, transport.Options{Registerer: reg})
	var wg sync.WaitGroup
	for _, tr := range trs {
		for range 2 {
			wg.Go(func() {
				for range 15 {
					if _, err := get(t, t.Context(), tr, "/avail"); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
}

// TestSpacingHoldsTheFleetAfterALateRequest: paced at 19/s (52.6 ms
// apart), a request 8 ms late on the wire reaches a 50 ms strict window
// 44.6 ms before the next one, whichever process sends that; with the
// window declared as Spacing, the late answer holds the gate, and no two
// requests reach the upstream less than 50 ms apart.
func TestSpacingHoldsTheFleetAfterALateRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := &strictWindow{late: map[int]bool{20: true, 41: true}}
		runStrict(t, up, false, nil)
		least, n := up.closest()
		t.Logf("without spacing: closest %v of %d", least, n)
		if n != 60 || least >= 50*time.Millisecond {
			t.Fatalf("without spacing: %d arrivals, closest %v apart; want 60, some under 50ms (the test would prove nothing)", n, least)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		up := &strictWindow{late: map[int]bool{20: true, 41: true}}
		runStrict(t, up, true, reg)
		least, n := up.closest()
		t.Logf("with spacing: closest %v of %d", least, n)
		if n != 60 || least < 50*time.Millisecond {
			t.Errorf("with spacing: %d arrivals, closest %v apart; want 60, none under 50ms", n, least)
		}
		// The two late requests held the gate, and so did each process's
		// first answers, before it knew its quickest (see rttSamples).
		if got := testutil.ToFloat64(counter(t, reg, transport.MetricSpacingHolds)); got < 2 {
			t.Errorf("%s = %v, want at least the 2 late requests", transport.MetricSpacingHolds, got)
		}
	})
}

// TestSpacingHoldsOnlyAsLongAsTheLateness: from an upstream 15 ms away
// each way, a request 4 ms late each way comes back 8 ms later than the
// quickest answer; the gate then holds the next request until 50 ms + 8
// ms after the late one left, not a whole interval from its answer
// (which would leave 85 ms between the two arrivals).
// (A process's first 16 answers are compared with none, and do hold the
// gate a whole interval from their answer.)
func TestSpacingHoldsOnlyAsLongAsTheLateness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := &strictWindow{late: map[int]bool{50: true}, oneWay: 15 * time.Millisecond, extra: 4 * time.Millisecond}
		runStrict(t, up, true, nil)
		least, n := up.closest()
		gap := up.after(50)
		t.Logf("closest %v of %d; the late one to the next: %v", least, n, gap)
		if n != 60 || least < 50*time.Millisecond {
			t.Errorf("%d arrivals, closest %v apart; want 60, none under 50ms", n, least)
		}
		// Sent 50 ms + 8 ms after the late one, which arrived 4 ms late.
		if gap < 53*time.Millisecond || gap > 56*time.Millisecond {
			t.Errorf("the late request to the next: %v, want 54 ms (50 + 8 - 4), give or take a millisecond", gap)
		}
	})
}

// TestSpacingValidation: a spacing out of bounds, or limits that pace
// faster than the gate lets through, fail with the field named.
func TestSpacingValidation(t *testing.T) {
	for _, c := range []struct {
		name    string
		spacing time.Duration
		rate    float64
		want    string
	}{
		{"negative", -time.Millisecond, 10, "endpoints[0].spacing: must be 0 or between 1ms and 1m0s, got -1ms"},
		{"too short", 500 * time.Microsecond, 10, "endpoints[0].spacing"},
		{"too long", 2 * time.Minute, 0.001, "endpoints[0].spacing"},
		{"the full window's rate", 50 * time.Millisecond, 20, "endpoints[0].limits[0]: rate 20/s is faster than spacing 50ms lets through (at most 19.61/s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := strictUpstream(true)
			up.Endpoints[0].Spacing = c.spacing
			up.Endpoints[0].Limits = []fleetrate.Limit{fleetrate.PerSecond(c.rate, 1)}
			err := up.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, c.want)
			}
		})
	}
	up := strictUpstream(true)
	if err := up.Validate(); err != nil {
		t.Fatalf("19/s under a 50ms spacing: %v", err)
	}
	if got := transport.SpacingMargin(50 * time.Millisecond); got != time.Millisecond {
		t.Errorf("SpacingMargin(50ms) = %v, want 1ms", got)
	}
	if got := transport.SpacingMargin(10 * time.Millisecond); got != 500*time.Microsecond {
		t.Errorf("SpacingMargin(10ms) = %v, want a twentieth, 500µs", got)
	}
}

// TestSpacingFromAClassifyOfOwnIsChecked: a Target's spacing out of
// bounds fails the request before anything is sent.
func TestSpacingFromAClassifyOfOwnIsChecked(t *testing.T) {
	up := strictUpstream(false)
	lim, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Buckets: up.Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	sent := 0
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent++
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	})
	classify := func(*http.Request) (transport.Target, error) {
		return transport.Target{Channel: "ota", Endpoint: "avail", Spacing: -time.Second}, nil
	}
	tr, err := transport.New(lim, classify, transport.Options{Base: base, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	_, err = get(t, t.Context(), tr, "/avail")
	if err == nil || !strings.Contains(err.Error(), "spacing must be 0 or between") || sent != 0 {
		t.Fatalf("err = %v, %d sent; want the spacing named, nothing sent", err, sent)
	}
}
