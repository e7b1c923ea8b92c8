package loadgen_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/cli/loadgen"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

func TestMeasureCountsCallsAndErrors(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	m := loadgen.Measure(context.Background(), 4, 50*time.Millisecond, func(_ context.Context, i int) error {
		if i%2 == 0 {
			return boom
		}
		return nil
	})
	if m.Calls < 2 || m.Ops <= 0 {
		t.Fatalf("got %+v, want calls made", m)
	}
	// Calls are numbered from 1 with no gaps, so half of them (rounded
	// down) are even.
	if m.Errors != m.Calls/2 || !errors.Is(m.FirstErr, boom) {
		t.Errorf("got %d errors of %d calls, first %v; want %d, boom", m.Errors, m.Calls, m.FirstErr, m.Calls/2)
	}
	if m.P50 > m.P99 {
		t.Errorf("p50 %v > p99 %v", m.P50, m.P99)
	}
}

func TestMeasureStopsWithContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	m := loadgen.Measure(ctx, 8, time.Hour, func(context.Context, int) error { return nil })
	if m.Calls != 0 {
		t.Errorf("made %d calls after the context ended", m.Calls)
	}
}

func TestCeilingWritesOnlyItsKeys(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	lim := []fleetrate.Limit{fleetrate.PerSecond(100, 1<<27)}
	v, err := loadgen.Ceiling(context.Background(), c, 100*time.Millisecond, 4, 8, lim, func(i int) string { return "ceil:" + strconv.Itoa(i%10) })
	if err != nil || v <= 0 {
		t.Fatalf("got %v, %v; want a positive rate", v, err)
	}
	keys, err := c.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 10 {
		t.Errorf("got keys %q, want ceil:0 to ceil:9", keys)
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, "ceil:") {
			t.Errorf("wrote key %q", k)
		}
	}
	if _, err := loadgen.Ceiling(context.Background(), c, time.Millisecond, 0, 8, lim, nil); err == nil || !strings.Contains(err.Error(), "clients") {
		t.Errorf("0 clients: got %v, want an error naming clients", err)
	}
}
