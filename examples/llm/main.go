// Command llm paces calls to an OpenAI-style chat API through fleetrate's
// outbound transport: requests per minute and tokens per minute on one
// credential, and at most 4 requests in flight. Each request books what
// it surely costs (its prompt's tokens) before it is sent, and the booking
// is settled to the usage the answer reports: the completion is charged
// then (see "Settling" in docs/ARCHITECTURE.md). The API here is a
// local mock that reports usage and counts what it receives; the limits
// are scaled down so that the run takes seconds.
//
//	go run ./examples/llm          # 30 requests from 8 workers
//	go run ./examples/llm -n 100
//
// With a redisstore.Store in place of the memory store, every process of
// a fleet shares the same budgets and the same in-flight bound.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "llm:", err)
		os.Exit(1)
	}
}

// chatRequest and chatAnswer are the parts of the API's JSON used here.
type chatRequest struct {
	MaxTokens int64 `json:"max_tokens"`
	Messages  []struct {
		Content string `json:"content"`
	} `json:"messages"`
}

type chatAnswer struct {
	Usage struct {
		TotalTokens int64 `json:"total_tokens"`
	} `json:"usage"`
}

// api describes the API's limits: the transport derives the buckets and
// the request mapping from it.
func api() transport.Upstream {
	return transport.Upstream{
		Channel:    "openai",
		Credential: []fleetrate.Limit{fleetrate.PerPeriod(600, time.Minute)}, // requests per minute
		Meters: []transport.Meter{
			{Name: "tokens", Limits: []fleetrate.Limit{fleetrate.PerSecond(5000, 5000)}}, // tokens per minute: 300,000
		},
		Endpoints: []transport.Endpoint{{
			Name: "chat", Pattern: "POST /v1/chat/completions",
			Limits:   []fleetrate.Limit{fleetrate.PerSecond(100, 10)},
			InFlight: 4,
			CostFunc: estimate,
			Settle:   usage,
		}},
	}
}

// estimate is what a request surely costs before it is sent: its prompt
// (about 4 bytes a token); its completion, up to max_tokens, is charged
// when the answer is settled. An estimate of the mean cost works as well
// (what an answer cost less goes back, as far as no later booking relies
// on it); one of the prompt plus max_tokens books far more than the
// answers cost, and while the meter is busy the later bookings' leads
// (each at most the meter's burst less its booking) bound what goes back.
// It reads a copy of the body, which the transport sends untouched.
func estimate(r *http.Request) (map[string]int64, error) {
	body, err := r.GetBody()
	if err != nil {
		return nil, err
	}
	var cr chatRequest
	if err := json.NewDecoder(body).Decode(&cr); err != nil {
		return nil, fmt.Errorf("reading the request: %w", err)
	}
	var n int64
	for _, m := range cr.Messages {
		n += int64(len(m.Content))/4 + 1
	}
	return map[string]int64{"tokens": n}, nil
}

// usage is what the request really cost: the answer's usage.
func usage(_ *http.Response, body []byte) (map[string]int64, error) {
	var a chatAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, fmt.Errorf("reading the usage: %w", err)
	}
	return map[string]int64{"tokens": a.Usage.TotalTokens}, nil
}

// mock is the API: it answers after 50 to 200 ms with a completion of
// half to all of max_tokens, and counts what it receives.
type mock struct {
	mu                       sync.Mutex
	inFlight, most, requests int
	tokens                   int64
}

func (m *mock) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	m.inFlight++
	m.most = max(m.most, m.inFlight)
	m.mu.Unlock()
	var cr chatRequest
	_ = json.NewDecoder(r.Body).Decode(&cr)
	time.Sleep(50*time.Millisecond + rand.N(150*time.Millisecond))
	prompt := int64(0)
	for _, msg := range cr.Messages {
		prompt += int64(len(msg.Content))/4 + 1
	}
	total := prompt + cr.MaxTokens/2 + rand.Int64N(cr.MaxTokens/2+1)
	m.mu.Lock()
	m.inFlight--
	m.requests++
	m.tokens += total
	m.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"choices":[{"message":{"content":"..."}}],"usage":{"total_tokens":%d}}`, total)
}

// run sends -n requests from 8 workers through the transport and prints
// what the API saw.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("llm", flag.ContinueOnError)
	n := fs.Int("n", 30, "requests to send")
	if err := fs.Parse(args); err != nil {
		return err
	}
	m := &mock{}
	srv := httptest.NewServer(m)
	defer srv.Close()

	up := api()
	limiter, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Buckets: up.Buckets(), MaxWait: time.Minute})
	if err != nil {
		return err
	}
	classify, err := up.Classifier()
	if err != nil {
		return err
	}
	rt, err := transport.New(limiter, classify, transport.Options{MaxWait: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer rt.Close()
	client := &http.Client{Transport: rt}

	start := time.Now()
	jobs := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range 8 {
		wg.Go(func() {
			for range jobs {
				if err := chat(ctx, client, srv.URL); err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range *n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	fmt.Fprintf(stdout, "%d requests in %v, %d tokens used; at most %d in flight at the API (bound 4)\n",
		m.requests, time.Since(start).Round(10*time.Millisecond), m.tokens, m.most)
	return nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// chat sends one chat completion and reads its answer to the end, which
// gives its in-flight permit back and settles its tokens.
func chat(ctx context.Context, client *http.Client, base string) error {
	body := []byte(`{"model":"mock","max_tokens":800,"messages":[{"role":"user","content":"Summarise the rate-limit headers of this API."}]}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var a chatAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body) // to the end: the permit goes back
	return nil
}
