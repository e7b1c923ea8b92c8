package transport_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

// TestInFlightBoundWithABindingRate: when both the rate and the in-flight
// bound bind (2 requests a second on the endpoint and its credential, 2 in
// flight, answers taking 1.5 s), four callers, within the default max wait (5 s), are all
// served, never more than 2 in flight, none refused.
func TestInFlightBoundWithABindingRate(t *testing.T) {
	for _, cred := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			up := &boundedUpstream{bound: 2, latency: func(int) time.Duration { return 1500 * time.Millisecond }}
			api := transport.Upstream{Channel: "llm", Endpoints: []transport.Endpoint{
				{Name: "chat", Pattern: "/chat", Limits: []fleetrate.Limit{fleetrate.PerSecond(2, 1)}, InFlight: 2}}}
			if cred {
				api.Credential = []fleetrate.Limit{fleetrate.PerSecond(2, 1)}
			}
			tr, _, _ := boundedSetup(t, memstore.New(memstore.Options{}), api, inMemory(up),
				fleetrate.Config{}, transport.Options{MaxAttempts: 1})
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					for range 3 {
						if resp, err := get(t, context.Background(), tr, "/chat"); err != nil || resp.StatusCode != http.StatusOK {
							t.Errorf("credential %v: %v", cred, err)
							return
						}
					}
				})
			}
			wg.Wait()
			if n, most, over := up.stats(); n != 12 || most > 2 || over != 0 {
				t.Errorf("credential %v: served %d, at most %d in flight, %d past; want 12, <= 2, 0", cred, n, most, over)
			}
		})
	}
}
