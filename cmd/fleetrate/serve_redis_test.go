package main

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

// TestServeStoreTimeoutReachesBatchedCalls checks that --store-timeout
// bounds store calls in every mode: with batching on, and off, a take
// made while Redis is paused for 300 ms (far above redisstore's 50 ms
// default, far below the 5 s given) waits for Redis and succeeds instead
// of failing after 50 ms.
func TestServeStoreTimeoutReachesBatchedCalls(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	for _, batch := range []bool{true, false} {
		st, err := openServeRedis(context.Background(), rs.URL(), redisTLSFiles{}, batch, 5*time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.close() })
		if err := rs.Client().Do(context.Background(), "CLIENT", "PAUSE", "300", "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_, errs[i] = st.store.Take(ctx, fleetrate.Request{N: 1, Buckets: []fleetrate.Bucket{{
					Key: "timeout-test", Limits: []fleetrate.Limit{{Rate: 100, Burst: 100}},
				}}})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("batch %v: take %d while Redis was paused 300 ms with a 5 s store timeout: %v", batch, i, err)
			}
		}
	}
}
