package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
)

// waitTable measures Wait mode: Redis calls per grant, utilisation and
// lateness with 10 and 100 waiters on one bucket.
func waitTable(srv *redistest.Server, cfg config, out io.Writer) error {
	fmt.Fprintf(out, "## Redis: Wait mode on one saturated bucket (1000/s, burst 10)\n\n")
	fmt.Fprintf(out, "| waiters | grants | Redis calls per grant | utilisation | lateness min | lateness p50 | lateness p99 | reply delay p99 (grants with no wait) |\n|---|---|---|---|---|---|---|---|\n")
	for _, waiters := range []int{10, 100} {
		w, err := measureWait(srv, cfg, waiters)
		if err != nil {
			return err
		}
		late, now := w.late, w.now
		grants := len(late) + len(now)
		span := time.Duration(w.last - w.first).Seconds()
		util := float64(grants) / (float64(w.lim.Burst) + w.lim.Rate*span)
		fmt.Fprintf(out, "| %d | %d | %.3f | %.4f | %v | %v | %v | %v (%d grants) |\n", waiters, grants, float64(w.calls)/float64(grants), util,
			late[0].Round(time.Microsecond), late[len(late)/2].Round(time.Microsecond), late[len(late)*99/100].Round(time.Microsecond),
			now[len(now)*99/100].Round(time.Microsecond), len(now))
	}
	fmt.Fprintf(out, "\nLateness is the time a waiter that slept woke after its booked slot: the Redis server's clock at the decision plus the booked wait (client and server share one clock here). A waiter times its slot from the store's decision, placed on its own clock by the fastest recent round trip (never early: the minimum is the check), so lateness is the local timer and scheduling, not the reply's trip back. Grants with no wait (the first burst, when every waiter starts at once) do not sleep; for them the last column gives the time from the decision to the caller holding the grant.\n\n")
	return nil
}

// waitRun is what waiters calling WaitN on one bucket for a while saw.
type waitRun struct {
	lim         fleetrate.Limit
	calls       int64           // script calls
	late, now   []time.Duration // lateness of the grants that slept until their slot; delay of those with no wait (sorted)
	first, last int64           // the earliest and latest booked slot, ns
}

// measureWait runs waiters goroutines calling WaitN on one saturated
// bucket for cfg.duration, with a client of their own.
func measureWait(srv *redistest.Server, cfg config, waiters int) (waitRun, error) {
	var calls atomic.Int64
	c := newClient(srv, waiters)
	defer c.Close()
	c.AddHook(redistest.ScriptCounter{N: &calls})
	s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second})
	if err != nil {
		return waitRun{}, err
	}
	_ = s.LoadScripts(context.Background())
	warmPool(c, waiters)
	w := waitRun{lim: fleetrate.PerSecond(1000, 10), first: 1<<63 - 1}
	l, err := fleetrate.New(s, fleetrate.Config{Prefix: "fw:", Limits: []fleetrate.Limit{w.lim}, MaxWait: time.Minute})
	if err != nil {
		return waitRun{}, err
	}
	key := "wait" + strconv.Itoa(waiters)
	calls.Store(0)
	var mu sync.Mutex
	var wg sync.WaitGroup
	finish := time.Now().Add(cfg.duration)
	for range waiters {
		wg.Go(func() {
			for time.Now().Before(finish) {
				res, err := l.WaitN(context.Background(), 1, key)
				woke := time.Now()
				if err != nil {
					continue
				}
				booked := res.At.UnixNano() + int64(res.Wait)
				mu.Lock()
				if res.Wait > 0 {
					w.late = append(w.late, woke.Sub(time.Unix(0, booked)))
				} else {
					w.now = append(w.now, woke.Sub(time.Unix(0, booked)))
				}
				w.first, w.last = min(w.first, booked), max(w.last, booked)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	w.calls = calls.Load()
	slices.Sort(w.late)
	slices.Sort(w.now)
	return w, nil
}

// warmPool opens n connections, as a client in service has them open, so
// that a measurement starts without n simultaneous dials.
func warmPool(c *redis.Client, n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { _ = c.Ping(context.Background()).Err() })
	}
	wg.Wait()
}
