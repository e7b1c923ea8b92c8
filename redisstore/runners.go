package redisstore

import (
	"slices"
	"sync"
	"time"
)

// runners are goroutines kept for work handed off the caller's goroutine:
// a batcher's queued calls (batcher.run) and, for a client that does not
// give up at the context's deadline, every call (Store.bounded). A new
// goroutine for each started on a small stack and grew it, copying it
// each time, down go-redis's call path: a tenth of the CPU of `fleetrate
// serve` on Redis at 16 callers went to growing stacks, and a lone caller
// on such a client ran at half redis_rate's rate. A runner that finishes
// waits a while for the next job instead, and the runner idle last is the
// one reused, so that the few a light load needs keep warm, grown stacks.
type runners struct {
	mu sync.Mutex
	// idle are the runners waiting for a job, the one idle last at the
	// end.
	idle []chan func()
}

const (
	// maxIdleRunners bounds the runners waiting for a job, per pool.
	maxIdleRunners = 8
	// runnerIdle is how long a runner waits for a job before it ends.
	runnerIdle = time.Second
)

// start runs job on an idle runner, or on a new one.
func (p *runners) start(job func()) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		ch := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		ch <- job // never blocks: room for one, and the runner is off the list
		return
	}
	p.mu.Unlock()
	go p.runner(job)
}

// runner runs job, then the jobs start hands it, until it has waited
// runnerIdle for one or maxIdleRunners others are waiting already.
func (p *runners) runner(job func()) {
	ch := make(chan func(), 1)
	var t *time.Timer
	for {
		job()
		p.mu.Lock()
		if len(p.idle) >= maxIdleRunners {
			p.mu.Unlock()
			return
		}
		p.idle = append(p.idle, ch)
		p.mu.Unlock()
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
		p.mu.Lock()
		i := slices.Index(p.idle, ch)
		if i >= 0 {
			p.idle = slices.Delete(p.idle, i, i+1)
		}
		p.mu.Unlock()
		if i >= 0 {
			return
		}
		job = <-ch // taken off the list by start as the timer fired: its job is on the way
	}
}

// startRun runs the queue q of route r on a runner.
func (b *batcher[R]) startRun(r R, q *batchQueue) {
	b.runners.start(func() { b.run(r, q) })
}
