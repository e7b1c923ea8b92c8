package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/fleetrate/fleetrate"
)

// sameTake reports whether two calls are identical takes, which the batch
// sends as one take with a count: a hot bucket then costs the script one
// take, however many callers share it.
func sameTake(a, b *batchCall) bool {
	if !sameShape(a, b) {
		return false
	}
	for i := range a.req.Buckets {
		if x, y := &a.req.Buckets[i], &b.req.Buckets[i]; x.Prefix != y.Prefix || x.Key != y.Key {
			return false
		}
	}
	return true
}

// encodeBatch returns the keys and arguments of a batch call for runs of
// identical takes (see take_batch.lua). Takes of one shape (the same
// number of keys, n, wait, count and limits: those of one limiter, mostly)
// share the shape's arguments.
func encodeBatch(runs [][]*batchCall) (keys []string, args []any) {
	var shapes []*batchCall
	var counts []int // the count of each shape's takes
	shapeOf := make([]int, len(runs))
	nkeys, nargs := 0, 1+len(runs)
	for i, run := range runs {
		nkeys += len(run[0].req.Buckets)
		shapeOf[i] = -1
		for j := len(shapes) - 1; j >= max(len(shapes)-maxShapeScan, 0); j-- {
			if counts[j] == len(run) && sameShape(shapes[j], run[0]) {
				shapeOf[i] = j
				break
			}
		}
		if shapeOf[i] < 0 {
			shapeOf[i] = len(shapes)
			shapes = append(shapes, run[0])
			counts = append(counts, len(run))
			nargs += 4
			for _, bk := range run[0].req.Buckets {
				nargs += 2 + 2*len(bk.Limits)
			}
		}
	}
	keys = make([]string, 0, nkeys)
	args = make([]any, 1, nargs)
	args[0] = len(shapes)
	for j, c := range shapes {
		args = append(args, len(c.req.Buckets), c.req.N, int64(c.req.MaxWait), counts[j])
		if c.largs != nil {
			args = append(args, c.largs...)
		} else {
			args = appendTakeLimits(args, c.req.Buckets)
		}
	}
	for i, run := range runs {
		keys = append(keys, run[0].storeKeys()...)
		args = append(args, shapeOf[i]+1)
	}
	return keys, args
}

// decisions recycles the scratch space in which batch replies are replayed.
var decisions = sync.Pool{New: func() any { return new([]fleetrate.Result) }}

// decide replays the reply of a batch call of runs (n takes in all) and
// writes each take's decision into its call: a run's takes get its
// decisions in order, the last (a denial) standing for the takes after it.
func decide(reply []int64, runs [][]*batchCall, n int) error {
	buf := decisions.Get().(*[]fleetrate.Result)
	defer decisions.Put(buf)
	if cap(*buf) < n {
		*buf = make([]fleetrate.Result, n)
	}
	all := (*buf)[:n]
	defer clear(all)
	decided := make([][]fleetrate.Result, len(runs))
	off := 0
	for i, run := range runs {
		decided[i] = all[off : off : off+len(run)] // replay fills it in place
		off += len(run)
	}
	err := decodeReply(reply, len(runs), func(i int) (fleetrate.Request, int, *[]fleetrate.Result, func(int) *fleetrate.Booking) {
		run := runs[i]
		return run[0].req, len(run), &decided[i], func(j int) *fleetrate.Booking { return &run[j].booking }
	})
	if err != nil {
		return err
	}
	for i, run := range runs {
		rs := decided[i]
		for j, c := range run {
			c.res = rs[min(j, len(rs)-1)]
		}
	}
	return nil
}

// sameShape reports whether takes s and c have one shape but for their
// counts: the same number of keys, n, wait, limits and reserves.
func sameShape(s, c *batchCall) bool {
	if s.req.N != c.req.N || s.req.MaxWait != c.req.MaxWait || len(s.req.Buckets) != len(c.req.Buckets) {
		return false
	}
	if len(s.largs) > 0 && len(c.largs) > 0 && &s.largs[0] == &c.largs[0] {
		return true // one bound limiter's
	}
	return sameLimits(s.req, c.req)
}

// sharedCall bounds a call shared by calls: by the store's timeout, or
// for a store without one (a negative Timeout) by DefaultTimeout or, if
// later, the latest deadline of the calls' callers, so that the call lives
// as long as its most patient caller may wait, and no longer.
func (s *Store) sharedCall(calls []*batchCall) *callCtx {
	d := s.timeout
	if d < 0 {
		now := time.Now()
		last := now.Add(DefaultTimeout)
		for _, c := range calls {
			if c.deadline.After(last) {
				last = c.deadline
			}
		}
		d = last.Sub(now)
	}
	return boundCall(context.Background(), d)
}

// send runs one batch call and hands each caller its decision.
func (s *Store) send(batch []*batchCall) {
	// Calls whose callers gave up while queued are dropped; the rest are
	// marked sent. Runs of identical takes become one take each, counted.
	kept := batch[:0]
	for _, c := range batch {
		if c.state.send() {
			kept = append(kept, c)
		} // else dropped: never sent, nothing booked
	}
	if len(kept) == 0 {
		return
	}
	var runs [][]*batchCall
	for i, start := 1, 0; i <= len(kept); i++ {
		if i == len(kept) || !sameTake(kept[i-1], kept[i]) {
			runs = append(runs, kept[start:i:i])
			start = i
		}
	}
	keys, args := encodeBatch(runs)
	// The call belongs to no single caller, so it has the store's own
	// bound rather than any caller's context: a caller that gives up
	// sooner is refunded what the call grants it (see below), which needs
	// the reply.
	call := s.sharedCall(kept)
	var reply []int64
	err := s.bounded(call, func(ctx context.Context) (err error) {
		reply, err = s.eval(ctx, batchScript, keys, args...).Int64Slice()
		return err
	})
	call.release()
	if err != nil {
		// reply is not read: an abandoned call may still be writing it.
		err = unavailable("take", err)
	} else {
		err = decide(reply, runs, len(kept))
	}
	var gaveUp []*batchCall // abandoned calls that were granted: never recycled
	for _, run := range runs {
		for _, c := range run {
			if err != nil {
				c.err = err
			}
			if c.state.deliver() {
				c.done <- struct{}{} // from here on c belongs to its caller
			} else if c.err == nil && c.res.Allowed && c.req.N > 0 {
				gaveUp = append(gaveUp, c) // its caller gave up: give its booking back
			}
		}
	}
	if len(gaveUp) > 0 {
		// In the background, so that a slow Redis (when callers give up)
		// does not hold the queue behind the cancels.
		go s.cancelAbandoned(gaveUp)
	}
}
