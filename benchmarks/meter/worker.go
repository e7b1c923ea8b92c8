// The worker side of the meter benchmark: each worker process runs a
// transport over the shared Redis and calls the upstream until its
// deadline.

package meter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/workerproc"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/transport"
)

const workerEnv = "FLEETRATE_METERBENCH_WORKER"

// spec is what the benchmark tells each worker process to do.
type spec struct {
	Scenario          Scenario
	Addr, URL, Prefix string
	Goroutines        int
	StartAt, Until    time.Time
}

// Main runs the worker when the binary was started as one, and returns
// otherwise. Call it first in TestMain.
func Main() { workerproc.Main(workerEnv, work) }

// path is the API's one path.
const path = "/v1/chat/completions"

// UpstreamOf is the transport's description of the API for s: a tokens
// meter, and one endpoint whose requests book s.Estimate tokens on it and
// are settled from the usage in their answers.
func UpstreamOf(s Scenario) transport.Upstream {
	return transport.Upstream{
		Channel: "llm",
		Fixed:   true,
		Meters:  []transport.Meter{{Name: "tokens", Limits: []fleetrate.Limit{fleetrate.PerSecond(s.MeterRate, s.MeterBurst)}}},
		Endpoints: []transport.Endpoint{{
			Name: "chat", Pattern: "POST " + path,
			Limits:   []fleetrate.Limit{fleetrate.PerSecond(s.RequestRate, s.RequestBurst)},
			InFlight: s.InFlight,
			Costs:    map[string]int64{"tokens": s.Estimate},
			Settle:   usage,
		}},
	}
}

// usage reads an OpenAI-style answer's usage.
func usage(_ *http.Response, body []byte) (map[string]int64, error) {
	var a struct {
		Usage struct {
			TotalTokens int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, fmt.Errorf("reading the usage: %w", err)
	}
	return map[string]int64{"tokens": a.Usage.TotalTokens}, nil
}

// maxWait is the fleet's max wait: 48 of the 64 callers wait for one of
// the 16 permits.
const maxWait = 30 * time.Second

func work(s spec) Outcomes {
	up := UpstreamOf(s.Scenario)
	c := redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: s.Goroutines + 4, MinIdleConns: s.Goroutines})
	defer c.Close()
	store, err := redisstore.New(c, redisstore.Options{Timeout: 2 * time.Second})
	if err != nil {
		return Outcomes{Errors: []string{err.Error()}}
	}
	wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err = store.Warm(wctx)
	cancel()
	if err != nil {
		return Outcomes{Errors: []string{err.Error()}}
	}
	lim, err := fleetrate.New(store, fleetrate.Config{Prefix: s.Prefix, Buckets: up.Buckets(), MaxWait: maxWait})
	if err != nil {
		return Outcomes{Errors: []string{err.Error()}}
	}
	classify, err := up.Classifier()
	if err != nil {
		return Outcomes{Errors: []string{err.Error()}}
	}
	tr, err := transport.New(lim, classify, transport.Options{
		Base:    &http.Transport{MaxIdleConnsPerHost: s.Goroutines},
		MaxWait: maxWait,
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return Outcomes{Errors: []string{err.Error()}}
	}
	client := &http.Client{Transport: tr}
	var (
		mu  sync.Mutex
		out Outcomes
		wg  sync.WaitGroup
	)
	time.Sleep(time.Until(s.StartAt))
	for range s.Goroutines {
		wg.Go(func() {
			for time.Now().Before(s.Until) {
				out.call(client, s.URL+path, s.Until, &mu)
			}
		})
	}
	wg.Wait()
	return out
}

// call sends one request, reads its answer to the end (which settles it)
// and counts in o (under mu) what the caller got instead of an answer. A
// request still waiting or in flight at until, the run's end, is given
// up.
func (o *Outcomes) call(client *http.Client, url string, until time.Time, mu *sync.Mutex) {
	ctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"max_tokens":750}`))
	resp, err := client.Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	var bp *fleetrate.BackpressureError
	mu.Lock()
	defer mu.Unlock()
	switch {
	case err == nil:
		if resp.StatusCode == http.StatusTooManyRequests {
			o.Limited++
		}
	case errors.As(err, &bp):
		o.Backpressure++
	case errors.Is(err, transport.ErrGaveUp):
		o.GaveUp++
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
	default:
		if len(o.Errors) < 5 {
			o.Errors = append(o.Errors, err.Error())
		}
	}
	if bp != nil {
		mu.Unlock()
		time.Sleep(max(bp.RetryAfter-bp.MaxWait, 100*time.Millisecond))
		mu.Lock()
	}
}
