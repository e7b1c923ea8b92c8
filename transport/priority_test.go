package transport_test

import (
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport"
)

// TestPriorityBulkDoesNotStarveConfirmations: a bulk push saturates an
// endpoint's bucket at the "bulk" class (named on its requests' context),
// while booking confirmations (the top class) arrive now and then on the
// same bucket. The bulk class keeps a reserve of the bucket and books at
// most its horizon ahead, so a confirmation waits at most that
// horizon; without classes it queues behind the whole bulk backlog (up to
// the max wait). The upstream never sees more than the bucket's rate
// either way.
func TestPriorityBulkDoesNotStarveConfirmations(t *testing.T) {
	for _, tc := range []struct {
		name     string
		classes  bool
		maxWait  time.Duration // the longest a confirmation may wait
		minWaitd time.Duration // ... and the longest one must have waited, without classes
	}{
		{name: "with classes", classes: true, maxWait: 200 * time.Millisecond}, // the bulk horizon
		{name: "without classes", classes: false, minWaitd: time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				up := transport.Upstream{
					Channel:   "booking_com",
					Endpoints: []transport.Endpoint{{Name: "hotel", Pattern: "/hotel/", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 2)}}},
				}
				bulkCtx := t.Context()
				if tc.classes {
					up.Priorities = []fleetrate.Priority{{Name: "bulk", Reserve: 1, Horizon: 200 * time.Millisecond}}
					bulkCtx = fleetrate.WithPriority(bulkCtx, "bulk")
				}
				srv := &upstream{}
				tr, _ := setup(t, up, inMemory(srv), transport.Options{})
				start := time.Now()
				until := start.Add(3 * time.Second)
				var wg sync.WaitGroup
				for range 30 { // the bulk push: 3 s of backlog
					wg.Go(func() {
						for time.Now().Before(until) {
							_, err := get(t, bulkCtx, tr, "/hotel/availability")
							var bp *fleetrate.BackpressureError
							if errors.As(err, &bp) {
								time.Sleep(50 * time.Millisecond)
								continue
							}
							if err != nil {
								t.Error(err)
								return
							}
						}
					})
				}
				var worst time.Duration
				wg.Go(func() {
					for i := range 5 {
						time.Sleep(time.Until(start.Add(time.Duration(i)*500*time.Millisecond + 300*time.Millisecond)))
						t0 := time.Now()
						if _, err := get(t, t.Context(), tr, "/hotel/reservations"); err != nil {
							t.Error(err)
							return
						}
						worst = max(worst, time.Since(t0))
					}
				})
				wg.Wait()
				got := srv.got()
				bulk := 0
				for i, a := range got {
					// Burst 2 at 10/s: any three requests span 100 ms.
					if i >= 2 && a.at.Sub(got[i-2].at) < 100*time.Millisecond {
						t.Fatalf("three requests within %v: the bucket's 10/s burst 2 was broken", a.at.Sub(got[i-2].at))
					}
					if a.path == "/hotel/availability" {
						bulk++
					}
				}
				t.Logf("worst confirmation wait %v; bulk sent %d", worst, bulk)
				if tc.maxWait > 0 && worst > tc.maxWait {
					t.Errorf("a confirmation waited %v behind the bulk push, want <= %v", worst, tc.maxWait)
				}
				if tc.minWaitd > 0 && worst < tc.minWaitd {
					t.Errorf("without classes the worst confirmation waited only %v; the test does not saturate the credential", worst)
				}
				// The bulk class still uses what the confirmations leave:
				// 3 s at 10/s, less 5 confirmations and the reserve.
				if bulk < 20 {
					t.Errorf("the bulk push sent %d requests in 3 s, want >= 20", bulk)
				}
			})
		})
	}
}

func TestUpstreamPriorityMustBeDeclared(t *testing.T) {
	up := bookingCom(10)
	up.Endpoints[0].Priority = "bulk"
	err := up.Validate()
	if !errors.Is(err, fleetrate.ErrInvalid) || err == nil {
		t.Fatalf("an endpoint naming an undeclared class: got %v, want ErrInvalid", err)
	}
}
