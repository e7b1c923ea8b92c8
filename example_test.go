package fleetrate_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
)

// fixedClock keeps examples deterministic: the store's time stands still.
func fixedClock() time.Time { return time.Unix(1_700_000_000, 0) }

func ExampleLimiter_Allow() {
	store := memstore.New(memstore.Options{Clock: fixedClock})
	lim, err := fleetrate.New(store, fleetrate.Config{
		Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 3)}, // 10/s, burst 3
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for range 4 {
		res, err := lim.Allow(ctx, "api-key-42")
		if err != nil {
			panic(err) // the store failed: fail open or closed, your choice
		}
		fmt.Println(res.Allowed, res.Remaining, res.RetryAfter)
	}
	// Output:
	// true 2 0s
	// true 1 0s
	// true 0 0s
	// false 0 100ms
}

func ExampleLimiter_Wait() {
	lim, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{
		Buckets: []fleetrate.BucketConfig{
			{Name: "{booking_com}/availability", Limits: []fleetrate.Limit{fleetrate.PerSecond(20, 40)}},
			{Name: "{booking_com}/rate_plans", Limits: []fleetrate.Limit{fleetrate.PerSecond(5, 10)}},
		},
	})
	if err != nil {
		panic(err)
	}
	// Blocks until the fleet-wide bucket grants a token, or fails at once
	// with ErrBackpressure when the wait would pass the max wait.
	if _, err := lim.Wait(context.Background(), "{booking_com}/availability"); err != nil {
		panic(err)
	}
	fmt.Println("sent")
	// Output: sent
}

func ExampleLimiter_ReserveN() {
	store := memstore.New(memstore.Options{Clock: fixedClock})
	lim, _ := fleetrate.New(store, fleetrate.Config{
		Limits:  []fleetrate.Limit{fleetrate.PerSecond(2, 1)},
		MaxWait: time.Second,
	})
	ctx := context.Background()
	for range 4 {
		r, err := lim.ReserveN(ctx, 1, "k")
		var bp *fleetrate.BackpressureError
		switch {
		case errors.As(err, &bp):
			fmt.Println("back off for", bp.RetryAfter)
		case err != nil:
			panic(err)
		default:
			fmt.Println("go in", r.Result.Wait)
		}
	}
	// Output:
	// go in 0s
	// go in 500ms
	// go in 1s
	// back off for 1.5s
}

func ExampleLimiter_AllowN() {
	store := memstore.New(memstore.Options{Clock: fixedClock})
	lim, _ := fleetrate.New(store, fleetrate.Config{Buckets: []fleetrate.BucketConfig{
		{Name: "{ota}/reservations", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}},
		{Name: "{ota}", Limits: []fleetrate.Limit{fleetrate.PerSecond(30, 5)}}, // credential-wide
	}})
	// Takes from the endpoint and the credential bucket, all or nothing.
	res, _ := lim.AllowN(context.Background(), 5, "{ota}/reservations", "{ota}")
	fmt.Println(res.Allowed, res.Remaining)
	res, _ = lim.AllowN(context.Background(), 1, "{ota}/reservations", "{ota}")
	fmt.Println(res.Allowed, res.Bucket)
	// Output:
	// true 0
	// false 1
}

func ExampleLimiter_Peek() {
	store := memstore.New(memstore.Options{Clock: fixedClock})
	lim, _ := fleetrate.New(store, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerPeriod(100, time.Minute)}})
	ctx := context.Background()
	_, _ = lim.AllowN(ctx, 40, "k")
	res, _ := lim.Peek(ctx, "k")
	fmt.Println(res.Remaining, res.ResetAfter)
	// Output: 60 24s
}

func ExampleLimiter_Drain() {
	store := memstore.New(memstore.Options{Clock: fixedClock})
	lim, _ := fleetrate.New(store, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}})
	ctx := context.Background()
	// An upstream said "Retry-After: 2": pause every worker for 2 s.
	_ = lim.Drain(ctx, 2*time.Second, "upstream")
	res, _ := lim.Allow(ctx, "upstream")
	fmt.Println(res.Allowed, res.RetryAfter)
	// Output: false 2.1s
}

func ExampleLimiter_Reset() {
	store := memstore.New(memstore.Options{Clock: fixedClock})
	lim, _ := fleetrate.New(store, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 3)}})
	ctx := context.Background()
	_, _ = lim.AllowN(ctx, 3, "k")
	_ = lim.Reset(ctx, "k")
	res, _ := lim.Peek(ctx, "k")
	fmt.Println(res.Remaining)
	// Output: 3
}

func ExampleLimiter_Refund() {
	store := memstore.New(memstore.Options{Clock: fixedClock})
	lim, _ := fleetrate.New(store, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 5)}})
	ctx := context.Background()
	grant, _ := lim.AllowN(ctx, 5, "k")
	// The work two of the tokens paid for never happened: give them back
	// (at once: what the bucket refills meanwhile is not given back).
	_ = lim.RefundN(ctx, grant, 2, "k")
	res, _ := lim.Peek(ctx, "k")
	fmt.Println(res.Remaining)
	// Output: 2
}

// A cancelled reservation gives its slot back only when no later one
// relies on it: cancelling the latest frees its slot for the next booking;
// cancelling one with a later booking behind it leaves its tokens unused,
// so that the later booking's slot is never granted twice.
func ExampleReservation_Cancel() {
	store := memstore.New(memstore.Options{Clock: fixedClock})
	lim, err := fleetrate.New(store, fleetrate.Config{
		Limits:  []fleetrate.Limit{fleetrate.PerSecond(1, 1)}, // one a second
		MaxWait: time.Minute,
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	wait := func() time.Duration {
		r, err := lim.Reserve(ctx, "k")
		if err != nil {
			panic(err)
		}
		return r.Result.Wait
	}
	first, _ := lim.Reserve(ctx, "k") // now
	second, _ := lim.Reserve(ctx, "k")
	fmt.Println("second at", second.Result.Wait)
	_ = second.Cancel(ctx) // the latest: its slot goes back
	fmt.Println("next at", wait())
	_ = first.Cancel(ctx) // a later booking relies on it: nothing goes back
	fmt.Println("next at", wait())
	// Output:
	// second at 1s
	// next at 1s
	// next at 2s
}

// A bulk job and the requests that matter share one credential: the bulk
// class keeps 3 tokens for them and books at most 100 ms ahead, so a
// confirmation arriving after the bulk job has emptied the bucket is
// served at once.
func ExampleWithPriority() {
	store := memstore.New(memstore.Options{Clock: fixedClock})
	lim, err := fleetrate.New(store, fleetrate.Config{
		Buckets: []fleetrate.BucketConfig{{
			Name:   "partner-api",
			Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)},
			Priorities: []fleetrate.Priority{
				{Name: "bulk", Reserve: 3, Horizon: 100 * time.Millisecond},
			},
		}},
	})
	if err != nil {
		panic(err)
	}
	bulk := fleetrate.WithPriority(context.Background(), "bulk")
	pushed := 0
	for {
		r, err := lim.Reserve(bulk, "partner-api")
		if err != nil {
			fmt.Println("bulk:", pushed, "pushed, then", err)
			break
		}
		pushed++
		_ = r // a real job waits r.Delay(), then pushes
	}
	res, err := lim.Allow(context.Background(), "partner-api")
	fmt.Println("confirmation allowed:", res.Allowed, err)
	// Output:
	// bulk: 8 pushed, then fleetrate: wait of 200ms exceeds max wait 100ms
	// confirmation allowed: true <nil>
}

// Book takes buckets the caller built: a configured bucket paced at a
// slower rate than configured, as transport does after a 429, beside a
// bucket of the caller's own. The Limiter times the slot and cancels it
// exactly.
func ExampleLimiter_Book() {
	lim, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{
		Buckets: []fleetrate.BucketConfig{{Name: "ota", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 1)}}},
	})
	if err != nil {
		panic(err)
	}
	b, err := lim.Bucket("ota")
	if err != nil {
		panic(err)
	}
	b.Limits = []fleetrate.Limit{fleetrate.PerSecond(5, 1)} // half the rate
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1, MaxWait: time.Second}
	for range 2 {
		r, err := lim.Book(context.Background(), req)
		if err != nil {
			panic(err)
		}
		fmt.Println("booked", r.Result.Wait.Round(100*time.Millisecond))
	}
	// Output:
	// booked 0s
	// booked 200ms
}

// TakeMany decides takes that do not depend on one another in one call
// of the store's (one script call on Redis, most often): here the three
// descriptors of one Envoy call, a tenant, a user and a route, each
// with its own bucket. The answers come back in the order asked.
func ExampleTakeMany() {
	store := memstore.New(memstore.Options{Clock: fixedClock})
	perMinute := []fleetrate.Limit{fleetrate.Every(time.Minute, 2)}
	var reqs []fleetrate.Request
	for _, key := range []string{"tenant:acme", "user:42", "route:/v1/messages"} {
		reqs = append(reqs, fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: key, Limits: perMinute}}, N: 1})
	}
	reqs = append(reqs, fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "user:42", Limits: perMinute}}, N: 5}) // more than its burst
	res, errs := make([]fleetrate.Result, len(reqs)), make([]error, len(reqs))
	if err := fleetrate.TakeMany(context.Background(), store, reqs, res, errs); err != nil {
		fmt.Println(err)
		return
	}
	for i := range reqs {
		if errs[i] != nil {
			fmt.Printf("%s: exceeds the burst: %v\n", reqs[i].Buckets[0].Key, errors.Is(errs[i], fleetrate.ErrBurstExceeded))
			continue
		}
		fmt.Printf("%s: allowed %v, %d left\n", reqs[i].Buckets[0].Key, res[i].Allowed, res[i].Remaining)
	}
	// Output:
	// tenant:acme: allowed true, 1 left
	// user:42: allowed true, 1 left
	// route:/v1/messages: allowed true, 1 left
	// user:42: exceeds the burst: true
}
