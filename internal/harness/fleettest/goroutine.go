package fleettest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/fleetrate/fleetrate"
)

// goroutine is one caller of a worker process.
type goroutine struct {
	o         Options
	lims      [2]*fleetrate.Limiter
	changeAt  time.Time
	useAllow  bool
	top       bool // makes the top-class requests of Options.TopRate
	rng       *rand.Rand
	grants    []Grant
	cancelled int
	errs      []string
}

// call is one take of a goroutine: the limiter of its phase, the buckets,
// the endpoint (-1 for none) and the tokens.
type call struct {
	lim   *fleetrate.Limiter
	phase int
	names []string
	ep    int
	n     int64
}

// step makes one take and records what the caller did with it. It
// reports false when the goroutine must stop.
func (w *goroutine) step() bool {
	c := w.next()
	ctx := context.Background()
	if w.o.Bulk.Name != "" {
		ctx = fleetrate.WithPriority(ctx, w.o.Bulk.Name)
	}
	if w.useAllow {
		return w.allow(ctx, c)
	}
	cancelled := w.o.CancelFrac > 0 && w.rng.Float64() < w.o.CancelFrac
	if cancelled && w.rng.IntN(2) == 0 {
		return w.reserveAndCancel(ctx, c)
	}
	return w.wait(ctx, c, cancelled)
}

// next draws the next take: its phase from the clock, an endpoint and a
// cost from the options.
func (w *goroutine) next() call {
	c := call{phase: 0, names: []string{w.o.Key}, ep: -1, n: 1}
	if w.o.ChangeTo.Rate != 0 && !time.Now().Before(w.changeAt) {
		c.phase = 1
	}
	c.lim = w.lims[c.phase]
	if w.o.Endpoints > 0 {
		c.ep = w.rng.IntN(w.o.Endpoints)
		c.names = []string{endpoint(w.o.Key, c.ep), w.o.Key}
	}
	if w.o.MaxCost > 1 {
		c.n = 1 + w.rng.Int64N(w.o.MaxCost)
	}
	return c
}

// allow makes c with Allow, sleeping for the retry-after when denied.
func (w *goroutine) allow(ctx context.Context, c call) bool {
	res, err := c.lim.AllowN(ctx, c.n, c.names...)
	if err != nil {
		return w.fail(err)
	}
	if !res.Allowed {
		time.Sleep(res.RetryAfter)
		return true
	}
	slot := res.At.UnixNano()
	w.grants = append(w.grants, Grant{Slot: slot, Act: time.Now().UnixNano(), Booked: slot, N: c.n, Endpoint: c.ep, Phase: c.phase})
	return true
}

// reserveAndCancel makes c as a reservation given back before its slot.
func (w *goroutine) reserveAndCancel(ctx context.Context, c call) bool {
	r, err := c.lim.ReserveN(ctx, c.n, c.names...)
	if err != nil {
		return w.tolerate(err)
	}
	if d := r.Delay(); d > 0 {
		time.Sleep(time.Duration(w.rng.Int64N(int64(d))))
	}
	if err := r.Cancel(ctx); err != nil {
		return w.fail(err)
	}
	w.cancelled++
	return true
}

// wait makes c with Wait: when cancelled, a WaitN whose context ends while
// it is queued; with Options.Deadlines, under a random deadline that the
// booked slot must not pass.
func (w *goroutine) wait(ctx context.Context, c call, cancelled bool) bool {
	var stop context.CancelFunc = func() {}
	switch {
	case cancelled:
		ctx, stop = context.WithCancel(ctx)
		d := time.Duration(w.rng.Int64N(int64(c.lim.MaxWait())))
		t := time.AfterFunc(d, stop)
		defer t.Stop()
	case w.o.Deadlines:
		d := time.Duration(w.rng.Int64N(2 * int64(c.lim.MaxWait())))
		ctx, stop = context.WithTimeout(ctx, d)
	}
	defer stop()
	res, err := c.lim.WaitN(ctx, c.n, c.names...)
	act := time.Now().UnixNano()
	if err != nil {
		if cancelled && errors.Is(err, context.Canceled) {
			w.cancelled++
			return true
		}
		return w.tolerate(err)
	}
	slot := res.At.UnixNano() + int64(res.Wait)
	// The slot is on Redis's clock, the deadline on this process's: one
	// machine, one clock, but Result.At is whole microseconds.
	if dl, ok := ctx.Deadline(); ok && slot > dl.UnixNano()+int64(time.Microsecond) {
		w.errs = append(w.errs, fmt.Sprintf("WaitN booked a slot %v after its context's deadline", time.Duration(slot-dl.UnixNano())))
	}
	w.grants = append(w.grants, Grant{Slot: slot, Act: act, Booked: res.At.UnixNano(), N: c.n, Wait: true, Endpoint: c.ep, Phase: c.phase})
	return true
}

// topStep waits for the next top-class request of this process (Poisson
// arrivals at TopRate/Processes a second), makes it with Wait, and records
// when it was asked and when it acted.
func (w *goroutine) topStep(deadline time.Time) bool {
	gap := time.Duration(w.rng.ExpFloat64() / (w.o.TopRate / float64(w.o.Processes)) * float64(time.Second))
	if time.Now().Add(gap).After(deadline) {
		time.Sleep(time.Until(deadline))
		return false
	}
	time.Sleep(gap)
	asked := time.Now().UnixNano()
	res, err := w.lims[0].WaitN(context.Background(), 1, w.o.Key)
	act := time.Now().UnixNano()
	if err != nil {
		return w.tolerate(err)
	}
	slot := res.At.UnixNano() + int64(res.Wait)
	w.grants = append(w.grants, Grant{Slot: slot, Act: act, Booked: res.At.UnixNano(), N: 1, Wait: true, Endpoint: -1, Top: true, Asked: asked})
	return true
}

// tolerate accepts what a caller of a saturated fleet meets (backpressure,
// its own deadline or cancel) and records anything else.
func (w *goroutine) tolerate(err error) bool {
	if errors.Is(err, fleetrate.ErrBackpressure) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		if errors.Is(err, fleetrate.ErrStoreUnavailable) {
			return w.fail(err) // a context error must not be an outage
		}
		return true
	}
	return w.fail(err)
}

func (w *goroutine) fail(err error) bool {
	w.errs = append(w.errs, err.Error())
	return false
}
