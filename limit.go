package fleetrate

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Bounds that keep every quantity the stores handle an exact integer, both
// in Go's int64 and in the float64 numbers of Redis's Lua interpreter.
// All debts are nanoseconds. A double holds every integer below 2^53 (ns:
// about 104 days) and every multiple of 8, so every whole number of
// microseconds, below 2^56 (about 833 days). A limit whose fill time is
// at most CoarseFillTime keeps every debt below 2^53: its fill time plus
// the longest wait or drain and an anchor's age (gcra.MaxAnchorAge) is
// under 104 days. A limit of a longer fill time, up to MaxFillTime, has an
// interval of whole microseconds, and the stores round each of its debts
// up to whole microseconds where a sum could leave them (see gcra), so
// they stay exact below 2^56: MaxFillTime plus the longest wait and an
// anchor's age is 768 days.
const (
	// MaxRate is the highest refill rate: one token per nanosecond.
	MaxRate = 1e9
	// MaxBurst is the largest capacity of one limit.
	MaxBurst = 1 << 40
	// MaxFillTime is the longest time a limit may take to refill from
	// empty to full (Burst / Rate): two years of 365 days and a leap day,
	// so that envoyproxy/ratelimit's "unit: year" (365 days) loads, and a
	// limit per two years too.
	MaxFillTime = 731 * 24 * time.Hour
	// CoarseFillTime is the longest fill time of a limit whose interval
	// is a whole number of nanoseconds; beyond it, up to MaxFillTime, the
	// interval is rounded up to whole microseconds (see Limit.Interval),
	// a change of at most one part in 60 million for such a limit's rate
	// (an interval of 1 day per token, 365/year, is already whole).
	CoarseFillTime = 60 * 24 * time.Hour
	// MaxWaitCap bounds every max wait and every drain duration.
	MaxWaitCap = 30 * 24 * time.Hour
)

// Limit is one token-bucket limit: a capacity of Burst tokens that refills
// at Rate tokens per second. A bucket may carry several limits at once (for
// example 20/s with burst 40 and 1000/min); a take succeeds only when every
// one of them allows it.
//
// Internally the rate becomes an emission interval of whole nanoseconds,
// rounded up, so a limit never grants more than Rate per second: 3/s
// becomes one token every 333,333,334 ns, 1e6/s exactly one every 1 µs.
type Limit struct {
	// Name labels the limit in results, headers and metrics, e.g. "second".
	// It is optional.
	Name string
	// Rate is the refill rate in tokens per second. It must be positive,
	// finite and at most MaxRate.
	Rate float64
	// Burst is the capacity: the most tokens the bucket can hold and so the
	// largest burst it admits. It must be at least 1.
	Burst int64

	// iv caches Interval on the validated copies a Limiter keeps, for the
	// Rate and Burst it was computed from: a copy whose Rate or Burst was
	// changed afterwards no longer matches and is computed and validated
	// afresh. A Limit a caller sees never carries it.
	iv      int64
	ivRate  float64
	ivBurst int64
}

// compiled returns a copy of l, already validated, that caches its
// interval.
func (l Limit) compiled() Limit {
	l.iv, l.ivRate, l.ivBurst = l.Interval(), l.Rate, l.Burst
	return l
}

// cached reports whether l carries an interval cached for its own Rate and
// Burst.
func (l *Limit) cached() bool {
	return l.iv > 0 && l.ivRate == l.Rate && l.ivBurst == l.Burst
}

// plain returns l without its cache, as callers see limits.
func (l Limit) plain() Limit {
	return Limit{Name: l.Name, Rate: l.Rate, Burst: l.Burst}
}

// strip drops l's cache in place.
func (l *Limit) strip() {
	l.iv, l.ivRate, l.ivBurst = 0, 0, 0
}

// compileLimits copies limits with their intervals cached.
func compileLimits(limits []Limit) []Limit {
	out := make([]Limit, len(limits))
	for i, l := range limits {
		out[i] = l.compiled()
	}
	return out
}

// PerSecond returns a limit of rate tokens per second with the given burst.
func PerSecond(rate float64, burst int64) Limit {
	return Limit{Rate: rate, Burst: burst}
}

// Every returns a limit that refills one token every interval, with the
// given burst. Every(time.Hour, 1) is one token per hour.
func Every(interval time.Duration, burst int64) Limit {
	if interval <= 0 {
		return Limit{Rate: math.Inf(1), Burst: burst}
	}
	return Limit{Rate: float64(time.Second) / float64(interval), Burst: burst}
}

// PerPeriod returns a limit of count tokens per period, with burst count:
// the token-bucket reading of "count requests per period".
func PerPeriod(count int64, period time.Duration) Limit {
	if count <= 0 || period <= 0 {
		return Limit{Rate: math.NaN(), Burst: count}
	}
	return Limit{Rate: float64(count) * float64(time.Second) / float64(period), Burst: count}
}

// Named returns a copy of l with its Name set.
func (l Limit) Named(name string) Limit {
	l.Name = name
	return l
}

// String formats the limit as "20/s burst 40".
func (l Limit) String() string {
	// Six significant digits: a rate of 100 a minute reads 1.66667/s,
	// not 1.6666666666666667/s.
	s := fmt.Sprintf("%.6g/s burst %d", l.Rate, l.Burst)
	if l.Name != "" {
		s = l.Name + " " + s
	}
	return s
}

// Validate reports whether the limit can be enforced exactly. The error
// names the offending field and value.
func (l Limit) Validate() error {
	if l.cached() {
		return nil // a Limiter's copy, validated when it was made
	}
	return l.validate()
}

// validate is Validate without the shortcut for a Limiter's copies, kept
// apart so that Validate inlines.
func (l Limit) validate() error {
	switch {
	case math.IsNaN(l.Rate):
		return errors.New("rate must be positive and finite, got NaN (PerPeriod gives NaN for a count or period that is not positive)")
	case math.IsInf(l.Rate, 1):
		return errors.New("rate must be positive and finite, got +Inf (Every gives +Inf for an interval that is not positive)")
	case math.IsInf(l.Rate, 0) || l.Rate <= 0:
		return fmt.Errorf("rate must be positive and finite, got %v", l.Rate)
	case l.Rate > MaxRate:
		return fmt.Errorf("rate must be at most %g tokens/s, got %g", float64(MaxRate), l.Rate)
	case l.Burst < 1:
		return fmt.Errorf("burst must be at least 1, got %d", l.Burst)
	case l.Burst > MaxBurst:
		return fmt.Errorf("burst must be at most %d, got %d", int64(MaxBurst), l.Burst)
	}
	// Compare in floats first: a tiny rate's interval overflows int64.
	if float64(l.Burst)/l.Rate > MaxFillTime.Seconds() || l.Interval() > int64(MaxFillTime)/l.Burst {
		return fmt.Errorf("burst/rate (time to fill) must be at most %v, got burst %d at %g/s", MaxFillTime, l.Burst, l.Rate)
	}
	return nil
}

// Interval returns the emission interval in nanoseconds: the time one token
// takes to refill, rounded up to a whole nanosecond. The rate must be valid.
func (l Limit) Interval() int64 {
	if l.cached() {
		return l.iv
	}
	iv := float64(time.Second) / l.Rate
	if !(iv < math.MaxInt64/2) { // also NaN: an invalid rate
		return math.MaxInt64 / 2
	}
	f := math.Floor(iv)
	// Round up unless the whole number of nanoseconds already grants no
	// faster than Rate: 1e9/(100/60) = 600000000.0000001 stays 600000000,
	// 3/s becomes 333333334, and the limit never grants faster than Rate.
	if f < 1 || float64(time.Second)/f > l.Rate {
		f++
	}
	n := max(int64(f), 1)
	if l.Coarse() {
		n = (n + 999) / 1000 * 1000 // whole µs: see CoarseFillTime
	}
	return n
}

// Coarse reports whether the limit's fill time exceeds CoarseFillTime:
// its interval, and the debts the stores keep for it, are then whole
// microseconds. The rate must be valid.
func (l Limit) Coarse() bool {
	return float64(l.Burst)/l.Rate > CoarseFillTime.Seconds()
}

// FillTime returns the time this limit takes to refill from empty to full.
func (l Limit) FillTime() time.Duration {
	return time.Duration(l.Interval() * l.Burst)
}

// validateLimits checks a list of limits, naming the failing field with the
// given prefix (such as "limits").
func validateLimits(field string, limits []Limit) error {
	if len(limits) == 0 {
		return fmt.Errorf("%s: at least one limit is required", field)
	}
	for i, l := range limits {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("%s[%d]: %w", field, i, err)
		}
	}
	return nil
}
