package transport_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

// tokenUpstream is an LLM API with a tokens-per-minute limit: a token
// bucket of rate tokens a second and burst tokens, charged each answer's
// real cost when it is answered (when the usage is known). It answers
// every request, and counts the answers that took the bucket past its
// burst: each is a request the real API would have refused.
type tokenUpstream struct {
	rate    float64 // tokens a second
	burst   float64
	latency time.Duration
	// real returns the real cost of request i.
	real func(i int) int64

	mu     sync.Mutex
	tat    time.Time // when the bucket is full again (GCRA)
	n      int
	tokens int64
	over   int
}

func (u *tokenUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	i := u.n
	u.n++
	u.mu.Unlock()
	time.Sleep(u.latency)
	cost := u.real(i)
	u.mu.Lock()
	now := time.Now()
	u.tat = later(u.tat, now).Add(time.Duration(float64(cost) / u.rate * float64(time.Second)))
	if u.tat.Sub(now) > time.Duration(u.burst/u.rate*float64(time.Second)) {
		u.over++
	}
	u.tokens += cost
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"choices":[{"text":"..."}],"usage":{"total_tokens":%d}}`, cost)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// usage is a Settle that reads an OpenAI-style answer's usage.
func usage(_ *http.Response, body []byte) (map[string]int64, error) {
	var a struct {
		Usage struct {
			TotalTokens int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, fmt.Errorf("reading usage: %w", err)
	}
	return map[string]int64{"tokens": a.Usage.TotalTokens}, nil
}

// meteredRun sends requests estimated at est tokens from 4 callers for
// five minutes against up, through a tokens meter of 150 tokens a second
// (burst 2,000), below the upstream's 10,000 a minute (burst 3,000), with
// settle as the endpoint's Settle; at most 2 in flight.
func meteredRun(t *testing.T, up *tokenUpstream, est int64, settle transport.Settle) {
	t.Helper()
	api := transport.Upstream{
		Channel: "openai",
		Meters:  []transport.Meter{{Name: "tokens", Limits: []fleetrate.Limit{fleetrate.PerSecond(150, 2000)}}},
		Endpoints: []transport.Endpoint{{
			Name: "chat", Pattern: "POST /v1/chat/completions", InFlight: 2,
			Limits: []fleetrate.Limit{fleetrate.PerSecond(50, 5)},
			Costs:  map[string]int64{"tokens": est}, Settle: settle,
		}},
	}
	tr, _, _ := boundedSetup(t, memstore.New(memstore.Options{}), api, inMemory(up),
		fleetrate.Config{MaxWait: time.Minute}, transport.Options{MaxWait: time.Minute, MaxAttempts: 1})
	end := time.Now().Add(5 * time.Minute)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for time.Now().Before(end) {
				if _, err := post(t, tr, "/v1/chat/completions", nil); err != nil {
					t.Errorf("request: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestSettleKeepsTokensWithinTheLimit: answers that really cost 50 % more
// or less than the 500 tokens estimated, or anywhere between, keep the
// upstream's tokens-per-minute bucket within its limit once settled from
// the usage they report; unsettled, answers that cost 50 % more take it
// past its limit. Booked at 250, the least they cost, and settled up,
// they keep it within its limit too (the meter's burst, 2,000, and the
// under-estimates of the 2 in flight, 500 each, fill the upstream's
// 3,000), and nothing booked is lost: the meter's 9,000 a minute are all
// used, where an estimate of 500 loses the over-estimates.
func TestSettleKeepsTokensWithinTheLimit(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	spread := make([]int64, 4096)
	for i := range spread {
		spread[i] = 250 + rng.Int64N(501) // 500 ± 50 %
	}
	for _, tc := range []struct {
		name   string
		real   func(int) int64
		est    int64
		settle transport.Settle
		over   bool
		// atLeast is the least the upstream must admit in the 5 min,
		// when set.
		atLeast int64
	}{
		{"+50% settled", func(int) int64 { return 750 }, 500, usage, false, 0},
		{"-50% settled", func(int) int64 { return 250 }, 500, usage, false, 0},
		{"±50% settled", func(i int) int64 { return spread[i%len(spread)] }, 500, usage, false, 0},
		{"+50% unsettled", func(int) int64 { return 750 }, 500, nil, true, 0},
		{"±50% booked at the floor, settled", func(i int) int64 { return spread[i%len(spread)] }, 250, usage, false, 5 * 9000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				up := &tokenUpstream{rate: 10000.0 / 60, burst: 3000, latency: time.Second, real: tc.real}
				meteredRun(t, up, tc.est, tc.settle)
				up.mu.Lock()
				defer up.mu.Unlock()
				t.Logf("%d requests, %d tokens in 5 min (%.0f a minute), %d past the upstream's limit", up.n, up.tokens, float64(up.tokens)/5, up.over)
				if tc.over != (up.over > 0) {
					t.Errorf("%d answers past the upstream's limit; want any: %v", up.over, tc.over)
				}
				if up.tokens < tc.atLeast {
					t.Errorf("%d tokens admitted in five minutes, want at least %d (the meter's rate)", up.tokens, tc.atLeast)
				}
				if up.n < 10 {
					t.Errorf("only %d requests in five minutes", up.n)
				}
			})
		})
	}
}

// TestTokenFieldsHoldTheTokensMeter: an answer saying 600 tokens remain
// for the next 30 s, on a tokens meter that would grant 150 a second,
// drains the meter so that it grants no more than those 600 before the
// reset: the next request of 500 tokens waits about 26 s.
func TestTokenFieldsHoldTheTokensMeter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("x-ratelimit-limit-tokens", "9000")
			w.Header().Set("x-ratelimit-remaining-tokens", "600")
			w.Header().Set("x-ratelimit-reset-tokens", "30s")
			fmt.Fprint(w, `{"usage":{"total_tokens":500}}`)
		})
		api := transport.Upstream{
			Channel: "openai",
			Meters:  []transport.Meter{{Name: transport.TokensMeter, Limits: []fleetrate.Limit{fleetrate.PerSecond(150, 2000)}}},
			Endpoints: []transport.Endpoint{{
				Name: "chat", Pattern: "POST /v1/chat/completions",
				Limits: []fleetrate.Limit{fleetrate.PerSecond(50, 5)},
				Costs:  map[string]int64{"tokens": 500},
			}},
		}
		tr, lim, _ := boundedSetup(t, memstore.New(memstore.Options{}), api, inMemory(up),
			fleetrate.Config{MaxWait: time.Minute}, transport.Options{MaxWait: time.Minute, MaxAttempts: 1})
		resp, err := post(t, tr, "/v1/chat/completions", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		res, err := lim.Peek(t.Context(), transport.MeterBucket("openai", transport.TokensMeter))
		if err != nil {
			t.Fatal(err)
		}
		// Held for 30 s - 600/150 s = 26 s, then refilling from empty.
		if res.Allowed || res.RetryAfter < 25*time.Second || res.RetryAfter > 27*time.Second+2000*time.Second/150 {
			t.Fatalf("the tokens meter after an answer with 600 tokens left for 30 s: %+v, want held about 26 s", res)
		}
	})
}
