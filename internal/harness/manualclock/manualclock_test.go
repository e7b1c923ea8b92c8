package manualclock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/harness/manualclock"
)

func TestClockMovesOnlyWhenTold(t *testing.T) {
	start := time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)
	c := manualclock.New(start)
	for range 3 {
		if !c.Now().Equal(start) {
			t.Fatalf("Now = %v, want %v until advanced", c.Now(), start)
		}
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				c.Advance(time.Microsecond)
				_ = c.Now()
			}
		})
	}
	wg.Wait()
	if got, want := c.Now().Sub(start), 8*time.Millisecond; got != want {
		t.Fatalf("advanced %v, want %v", got, want)
	}
	c.Advance(-time.Second)
	if got := c.Now().Sub(start); got != 8*time.Millisecond-time.Second {
		t.Fatalf("after going back a second: %v", got)
	}
}
