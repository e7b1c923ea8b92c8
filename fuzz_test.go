package fleetrate

import (
	"math"
	"testing"
)

// FuzzLimitValidate checks that any rate and burst either fail validation
// with an error or give an exact, bounded interval.
func FuzzLimitValidate(f *testing.F) {
	for _, c := range []struct {
		rate  float64
		burst int64
	}{{1, 1}, {0, 1}, {math.NaN(), 1}, {math.Inf(1), 1}, {1e9, 1}, {1e-7, 1}, {3, 1 << 40}, {1.0 / 3600, 24}} {
		f.Add(c.rate, c.burst)
	}
	f.Fuzz(func(t *testing.T, rate float64, burst int64) {
		l := Limit{Rate: rate, Burst: burst}
		if l.Validate() != nil {
			return
		}
		iv := l.Interval()
		if iv < 1 || float64(iv) < 1e9/rate*(1-1e-12) {
			t.Fatalf("%v: interval %d ns grants faster than the rate", l, iv)
		}
		if l.FillTime() > MaxFillTime {
			t.Fatalf("%v: fill time %v beyond %v", l, l.FillTime(), MaxFillTime)
		}
	})
}
