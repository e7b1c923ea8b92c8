package transport_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/cli/mockota"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

// fleetUpstream paces the mock OTA's documented limits at share of each,
// burst 1: the strictest reading, as the mock enforces a sliding window.
func fleetUpstream(ota mockota.Config, share float64) transport.Upstream {
	up := transport.Upstream{Channel: "booking_com"}
	if ota.Credential > 0 {
		up.Credential = []fleetrate.Limit{fleetrate.PerSecond(share*float64(ota.Credential), 1)}
	}
	for _, e := range ota.Endpoints {
		up.Endpoints = append(up.Endpoints, transport.Endpoint{
			Name:    e.Name,
			Pattern: e.Pattern,
			Limits:  []fleetrate.Limit{fleetrate.PerSecond(share*float64(e.Limit), 1)},
		})
	}
	return up
}

// workload is the request a worker makes on its i-th turn: availability,
// reservations and rates in the ratio 4:2:1 of their documented limits.
func workload(worker, i int) (method, path string) {
	hotel := (worker*7 + i) % 10
	switch (worker + i) % 7 {
	case 0, 2, 4, 6:
		return http.MethodPost, fmt.Sprintf("http://ota.test/v1/hotels/%d/availability", hotel)
	case 1, 5:
		return http.MethodGet, fmt.Sprintf("http://ota.test/v1/hotels/%d/reservations", hotel)
	default:
		return http.MethodPost, fmt.Sprintf("http://ota.test/v1/hotels/%d/rates", hotel)
	}
}

// TestFleetAgainstMockOTA runs 6 workers for 10 s against the mock OTA
// twice. With buckets shared at 95 % of the documented limits, the OTA
// never answers 429 for a documented limit; with a 10/s bucket per worker
// (the naive fleet) it answers many.
func TestFleetAgainstMockOTA(t *testing.T) {
	const workers, run = 6, 10 * time.Second
	cfg := mockota.Demo()

	t.Run("shared buckets", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ota, err := mockota.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			up := fleetUpstream(cfg, 0.95)
			classify, err := up.Classifier()
			if err != nil {
				t.Fatal(err)
			}
			store := memstore.New(memstore.Options{}) // the one thing the fleet shares
			var wg sync.WaitGroup
			var mu sync.Mutex
			refused := 0
			start := time.Now()
			for w := range workers {
				// Each worker builds its own limiter and transport, as
				// separate processes would.
				lim, err := fleetrate.New(store, fleetrate.Config{Buckets: up.Buckets()})
				if err != nil {
					t.Fatal(err)
				}
				tr, err := transport.New(lim, classify, transport.Options{Base: inMemory(ota), Logger: quiet})
				if err != nil {
					t.Fatal(err)
				}
				wg.Go(func() {
					for i := 0; time.Since(start) < run; i++ {
						method, url := workload(w, i)
						req, _ := http.NewRequest(method, url, nil)
						resp, err := tr.RoundTrip(req)
						switch {
						case errors.Is(err, fleetrate.ErrBackpressure), errors.Is(err, transport.ErrGaveUp):
							mu.Lock()
							refused++
							mu.Unlock()
						case err != nil:
							t.Errorf("worker %d: %v", w, err)
							return
						default:
							resp.Body.Close()
						}
					}
				})
			}
			wg.Wait()
			total := 0
			for name, s := range ota.Stats() {
				t.Logf("%-12s %+v", name, s)
				if s.Documented != 0 {
					t.Errorf("%s: %d 429s from documented limits with shared buckets, want 0", name, s.Documented)
				}
				total += s.Accepted
			}
			// The credential, paced at 28.5/s, binds: the fleet should use
			// most of it (multi-bucket takes do not book far ahead).
			if total < 220 {
				t.Errorf("only %d requests accepted in %v, want >= 220 of the credential's 285", total, run)
			}
			t.Logf("refused locally (backpressure or gave up): %d", refused)
		})
	})

	t.Run("naive per-worker buckets", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ota, err := mockota.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			base := inMemory(ota)
			var wg sync.WaitGroup
			start := time.Now()
			for w := range workers {
				// Each worker has its own 10/s bucket and knows nothing of
				// its peers.
				lim, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 1)}})
				if err != nil {
					t.Fatal(err)
				}
				wg.Go(func() {
					for i := 0; time.Since(start) < run; i++ {
						if _, err := lim.Wait(context.Background(), "local"); err != nil {
							t.Errorf("worker %d: %v", w, err)
							return
						}
						method, url := workload(w, i)
						req, _ := http.NewRequest(method, url, nil)
						resp, err := base.RoundTrip(req)
						if err != nil {
							t.Errorf("worker %d: %v", w, err)
							return
						}
						resp.Body.Close()
					}
				})
			}
			wg.Wait()
			documented := 0
			for name, s := range ota.Stats() {
				t.Logf("%-12s %+v", name, s)
				documented += s.Documented
			}
			if documented < 100 {
				t.Errorf("naive fleet: %d 429s from documented limits, want many (>= 100)", documented)
			}
		})
	})
}
