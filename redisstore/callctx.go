package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetrate/fleetrate"
)

// callCtx bounds one script call by a deadline, as context.WithDeadline
// does, but is recycled: context.WithTimeout made a context, a timer and
// a done channel for every take (five allocations, about a microsecond on
// the path of a lone caller, whose take is bound by its round trip). A
// call that ends before its deadline, its caller's context not cancelled,
// leaves the done channel open and the timer stopped, and the next call
// reuses all three; one that was cancelled, or passed its deadline, is
// dropped, so that a done context never becomes live again.
//
// A callCtx also holds the scratch of its call (its one key and its
// arguments, which go-redis copies into its command), recycled with it: a
// call abandoned at its deadline (see Store.bounded) may still be reading
// them, and it is never recycled.
//
// Its caller releases it once the call has returned; code that keeps a
// call's context after the call (an asynchronous hook) would see it live
// again, with the deadline of a later call.
type callCtx struct {
	parent   context.Context
	deadline time.Time
	done     chan struct{}
	// timer ends the context at its deadline; stop, when set, stops the
	// propagation of the parent's cancellation (context.AfterFunc).
	timer *time.Timer
	stop  func() bool
	// unbounded is set for a store without a timeout (see context).
	unbounded bool
	err       atomic.Pointer[error]
	mu        sync.Mutex // serializes end

	// The call's scratch: its key, bucket and arguments.
	key    [1]string
	bucket [1]fleetrate.Bucket
	args   []any
}

var _ context.Context = (*callCtx)(nil)

// Deadline implements context.Context.
func (c *callCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// Done implements context.Context.
func (c *callCtx) Done() <-chan struct{} { return c.done }

// Err implements context.Context.
func (c *callCtx) Err() error {
	if p := c.err.Load(); p != nil {
		return *p
	}
	return nil
}

// Value implements context.Context.
func (c *callCtx) Value(key any) any { return c.parent.Value(key) }

// end ends c with err, once.
func (c *callCtx) end(err error) {
	c.mu.Lock()
	if c.err.Load() == nil {
		c.err.Store(&err)
		close(c.done)
	}
	c.mu.Unlock()
}

// callCtxs recycles the contexts of calls that ended in time.
var callCtxs sync.Pool

// boundCall returns the scratch and context of one call made for a
// caller whose context is parent, ended d from now (or at parent's
// deadline if that is sooner, or when parent ends); with a negative d,
// parent is the call's context. Release it once the call has returned.
func boundCall(parent context.Context, d time.Duration) *callCtx {
	c, _ := callCtxs.Get().(*callCtx)
	if c == nil {
		c = &callCtx{done: make(chan struct{})}
		c.timer = time.AfterFunc(time.Hour, func() { c.end(context.DeadlineExceeded) })
		c.timer.Stop()
	}
	c.parent = parent
	if c.unbounded = d < 0; c.unbounded {
		return c
	}
	now := time.Now()
	c.deadline = now.Add(d)
	if pd, ok := parent.Deadline(); ok && pd.Before(c.deadline) {
		c.deadline, d = pd, pd.Sub(now)
	}
	c.timer.Reset(d)
	if parent.Done() != nil {
		if err := parent.Err(); err != nil {
			c.end(err)
		} else {
			c.stop = context.AfterFunc(parent, func() { c.end(parent.Err()) })
		}
	}
	return c
}

// context returns the context of c's call: c itself, or for an unbounded
// call, its caller's.
func (c *callCtx) context() context.Context {
	if c.unbounded {
		return c.parent
	}
	return c
}

// release ends c's use by its call and recycles it if it can be reused:
// neither ended nor about to end, its caller's context not ended (an
// abandoned call may still read the scratch).
func (c *callCtx) release() {
	reuse := c.unbounded || c.timer.Stop()
	if c.stop != nil && !c.stop() {
		reuse = false
	}
	if !reuse || c.err.Load() != nil || c.parent.Err() != nil {
		return
	}
	c.parent, c.stop = nil, nil
	c.key[0], c.bucket[0] = "", fleetrate.Bucket{}
	clear(c.args)
	c.args = c.args[:0]
	callCtxs.Put(c)
}
