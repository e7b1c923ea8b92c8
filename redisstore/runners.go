package redisstore

import (
	"slices"
	"time"
)

// Runners: the goroutines that send a batcher's queued calls (run). A new
// goroutine for every run started on a small stack and grew it, copying it
// each time, down go-redis's call path: a tenth of the CPU of `fleetrate
// serve` on Redis at 16 callers went to growing stacks. A runner that
// finishes waits a while for the next run instead, and the runner idle
// last is the one reused, so that the few a light load needs keep warm,
// grown stacks.
const (
	// maxIdleRunners bounds the runners waiting for a run, per batcher.
	maxIdleRunners = 8
	// runnerIdle is how long a runner waits for a run before it ends.
	runnerIdle = time.Second
)

// runJob is one run: the queue q of route r.
type runJob[R comparable] struct {
	r R
	q *batchQueue
}

// startRun runs the queue q of route r on an idle runner, or on a new one.
func (b *batcher[R]) startRun(r R, q *batchQueue) {
	job := runJob[R]{r: r, q: q}
	b.idleMu.Lock()
	if n := len(b.idle); n > 0 {
		ch := b.idle[n-1]
		b.idle = b.idle[:n-1]
		b.idleMu.Unlock()
		ch <- job // never blocks: room for one, and the runner is off the list
		return
	}
	b.idleMu.Unlock()
	go b.runner(job)
}

// runner runs job, then the runs startRun hands it, until it has waited
// runnerIdle for one or maxIdleRunners others are waiting already.
func (b *batcher[R]) runner(job runJob[R]) {
	ch := make(chan runJob[R], 1)
	var t *time.Timer
	for {
		b.run(job.r, job.q)
		b.idleMu.Lock()
		if len(b.idle) >= maxIdleRunners {
			b.idleMu.Unlock()
			return
		}
		b.idle = append(b.idle, ch)
		b.idleMu.Unlock()
		if t == nil {
			t = time.NewTimer(runnerIdle)
		} else {
			t.Reset(runnerIdle) // a stopped or fired timer: no stale tick since Go 1.23
		}
		select {
		case job = <-ch:
			t.Stop()
			continue
		case <-t.C:
		}
		b.idleMu.Lock()
		i := slices.Index(b.idle, ch)
		if i >= 0 {
			b.idle = slices.Delete(b.idle, i, i+1)
		}
		b.idleMu.Unlock()
		if i >= 0 {
			return
		}
		job = <-ch // taken off the list by startRun as the timer fired: its run is on the way
	}
}
