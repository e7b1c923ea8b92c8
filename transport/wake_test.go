package transport_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

// TestEarlyWakeNeverSendsBeforeTheSlot: on the real clock, requests of a
// burst-1 bucket (which wake shortly before their slots and wait out the
// rest without a timer) reach the upstream no sooner than their slots:
// the i-th no sooner than i intervals after the first was booked. Late is
// possible on a loaded machine; early never.
func TestEarlyWakeNeverSendsBeforeTheSlot(t *testing.T) {
	srv := &upstream{}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	const rate = 40.0
	toServer := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.URL.Host = strings.TrimPrefix(ts.URL, "http://")
		return http.DefaultTransport.RoundTrip(r)
	})
	tr, _ := setup(t, bookingCom(rate), toServer, transport.Options{})
	start := time.Now()
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for range 4 {
				resp, err := get(t, t.Context(), tr, "/availability")
				if err != nil {
					t.Error(err)
					return
				}
				_ = resp.Body.Close()
			}
		})
	}
	wg.Wait()
	interval := time.Duration(float64(time.Second) / rate)
	for i, a := range srv.got() {
		if earliest := start.Add(time.Duration(i) * interval); a.at.Before(earliest) {
			t.Errorf("request %d arrived %v before its slot could begin", i, earliest.Sub(a.at))
		}
	}
}

// bookings records when each take that books a request (n > 0) was made.
type bookings struct {
	fleetrate.Store
	mu sync.Mutex
	at []time.Time
}

func (b *bookings) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if req.N > 0 {
		b.mu.Lock()
		b.at = append(b.at, time.Now())
		b.mu.Unlock()
	}
	return b.Store.Take(ctx, req)
}

// TestRequestsBookBeforeAKnownPauseEnds: a request that waits out a pause
// its process knows of books before the pause ends, so that its answer
// comes before its slot (at the pause's end) rather than after: a fleet
// that woke and booked at the end at once would send its first request
// late and the next on its slot, too close to it for a strict window.
func TestRequestsBookBeforeAKnownPauseEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{script: []reply{{http.StatusTooManyRequests, "1"}}}
		store := &bookings{Store: memstore.New(memstore.Options{})}
		tr, _ := setupOn(t, store, bookingCom(10), inMemory(srv), transport.Options{MaxAttempts: 1})
		defer tr.Close()
		limited := time.Now()
		if resp, err := get(t, t.Context(), tr, "/availability"); err == nil {
			_ = resp.Body.Close()
		}
		end := limited.Add(time.Second)
		time.Sleep(100 * time.Millisecond) // well inside the pause
		resp, err := get(t, t.Context(), tr, "/availability")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		got := srv.got()
		if len(got) != 2 || got[1].at.Before(end) {
			t.Fatalf("arrivals %v; want the second after the pause's end %v", got, end)
		}
		store.mu.Lock()
		defer store.mu.Unlock()
		last := store.at[len(store.at)-1]
		if !last.Before(end) || last.Before(end.Add(-time.Second/2)) {
			t.Fatalf("the request after the pause booked %v before its end; want shortly before it", end.Sub(last))
		}
	})
}
