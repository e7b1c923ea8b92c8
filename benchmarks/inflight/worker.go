package inflight

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/redisstore"
)

// workerEnv carries a worker process's spec; workerHeader names the
// worker in its requests, so the upstream counts each one's in flight.
const (
	workerEnv    = "FLEETRATE_INFLIGHT_WORKER"
	workerHeader = "X-Worker"
)

// spec is what a worker process does.
type spec struct {
	Worker             string
	Redis, URL, Prefix string
	Goroutines         int
	Bound              int64
	Rate               float64
	TTL                time.Duration
	Until              time.Time
}

// result is what a worker process saw.
type result struct {
	Requests, Acquired, Backpressure, NotHeld, Lapsed int64
	// Takes, Renews and Releases count the store calls.
	Takes, Renews, Releases int64
	Errors                  []string
}

// counting counts a store's calls by kind.
type counting struct {
	fleetrate.Store
	takes, renews, releases atomic.Int64
}

func (c *counting) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	c.takes.Add(1)
	return c.Store.Take(ctx, req)
}

func (c *counting) Renew(ctx context.Context, bs []fleetrate.Bucket, p fleetrate.Permit) (int, error) {
	c.renews.Add(1)
	return c.Store.Renew(ctx, bs, p)
}

func (c *counting) Release(ctx context.Context, bs []fleetrate.Bucket, id string) (int, error) {
	c.releases.Add(1)
	return c.Store.Release(ctx, bs, id)
}

// NotifyPermit passes the store's notices on, so that waiters are woken
// as they are without the counter.
func (c *counting) NotifyPermit(key, id string) (<-chan struct{}, func()) {
	if n, ok := c.Store.(fleetrate.PermitNotifier); ok {
		return n.NotifyPermit(key, id)
	}
	return nil, func() {}
}

// work runs a worker process: goroutines that acquire a permit of the
// credential, call the upstream holding it, and release it, until the
// spec's deadline.
func work(s spec) result {
	var res result
	opt, err := redis.ParseURL(s.Redis)
	if err != nil {
		return result{Errors: []string{err.Error()}}
	}
	rs, err := redisstore.New(redis.NewClient(opt), redisstore.Options{})
	if err != nil {
		return result{Errors: []string{err.Error()}}
	}
	store := &counting{Store: rs}
	lim, err := fleetrate.New(store, fleetrate.Config{
		Prefix:    s.Prefix,
		Buckets:   []fleetrate.BucketConfig{{Name: "{cred}", Limits: []fleetrate.Limit{fleetrate.PerSecond(s.Rate, max(int64(s.Rate/10), 1))}, InFlight: s.Bound}},
		PermitTTL: s.TTL,
		MaxWait:   5 * time.Second,
	})
	if err != nil {
		return result{Errors: []string{err.Error()}}
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: s.Goroutines}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range s.Goroutines {
		wg.Go(func() {
			var mine result
			for time.Now().Before(s.Until) {
				mine.call(lim, client, s.URL, s.Worker)
			}
			mu.Lock()
			res.add(mine)
			mu.Unlock()
		})
	}
	wg.Wait()
	res.Takes, res.Renews, res.Releases = store.takes.Load(), store.renews.Load(), store.releases.Load()
	return res
}

// call acquires a permit, sends one request holding it, and releases it.
func (r *result) call(lim *fleetrate.Limiter, client *http.Client, url, worker string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := lim.Acquire(ctx, "{cred}")
	var bp *fleetrate.BackpressureError
	switch {
	case errors.As(err, &bp):
		r.Backpressure++
		return
	case err != nil:
		r.errorf("acquire: %v", err)
		time.Sleep(100 * time.Millisecond)
		return
	}
	r.Acquired++
	defer func() {
		if res.Lapsed() {
			r.Lapsed++
		}
		_ = res.Release(context.Background())
	}()
	if !res.Held() {
		// Paused past the lease between the grant and now: the permit
		// may be another's. Acquire again rather than send.
		r.NotHeld++
		return
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set(workerHeader, worker)
	resp, err := client.Do(req)
	if err != nil {
		// Given up on (the deadline) after it may have been sent: the
		// upstream may still be running it, so the permit is left to
		// lapse at the end of its lease rather than given back.
		res.Abandon()
		r.errorf("request: %v", err)
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	r.Requests++
}

func (r *result) errorf(format string, args ...any) {
	if len(r.Errors) < 5 {
		r.Errors = append(r.Errors, fmt.Sprintf(format, args...))
	}
}

func (r *result) add(o result) {
	r.Requests += o.Requests
	r.Acquired += o.Acquired
	r.Backpressure += o.Backpressure
	r.NotHeld += o.NotHeld
	r.Lapsed += o.Lapsed
	for _, e := range o.Errors {
		r.errorf("%s", e)
	}
}
