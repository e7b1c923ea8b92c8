package transport

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/hold"
	"github.com/fleetrate/fleetrate/transport/internal/ratecontrol"
)

// Defaults of Adaptive.
const (
	// DefaultDecrease multiplies a bucket's effective rate on each 429.
	DefaultDecrease = 0.85
	// DefaultRecovery is how long the effective rate takes to climb back
	// to the rate that drew the last 429 (see Adaptive).
	DefaultRecovery = 90 * time.Second
	// DefaultFloor is the lowest effective rate, as a fraction of the
	// documented rate.
	DefaultFloor = 0.05
)

// ErrPersistentLimit marks a rate limit answered while the bucket's
// effective rate was already at its floor: lowering the pace does not
// clear it, so it needs an operator (a smaller quota, a blocked
// credential). A *GaveUpError at the floor wraps it; the event
// rate_limit_persistent and MetricPersistent count every such answer.
var ErrPersistentLimit = errors.New("transport: still rate limited at the floor rate")

// Adaptive tunes the fleet-wide adaptive pacing. Every 429 (or 503 with
// Retry-After) lowers a bucket's effective rate multiplicatively, and time
// without one raises it back toward the documented rate, never above it.
// The climb is CUBIC's (RFC 9438, as TCP finds a path's capacity): from
// Decrease × w, where w is the rate that drew the 429, the rate rises fast
// at first, flattens as it nears w over Recovery, where the limit was
// found, and then rises ever faster past it, probing for more, up to the
// documented rate. A fleet held back by a hidden limit so spends most of
// its time just under it, and probes it about once per Recovery. A 429
// that comes before the rate is back at w means the limit itself fell:
// the next w is set halfway between the new rate and the old one
// (CUBIC's fast convergence). The climb starts when the 429's pause ends.
// A 429 a few requests after a resume keeps w at what the stretch before
// the pause proved of the limit from below (see ratecontrol.LimitRange): jitter on a
// strict window, or a limit that fell, which the next such 429 shows.
//
// The rate is kept in the shared store beside the bucket, so every process
// of the fleet paces at the same rate and learns from any one's 429.
type Adaptive struct {
	// Off turns adaptation off for every upstream of the transport; an
	// upstream turns it off for itself with Upstream.Fixed.
	Off bool
	// Decrease multiplies the effective rate on a 429, in (0, 1). The
	// default is DefaultDecrease (0.85).
	Decrease float64
	// Recovery is how long, after a 429's pause, the effective rate takes
	// to climb back to the rate that drew it; between 1 s and 10 minutes.
	// The default is DefaultRecovery (90 s).
	Recovery time.Duration
	// Floor is the lowest effective rate as a fraction of the documented
	// one, in (0, 1). The default is DefaultFloor (0.05).
	Floor float64
	// Refresh is how often a process reads the shared effective rate of a
	// bucket it paces (two peeks). It also reads it at once when told of a
	// change: by an announcement (see Announcer), or by a pause it did not
	// know of; the climb itself is a known curve, so Refresh only catches a
	// change it was not told of. The default is DefaultRateRefresh (30 s).
	Refresh time.Duration
}

// withDefaults fills the zero fields and checks the rest.
func (a Adaptive) withDefaults() (Adaptive, error) {
	if a.Decrease == 0 {
		a.Decrease = DefaultDecrease
	}
	if a.Recovery == 0 {
		a.Recovery = DefaultRecovery
	}
	if a.Floor == 0 {
		a.Floor = DefaultFloor
	}
	if a.Refresh == 0 {
		a.Refresh = DefaultRateRefresh
	}
	switch {
	case !(a.Decrease > 0 && a.Decrease < 1):
		return a, fmt.Errorf("%w: transport: adaptive decrease must be in (0, 1), got %v", fleetrate.ErrInvalid, a.Decrease)
	case a.Recovery < time.Second || a.Recovery > maxRecovery:
		return a, fmt.Errorf("%w: transport: adaptive recovery must be between 1s and %v, got %v", fleetrate.ErrInvalid, maxRecovery, a.Recovery)
	case !(a.Floor > 0 && a.Floor < 1):
		return a, fmt.Errorf("%w: transport: adaptive floor must be in (0, 1), got %v", fleetrate.ErrInvalid, a.Floor)
	case a.Refresh < 0:
		return a, fmt.Errorf("%w: transport: adaptive refresh must not be negative, got %v", fleetrate.ErrInvalid, a.Refresh)
	}
	return a, nil
}

// settings returns the rate controller's settings.
func (a Adaptive) settings() ratecontrol.Settings {
	return ratecontrol.Settings{Decrease: a.Decrease, Recovery: a.Recovery, Floor: a.Floor}
}

// DefaultRateRefresh is the default of Adaptive.Refresh.
const DefaultRateRefresh = 30 * time.Second

// maxRecovery keeps every climb within hold.ClimbSpan.
const maxRecovery = 10 * time.Minute

// EffectiveFactor reads from store the effective rate of bucket b (a
// transport's endpoint or credential bucket, as Limiter.Bucket returns it)
// as a fraction of its documented rate, under the adaptive settings a (its
// zero value means the defaults): what every transport pacing b reads, for
// a status page or a tool. It is 1 when no 429 has lowered the rate.
func EffectiveFactor(ctx context.Context, store fleetrate.Store, b fleetrate.Bucket, a Adaptive) (float64, error) {
	a, err := a.withDefaults()
	if err != nil {
		return 0, err
	}
	c, err := hold.ReadClimb(ctx, store, b, time.Now)
	if err != nil {
		return 0, err
	}
	return a.settings().Factor(c, time.Now()), nil
}

// SetEffectiveFactor makes f (a fraction of the documented rate, in
// [Floor, 1]) the effective rate of bucket b in store now, for every
// transport pacing b under the adaptive settings a (its zero value means
// the defaults): the climb back then starts from f, as after a 429 that
// found the limit at f / Decrease. It replaces what 429s recorded. It is
// for operators and tests; transports call nothing like it. Each process
// sees the new rate when it next reads the climb (within a.Refresh).
func SetEffectiveFactor(ctx context.Context, store fleetrate.Store, b fleetrate.Bucket, a Adaptive, f float64) error {
	a, err := a.withDefaults()
	if err != nil {
		return err
	}
	if !(f >= a.Floor && f <= 1) {
		return fmt.Errorf("%w: transport: effective factor must be between the floor %v and 1, got %v", fleetrate.ErrInvalid, a.Floor, f)
	}
	rm, pm := hold.RateMarkers(b)
	if err := store.Reset(ctx, rm.StoreKey(), pm.StoreKey()); err != nil {
		return err
	}
	if f == 1 {
		return nil
	}
	now := time.Now()
	return hold.WriteClimb(ctx, store, b, a.settings().At(f, now), now)
}
