// Package schednoise measures how late this process's goroutines run, so
// that a test bounding a wall-clock duration can allow for the scheduling
// noise of the machine it runs on, measured in the same window, instead of
// a fixed number that a loaded machine exceeds.
//
// A Watch runs a goroutine that sleeps a millisecond at a time and records
// how much later than asked each sleep ends. A timer that bounds the
// operation under test is late by about as much, since it waits for the
// same CPUs, the same garbage collector and the same race detector.
package schednoise

import (
	"sync"
	"time"
)

// tick is how long the watcher asks to sleep each time.
const tick = time.Millisecond

// Watch measures scheduling lateness until Stop.
type Watch struct {
	stop chan struct{}
	done chan struct{}

	mu    sync.Mutex
	worst time.Duration
}

// Start starts a watch.
func Start() *Watch {
	w := &Watch{stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *Watch) run() {
	defer close(w.done)
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		start := time.Now()
		time.Sleep(tick)
		late := time.Since(start) - tick
		w.mu.Lock()
		w.worst = max(w.worst, late)
		w.mu.Unlock()
	}
}

// Stop ends the watch and returns the worst lateness it saw.
func (w *Watch) Stop() time.Duration {
	close(w.stop)
	<-w.done
	return w.Worst()
}

// Worst returns the worst lateness seen so far.
func (w *Watch) Worst() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.worst
}

// Allowance is what a test adds to a bound it asserts on a wall-clock
// duration: twice the worst lateness (the bounding timer fires late, and
// then the goroutine it wakes runs late), plus floor for the work the
// operation does after its timer (a hand-off or two under the race
// detector).
func Allowance(worst, floor time.Duration) time.Duration {
	return 2*worst + floor
}
