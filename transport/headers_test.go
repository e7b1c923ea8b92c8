package transport_test

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate/transport"
)

// stating is a fake upstream that admits everything and sends the fields
// fields gives for each request (numbered from 1).
type stating struct {
	upstream
	fields func(n int) map[string]string
}

func (s *stating) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := len(s.got()) + 1
	for k, v := range s.fields(n) {
		w.Header().Set(k, v)
	}
	s.upstream.ServeHTTP(w, r)
}

// gaugeOf returns the value of a gauge's series with the given labels.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue series
				}
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no series %s %v", name, labels)
	return 0
}

// TestStatedLimitCapsTheRate: an upstream documented (and paced) at 20/s
// that states 10 per second in the draft's fields is paced at 10/s from
// its first answer on, with no 429; one that states 40/s, above the
// documented rate, is paced at 20/s still: headers never raise.
func TestStatedLimitCapsTheRate(t *testing.T) {
	for _, c := range []struct {
		name   string
		policy string
		want   float64
	}{
		{"below the documented rate", `"p";q=10;w=1`, 10},
		{"above it: never a raise", `"p";q=40;w=1`, 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &stating{fields: func(int) map[string]string {
					return map[string]string{"RateLimit-Policy": c.policy, "RateLimit": `"p";r=5;t=1`}
				}}
				reg := prometheus.NewRegistry()
				tr, _ := setup(t, bookingCom(20), inMemory(srv), transport.Options{Registerer: reg})
				for range 3 {
					if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
						t.Fatal(err)
					}
				}
				if got := gaugeOf(t, reg, transport.MetricEffectiveRate, map[string]string{"bucket": "{booking_com}/availability"}); got != c.want {
					t.Errorf("effective rate %v, want %v", got, c.want)
				}
				if n := metricValue(t, reg, transport.MetricHeaders, map[string]string{"result": "read"}); n != 3 {
					t.Errorf("%s{result=read} = %v, want 3", transport.MetricHeaders, n)
				}
			})
		})
	}
}

// TestRemainingHoldsTheFleet: an answer saying no request remains until a
// reset 2 s away holds the endpoint's bucket for those 2 s in the store
// (its pause marker, which every process's take also takes), so the next
// request waits them out; a held answer counts a hold.
func TestRemainingHoldsTheFleet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &stating{fields: func(n int) map[string]string {
			if n == 1 {
				return map[string]string{"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "2"}
			}
			return nil
		}}
		reg := prometheus.NewRegistry()
		tr, lim := setup(t, bookingCom(20), inMemory(srv), transport.Options{Registerer: reg})
		if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
			t.Fatal(err)
		}
		res, err := lim.Peek(t.Context(), transport.PauseBucket("{booking_com}/availability"))
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed || res.RetryAfter < 1900*time.Millisecond || res.RetryAfter > 2*time.Second {
			t.Fatalf("pause marker after the answer: %+v, want held about 2s", res)
		}
		start := time.Now()
		if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited < 2*time.Second-time.Millisecond {
			t.Errorf("the next request went after %v, inside the hold", waited)
		}
		if n := metricValue(t, reg, transport.MetricHeaderHolds, nil); n != 1 {
			t.Errorf("%s = %v, want 1", transport.MetricHeaderHolds, n)
		}
	})
}

// TestIgnoredFieldsAreCounted: garbage, contradictions and resets out of
// bounds change nothing and are counted by reason; Off reads nothing; a
// Read of the user's own is checked as the built-in forms are.
func TestIgnoredFieldsAreCounted(t *testing.T) {
	for _, c := range []struct {
		name    string
		headers transport.RateLimitHeaders
		fields  map[string]string
		result  string
	}{
		{"remaining above the limit", transport.RateLimitHeaders{}, map[string]string{"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "50", "X-RateLimit-Reset": "1"}, "remaining_above_limit"},
		{"garbage", transport.RateLimitHeaders{}, map[string]string{"X-RateLimit-Remaining": "lots", "X-RateLimit-Reset": "1"}, "garbage"},
		{"a reset two days away", transport.RateLimitHeaders{}, map[string]string{"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "48h"}, "reset_too_far"},
		{"off", transport.RateLimitHeaders{Off: true}, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "5"}, ""},
		{"a read of one's own, out of bounds", transport.RateLimitHeaders{Read: func(http.Header, time.Time) (transport.UpstreamQuota, bool) {
			return transport.UpstreamQuota{Remaining: -3, Reset: time.Second}, true
		}}, nil, "negative"},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &stating{fields: func(int) map[string]string { return c.fields }}
				reg := prometheus.NewRegistry()
				up := bookingCom(20)
				up.Headers = c.headers
				tr, lim := setup(t, up, inMemory(srv), transport.Options{Registerer: reg})
				if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
					t.Fatal(err)
				}
				if c.result != "" {
					if n := metricValue(t, reg, transport.MetricHeaders, map[string]string{"result": c.result}); n < 1 {
						t.Errorf("%s{result=%s} = %v, want ≥ 1", transport.MetricHeaders, c.result, n)
					}
				} else if n := metricValue(t, reg, transport.MetricHeaders, nil); n != 0 {
					t.Errorf("%s = %v with the fields off, want 0", transport.MetricHeaders, n)
				}
				res, err := lim.Peek(t.Context(), transport.PauseBucket("{booking_com}/availability"))
				if err != nil || !res.Allowed {
					t.Errorf("pause marker %+v (%v): ignored fields held the fleet", res, err)
				}
			})
		})
	}
}

// TestWindowOfAnUnstatedLimit: X-RateLimit-Limit states no window; the
// upstream's Headers.Window supplies it, and without one the limit caps
// nothing.
func TestWindowOfAnUnstatedLimit(t *testing.T) {
	for _, window := range []time.Duration{0, time.Second} {
		t.Run(strconv.Itoa(int(window.Seconds())), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &stating{fields: func(int) map[string]string { return map[string]string{"X-RateLimit-Limit": "5"} }}
				reg := prometheus.NewRegistry()
				up := bookingCom(20)
				up.Headers.Window = window
				tr, _ := setup(t, up, inMemory(srv), transport.Options{Registerer: reg})
				for range 2 {
					if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
						t.Fatal(err)
					}
				}
				want := 20.0
				if window > 0 {
					want = 5
				}
				if got := gaugeOf(t, reg, transport.MetricEffectiveRate, nil); got != want {
					t.Errorf("effective rate %v, want %v", got, want)
				}
			})
		})
	}
}

// TestHeadersValidate names a bad setting.
func TestHeadersValidate(t *testing.T) {
	up := bookingCom(20)
	up.Headers.Window = -time.Second
	if err := up.Validate(); err == nil {
		t.Fatal("a negative window validated")
	}
	up.Headers = transport.RateLimitHeaders{Forms: 1 << 7}
	if err := up.Validate(); err == nil {
		t.Fatal("an unknown form validated")
	}
}

// TestStatedLimitVoidsSlotsBookedBefore: requests booked at the
// documented 20/s before the first answer stated 10/s are booked again at
// 10/s: after that answer, no two requests reach the upstream closer than
// 100 ms (the answer takes 10 ms, while the others book).
func TestStatedLimitVoidsSlotsBookedBefore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &stating{fields: func(int) map[string]string {
			return map[string]string{"RateLimit-Policy": `"p";q=10;w=1`, "RateLimit": `"p";r=10;t=1`}
		}}
		slow := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			time.Sleep(10 * time.Millisecond) // the answer comes after the others booked
			return inMemory(srv).RoundTrip(r)
		})
		tr, _ := setup(t, bookingCom(20), slow, transport.Options{})
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 3 {
					if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		got := srv.got()
		if len(got) != 24 {
			t.Fatalf("%d arrivals, want 24", len(got))
		}
		for i := 2; i < len(got); i++ {
			if gap := got[i].at.Sub(got[i-1].at); gap < 100*time.Millisecond {
				t.Errorf("arrival %d came %v after the one before, under the stated 100 ms", i, gap)
			}
		}
	})
}

// TestLimitedAnswerStatesTheLimit: an upstream that states its limit only
// on its 429s caps the rate from the first one on, beside the pause.
func TestLimitedAnswerStatesTheLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &stating{fields: func(n int) map[string]string {
			if n == 1 {
				return map[string]string{"RateLimit-Policy": `"p";q=5;w=1`}
			}
			return nil
		}}
		srv.script = []reply{{http.StatusTooManyRequests, "1"}}
		reg := prometheus.NewRegistry()
		tr, _ := setup(t, bookingCom(20), inMemory(srv), transport.Options{Registerer: reg, Backoff: fixedBackoff(0)})
		if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
			t.Fatal(err)
		}
		if got := gaugeOf(t, reg, transport.MetricEffectiveRate, nil); got != 5 {
			t.Errorf("effective rate after the 429 stating 5/s: %v, want 5", got)
		}
	})
}

// TestStatedLimitCountsRequests: the fields count requests, the bucket
// tokens; an endpoint whose request costs 2 tokens of 20/s (10 requests
// a second) stated at 5 requests a second is paced at 10 tokens a second.
func TestStatedLimitCountsRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &stating{fields: func(int) map[string]string { return map[string]string{"RateLimit-Policy": `"p";q=5;w=1`} }}
		reg := prometheus.NewRegistry()
		up := bookingCom(20)
		up.Endpoints[0].Limits[0].Burst, up.Endpoints[0].Cost = 2, 2
		tr, _ := setup(t, up, inMemory(srv), transport.Options{Registerer: reg})
		for range 2 {
			if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
				t.Fatal(err)
			}
		}
		if got := gaugeOf(t, reg, transport.MetricEffectiveRate, nil); got != 10 {
			t.Errorf("effective rate %v tokens/s, want 10", got)
		}
	})
}

// TestHoldWithinAnIntervalIsNotTaken: at 20/s, 19 remaining in the next
// second is one request less than the bucket grants, a hold of one
// interval (50 ms): the requests in flight make that common, and it is
// not taken; 18 remaining is.
func TestHoldWithinAnIntervalIsNotTaken(t *testing.T) {
	for _, c := range []struct {
		remaining string
		holds     float64
	}{{"19", 0}, {"18", 1}} {
		t.Run(c.remaining, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &stating{fields: func(int) map[string]string {
					return map[string]string{"X-RateLimit-Remaining": c.remaining, "X-RateLimit-Reset": "1"}
				}}
				reg := prometheus.NewRegistry()
				tr, _ := setup(t, bookingCom(20), inMemory(srv), transport.Options{Registerer: reg})
				if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
					t.Fatal(err)
				}
				if n := metricValue(t, reg, transport.MetricHeaderHolds, nil); n != c.holds {
					t.Errorf("%s = %v, want %v", transport.MetricHeaderHolds, n, c.holds)
				}
			})
		})
	}
}
