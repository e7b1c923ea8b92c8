package transport_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/logbuf"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

func TestPacesSharedBucket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{}
		tr, _ := setup(t, bookingCom(10), inMemory(srv), transport.Options{})
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				for range 5 {
					if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
						t.Errorf("request: %v", err)
					}
				}
			})
		}
		wg.Wait()
		got := srv.got()
		if len(got) != 15 {
			t.Fatalf("upstream got %d requests, want 15", len(got))
		}
		for i := 1; i < len(got); i++ {
			if gap := got[i].at.Sub(got[i-1].at); gap < 100*time.Millisecond {
				t.Errorf("requests %d and %d were %v apart, want >= 100ms at 10/s burst 1", i-1, i, gap)
			}
		}
	})
}

// TestFleetPause: one worker's 429 with Retry-After: 2 pauses every worker
// for 2 s, including those already sleeping on bookings made before it,
// and the fleet then resumes at the bucket's rate with no burst.
func TestFleetPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const iv = 100 * time.Millisecond // 10/s burst 1
		srv := &upstream{script: []reply{{200, ""}, {200, ""}, {200, ""}, {200, ""}, {http.StatusTooManyRequests, "2"}}}
		tr, _ := setup(t, bookingCom(10), inMemory(srv), transport.Options{Backoff: fixedBackoff(0)})
		start := time.Now()
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for time.Since(start) < 5*time.Second {
					if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
						t.Errorf("request: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()

		got := srv.got()
		t429 := got[4].at
		resumed := t429.Add(2 * time.Second)
		var after []time.Time
		for _, a := range got[5:] {
			if a.at.Before(resumed) {
				t.Errorf("a request arrived %v after the 429, inside the 2s pause", a.at.Sub(t429))
			}
			after = append(after, a.at)
		}
		if len(after) < 20 {
			t.Fatalf("only %d requests after the pause; the fleet did not resume", len(after))
		}
		// The bucket refills from empty: the first token comes one interval
		// after the pause, and then one per interval, never a burst.
		if first := after[0].Sub(t429); first < 2*time.Second+iv {
			t.Errorf("first request after the pause came %v after the 429, want >= %v", first, 2*time.Second+iv)
		}
		for i := 1; i < len(after); i++ {
			if gap := after[i].Sub(after[i-1]); gap < iv {
				t.Errorf("after the pause, requests %d and %d were %v apart: a burst", i-1, i, gap)
			}
		}
	})
}

func TestRetryAfterForms(t *testing.T) {
	const backoff = 700 * time.Millisecond
	const iv = 100 * time.Millisecond
	epoch := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC) // synctest's start
	tests := []struct {
		name       string
		retryAfter string
		// the second attempt is sent within [wait, wait+iv] of the first
		wait time.Duration
	}{
		{"seconds", "2", 2 * time.Second},
		{"http-date", epoch.Add(3 * time.Second).Format(http.TimeFormat), 3 * time.Second},
		{"past date", epoch.Add(-time.Hour).Format(http.TimeFormat), backoff},
		{"negative", "-3", backoff},
		{"huge is capped", "86400000", 10 * time.Second},
		{"garbage", "later, please", backoff},
		{"missing", "", backoff},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &upstream{script: []reply{{http.StatusTooManyRequests, tc.retryAfter}}}
				tr, _ := setup(t, bookingCom(10), inMemory(srv), transport.Options{
					Backoff:       fixedBackoff(backoff),
					MaxRetryAfter: 10 * time.Second,
					Adaptive:      transport.Adaptive{Off: true}, // the retry's slot at the documented rate
				})
				resp, err := get(t, t.Context(), tr, "/availability")
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("got %v, %v; want 200 after one retry", resp, err)
				}
				got := srv.got()
				if len(got) != 2 {
					t.Fatalf("upstream got %d requests, want 2", len(got))
				}
				gap := got[1].at.Sub(got[0].at)
				if gap < tc.wait || gap > tc.wait+iv {
					t.Errorf("retry sent %v after the 429, want within [%v, %v]", gap, tc.wait, tc.wait+iv)
				}
			})
		})
	}
}

func Test503WithRetryAfterIsARateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{script: []reply{{http.StatusServiceUnavailable, "1"}, {http.StatusServiceUnavailable, ""}}}
		tr, _ := setup(t, bookingCom(10), inMemory(srv), transport.Options{Backoff: fixedBackoff(0)})
		resp, err := get(t, t.Context(), tr, "/availability")
		if err != nil {
			t.Fatal(err)
		}
		// The 503 with Retry-After was retried; the plain 503 that followed
		// is an upstream failure and comes back as is.
		if resp.StatusCode != http.StatusServiceUnavailable || len(srv.got()) != 2 {
			t.Errorf("got status %d after %d requests, want 503 after 2", resp.StatusCode, len(srv.got()))
		}
	})
}

func TestGivesUpAfterMaxAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{always: &reply{http.StatusTooManyRequests, "1"}}
		tr, _ := setup(t, bookingCom(10), inMemory(srv), transport.Options{})
		client := &http.Client{Transport: tr}
		req, _ := http.NewRequest(http.MethodGet, "http://ota.test/availability", nil)
		resp, err := client.Do(req)
		if resp != nil {
			resp.Body.Close()
			t.Fatalf("got a response, want an error")
		}
		if !errors.Is(err, transport.ErrGaveUp) {
			t.Fatalf("err = %v, want ErrGaveUp", err)
		}
		var gu *transport.GaveUpError
		if !errors.As(err, &gu) {
			t.Fatalf("err = %v, want a *GaveUpError", err)
		}
		if gu.Attempts != transport.DefaultMaxAttempts || gu.StatusCode != 429 || gu.RetryAfter != time.Second {
			t.Errorf("GaveUpError = %+v, want 4 attempts, status 429, retry-after 1s", gu)
		}
		if n := len(srv.got()); n != transport.DefaultMaxAttempts {
			t.Errorf("upstream got %d requests, want %d", n, transport.DefaultMaxAttempts)
		}
		if !strings.Contains(err.Error(), "rate limited, gave up after 4 attempts") {
			t.Errorf("error %q does not say it gave up after 4 attempts", err)
		}
	})
}

func TestUpstreamFailuresAreNotGiveUps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{always: &reply{http.StatusInternalServerError, ""}}
		tr, _ := setup(t, bookingCom(10), inMemory(srv), transport.Options{})
		resp, err := get(t, t.Context(), tr, "/availability")
		if err != nil || resp.StatusCode != 500 || len(srv.got()) != 1 {
			t.Errorf("500: got %v, %v after %d requests; want the 500 itself after 1", resp, err, len(srv.got()))
		}

		boom := errors.New("connection reset")
		calls := 0
		failing := roundTripFunc(func(*http.Request) (*http.Response, error) { calls++; return nil, boom })
		tr2, _ := setup(t, bookingCom(10), failing, transport.Options{})
		_, err = get(t, t.Context(), tr2, "/availability")
		if !errors.Is(err, boom) || errors.Is(err, transport.ErrGaveUp) || calls != 1 {
			t.Errorf("network error: got %v after %d calls; want the error itself, not ErrGaveUp, after 1", err, calls)
		}
	})
}

func TestCustomRetryPolicy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{script: []reply{{http.StatusBadGateway, ""}, {http.StatusBadGateway, ""}}}
		retry502 := func(ctx context.Context, resp *http.Response, err error) (bool, error) {
			return err == nil && resp.StatusCode == http.StatusBadGateway, nil
		}
		var attempts []int
		backoff := func(attempt int, lo, hi time.Duration) time.Duration {
			attempts = append(attempts, attempt)
			return time.Duration(attempt) * time.Second
		}
		tr, _ := setup(t, bookingCom(10), inMemory(srv), transport.Options{CheckRetry: retry502, Backoff: backoff})
		resp, err := get(t, t.Context(), tr, "/availability")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("got %v, %v; want 200 on the third attempt", resp, err)
		}
		got := srv.got()
		if len(got) != 3 {
			t.Fatalf("upstream got %d requests, want 3", len(got))
		}
		if g := got[1].at.Sub(got[0].at); g < time.Second {
			t.Errorf("first backoff %v, want >= 1s", g)
		}
		if g := got[2].at.Sub(got[1].at); g < 2*time.Second {
			t.Errorf("second backoff %v, want >= 2s", g)
		}
		if len(attempts) != 2 || attempts[0] != 1 || attempts[1] != 2 {
			t.Errorf("Backoff called with attempts %v, want [1 2]", attempts)
		}

		stop := errors.New("stop here")
		tr2, _ := setup(t, bookingCom(10), inMemory(&upstream{}), transport.Options{
			CheckRetry: func(context.Context, *http.Response, error) (bool, error) { return false, stop },
		})
		if _, err := get(t, t.Context(), tr2, "/availability"); !errors.Is(err, stop) {
			t.Errorf("CheckRetry error: got %v, want it returned", err)
		}
	})
}

func TestRequestBodies(t *testing.T) {
	t.Run("not replayable is sent once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := &upstream{always: &reply{http.StatusTooManyRequests, "1"}}
			tr, _ := setup(t, bookingCom(10), inMemory(srv), transport.Options{})
			// io.NopCloser hides the reader's type, so NewRequest sets no
			// GetBody.
			resp, err := post(t, tr, "/availability", io.NopCloser(strings.NewReader(`{"rooms":3}`)))
			if err != nil {
				t.Fatalf("got error %v, want the 429 response", err)
			}
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Errorf("status %d, want the upstream's 429", resp.StatusCode)
			}
			if got := srv.got(); len(got) != 1 || got[0].body != `{"rooms":3}` {
				t.Errorf("upstream got %+v, want the one complete body", got)
			}
		})
	})
	t.Run("replayable is resent identical", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := &upstream{script: []reply{{http.StatusTooManyRequests, "1"}, {http.StatusTooManyRequests, "1"}}}
			tr, _ := setup(t, bookingCom(10), inMemory(srv), transport.Options{})
			const body = `{"hotel":7,"date":"2025-03-14","rooms":3}`
			resp, err := post(t, tr, "/availability", strings.NewReader(body))
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("got %v, %v; want 200", resp, err)
			}
			got := srv.got()
			if len(got) != 3 {
				t.Fatalf("upstream got %d requests, want 3", len(got))
			}
			for i, a := range got {
				if a.body != body {
					t.Errorf("attempt %d body %q, want %q", i+1, a.body, body)
				}
			}
		})
	})
}

// closeTracker records whether a request body was closed.
type closeTracker struct {
	io.Reader
	closed bool
}

func (c *closeTracker) Close() error { c.closed = true; return nil }

func TestBackpressureIsImmediate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{}
		tr, _ := setup(t, bookingCom(1), inMemory(srv), transport.Options{MaxWait: 500 * time.Millisecond})
		if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		body := &closeTracker{Reader: strings.NewReader("x")}
		_, err := post(t, tr, "/availability", body)
		if elapsed := time.Since(start); elapsed != 0 {
			t.Errorf("backpressure took %v, want no sleep at all", elapsed)
		}
		if !errors.Is(err, fleetrate.ErrBackpressure) {
			t.Fatalf("err = %v, want ErrBackpressure", err)
		}
		var bp *fleetrate.BackpressureError
		if !errors.As(err, &bp) || bp.RetryAfter != time.Second || bp.MaxWait != 500*time.Millisecond {
			t.Errorf("BackpressureError = %+v, want retry-after 1s, max wait 500ms", bp)
		}
		if n := len(srv.got()); n != 1 {
			t.Errorf("upstream got %d requests, want 1: nothing may be sent on backpressure", n)
		}
		if !body.closed {
			t.Error("the request body was not closed")
		}

		// A context deadline sooner than the wait is backpressure too.
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		start = time.Now()
		if _, err := get(t, ctx, tr, "/availability"); !errors.Is(err, fleetrate.ErrBackpressure) || time.Since(start) != 0 {
			t.Errorf("deadline before the turn: got %v after %v, want ErrBackpressure at once", err, time.Since(start))
		}
	})
}

func TestCancelDuringWaitRefunds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{}
		tr, lim := setup(t, bookingCom(1), inMemory(srv), transport.Options{})
		if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(300*time.Millisecond, cancel)
		start := time.Now()
		_, err := get(t, ctx, tr, "/availability")
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if elapsed := time.Since(start); elapsed != 300*time.Millisecond {
			t.Errorf("returned %v after the start, want at the cancellation (300ms)", elapsed)
		}
		if n := len(srv.got()); n != 1 {
			t.Errorf("upstream got %d requests, want 1", n)
		}
		// The cancelled booking (due at 1s) was refunded: the next token is
		// still the one due at 1s, 700ms from now, not 1.7s.
		r, err := lim.ReserveN(t.Context(), 1, transport.EndpointBucket("booking_com", "availability"))
		if err != nil {
			t.Fatal(err)
		}
		if w := r.Result.Wait; w > 700*time.Millisecond {
			t.Errorf("next booking waits %v, want <= 700ms: the cancelled tokens were not refunded", w)
		}
	})
}

func TestCancelDuringBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{always: &reply{http.StatusTooManyRequests, "10"}}
		tr, lim := setup(t, bookingCom(1), inMemory(srv), transport.Options{})
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(time.Second, cancel)
		start := time.Now()
		_, err := get(t, ctx, tr, "/availability")
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if elapsed := time.Since(start); elapsed != time.Second {
			t.Errorf("returned %v after the start, want at the cancellation (1s)", elapsed)
		}
		if n := len(srv.got()); n != 1 {
			t.Errorf("upstream got %d requests, want 1", n)
		}
		// The backoff holds no booking: the bucket's debt is the 10s drain
		// alone, 9s of it left now.
		p, err := lim.Peek(t.Context(), transport.EndpointBucket("booking_com", "availability"))
		if err != nil {
			t.Fatal(err)
		}
		if p.RetryAfter > 9*time.Second {
			t.Errorf("bucket busy for %v more, want <= 9s: the cancelled retry holds tokens", p.RetryAfter)
		}
	})
}

func TestDeadlineDuringBackoffGivesUpAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{always: &reply{http.StatusTooManyRequests, "10"}}
		tr, _ := setup(t, bookingCom(1), inMemory(srv), transport.Options{})
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		start := time.Now()
		_, err := get(t, ctx, tr, "/availability")
		if !errors.Is(err, transport.ErrGaveUp) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want ErrGaveUp and context.DeadlineExceeded", err)
		}
		if elapsed := time.Since(start); elapsed != 0 {
			t.Errorf("returned after %v, want at once: the retry could never be sent in time", elapsed)
		}
	})
}

func TestCredentialBucketIsAllOrNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := transport.Upstream{
			Channel:    "expedia",
			Credential: []fleetrate.Limit{fleetrate.PerSecond(1, 1)},
			Endpoints: []transport.Endpoint{
				{Name: "availability", Pattern: "/availability", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 1)}},
				{Name: "reservations", Pattern: "/reservations", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 1)}},
			},
		}
		srv := &upstream{}
		tr, lim := setup(t, up, inMemory(srv), transport.Options{MaxWait: 100 * time.Millisecond})
		if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
			t.Fatal(err)
		}
		// The credential has no token for 1s: the reservations request is
		// refused and takes nothing from its endpoint bucket.
		if _, err := get(t, t.Context(), tr, "/reservations"); !errors.Is(err, fleetrate.ErrBackpressure) {
			t.Fatalf("err = %v, want ErrBackpressure from the credential bucket", err)
		}
		res, err := lim.Peek(t.Context(), transport.EndpointBucket("expedia", "reservations"))
		if err != nil {
			t.Fatal(err)
		}
		if res.Remaining != 1 {
			t.Errorf("reservations bucket holds %d tokens, want 1 (untouched)", res.Remaining)
		}
		time.Sleep(time.Second)
		if _, err := get(t, t.Context(), tr, "/reservations"); err != nil {
			t.Errorf("after the credential refilled: %v", err)
		}
	})
}

// TestSlowEndpointDoesNotIdleTheCredential: a request queued on a slow
// endpoint must not book the shared credential bucket for its far-off turn,
// which would leave the credential idle for every other endpoint until then.
func TestSlowEndpointDoesNotIdleTheCredential(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := transport.Upstream{
			Channel:    "expedia",
			Credential: []fleetrate.Limit{fleetrate.PerSecond(10, 1)},
			Endpoints: []transport.Endpoint{
				{Name: "rates", Pattern: "/rates", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}},
				{Name: "availability", Pattern: "/availability", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 1)}},
			},
		}
		srv := &upstream{}
		tr, _ := setup(t, up, inMemory(srv), transport.Options{})
		start := time.Now()
		var wg sync.WaitGroup
		for range 2 { // the second rates request's turn is 1s away
			wg.Go(func() {
				if _, err := get(t, t.Context(), tr, "/rates"); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Go(func() {
			for time.Since(start) < time.Second {
				if _, err := get(t, t.Context(), tr, "/availability"); err != nil {
					t.Error(err)
					return
				}
			}
		})
		wg.Wait()
		avail := 0
		var last time.Time
		for _, a := range srv.got() {
			if a.path == "/availability" && a.at.Before(start.Add(time.Second)) {
				avail++
			}
			if !last.IsZero() && a.at.Sub(last) < 100*time.Millisecond {
				t.Errorf("two requests %v apart: the credential's 10/s was broken", a.at.Sub(last))
			}
			last = a.at
		}
		// The credential admits 10 in the first second; the first rates
		// request takes one, availability should get nearly all the rest.
		if avail < 8 {
			t.Errorf("availability sent %d requests in the first second, want >= 8: the queued rates request idled the credential", avail)
		}
	})
}

// failingStore is a store whose backend is down.
type failingStore struct{ fleetrate.Store }

var errDown = errors.New("connection refused")

func (failingStore) Take(context.Context, fleetrate.Request) (fleetrate.Result, error) {
	return fleetrate.Result{}, errors.Join(fleetrate.ErrStoreUnavailable, errDown)
}

func (failingStore) Drain(context.Context, []fleetrate.Bucket, time.Duration) error {
	return errors.Join(fleetrate.ErrStoreUnavailable, errDown)
}

func TestStoreFailure(t *testing.T) {
	up := bookingCom(10)
	classify, err := up.Classifier()
	if err != nil {
		t.Fatal(err)
	}
	lim, err := fleetrate.New(failingStore{}, fleetrate.Config{Buckets: up.Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	for _, failOpen := range []bool{false, true} {
		srv := &upstream{}
		var logs logbuf.Buffer
		tr, err := transport.New(lim, classify, transport.Options{
			Base:     inMemory(srv),
			FailOpen: failOpen,
			Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := get(t, t.Context(), tr, "/availability")
		if failOpen {
			if err != nil || resp.StatusCode != 200 || len(srv.got()) != 1 {
				t.Errorf("fail open: got %v, %v; want the request sent", resp, err)
			}
		} else {
			if !errors.Is(err, fleetrate.ErrStoreUnavailable) || errors.Is(err, fleetrate.ErrBackpressure) || len(srv.got()) != 0 {
				t.Errorf("fail closed: got %v with %d sent; want ErrStoreUnavailable (not a denial) and nothing sent", err, len(srv.got()))
			}
		}
		if !strings.Contains(logs.String(), "msg=rate_store_error") {
			t.Errorf("fail open %v: no rate_store_error logged:\n%s", failOpen, logs.String())
		}
	}
}

func TestLogsAndMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{script: []reply{{200, ""}, {http.StatusTooManyRequests, "2"}}}
		var logs logbuf.Buffer
		reg := prometheus.NewRegistry()
		tr, _ := setup(t, bookingCom(1), inMemory(srv), transport.Options{
			Logger:      slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			Registerer:  reg,
			MaxAttempts: 2,
			MaxWait:     time.Second,
			Backoff:     fixedBackoff(0),
			Adaptive:    transport.Adaptive{Off: true},
		})
		ctx := transport.WithEntity(t.Context(), "hotel-7")
		for range 2 {
			if _, err := get(t, ctx, tr, "/availability"); err != nil {
				t.Fatal(err)
			}
		}
		// The next token is a second away: a request whose deadline is
		// sooner meets backpressure.
		if _, err := get(t, ctx, tr, "/availability"); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		if _, err := get(t, short, tr, "/availability"); !errors.Is(err, fleetrate.ErrBackpressure) {
			t.Errorf("err = %v, want ErrBackpressure", err)
		}
		out := logs.String()
		for _, want := range []string{
			"msg=rate_throttle_wait channel=booking_com endpoint=availability entity=hotel-7 wait_ms=1000",
			"msg=rate_limited channel=booking_com endpoint=availability entity=hotel-7 status=429 retry_after=2",
			"msg=rate_backpressure channel=booking_com endpoint=availability entity=hotel-7",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("logs lack %q:\n%s", want, out)
			}
		}
		labels := map[string]string{"channel": "booking_com", "endpoint": "availability"}
		for name, want := range map[string]float64{
			transport.MetricWaits:        3,
			transport.MetricRateLimited:  1,
			transport.MetricRetries:      1,
			transport.MetricBackpressure: 1,
		} {
			if got := metricValue(t, reg, name, labels); got != want {
				t.Errorf("%s = %v, want %v", name, got, want)
			}
		}
		if got := metricValue(t, reg, transport.MetricWaitSeconds, labels); got != 4 {
			t.Errorf("%s count = %v, want 4 (every granted wait)", transport.MetricWaitSeconds, got)
		}

		// A second transport on the same registry shares the collectors.
		if _, err := transport.New(mustLimiter(t), func(*http.Request) (transport.Target, error) { return transport.Target{}, nil },
			transport.Options{Registerer: reg}); err != nil {
			t.Errorf("second transport on one registry: %v", err)
		}
	})
}

func TestGaveUpIsLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{always: &reply{http.StatusTooManyRequests, "1"}}
		var logs logbuf.Buffer
		reg := prometheus.NewRegistry()
		tr, _ := setup(t, bookingCom(10), inMemory(srv), transport.Options{
			Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registerer: reg, MaxAttempts: 2,
		})
		if _, err := get(t, t.Context(), tr, "/availability"); !errors.Is(err, transport.ErrGaveUp) {
			t.Fatalf("err = %v, want ErrGaveUp", err)
		}
		if want := "msg=rate_gave_up channel=booking_com endpoint=availability attempts=2 status=429"; !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %q:\n%s", want, logs.String())
		}
		if got := metricValue(t, reg, transport.MetricGaveUp, map[string]string{"channel": "booking_com", "endpoint": "availability"}); got != 1 {
			t.Errorf("%s = %v, want 1", transport.MetricGaveUp, got)
		}
	})
}

func mustLimiter(t *testing.T) *fleetrate.Limiter {
	t.Helper()
	lim, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// metricValue returns a counter's value, or a histogram's sample count,
// for the series with the given labels.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			if m.GetCounter() != nil {
				total += m.GetCounter().GetValue()
			}
			if m.GetHistogram() != nil {
				total += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return total
}

func TestBypassAndClassifyErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{}
		lim := mustLimiter(t)
		classify := func(r *http.Request) (transport.Target, error) {
			if r.URL.Path == "/oauth/token" {
				return transport.Target{Bypass: true}, nil
			}
			return transport.Target{}, errors.New("unknown path")
		}
		tr, err := transport.New(lim, classify, transport.Options{Base: inMemory(srv), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if _, err := get(t, t.Context(), tr, "/oauth/token"); err != nil {
				t.Errorf("bypass: %v", err)
			}
		}
		if n := len(srv.got()); n != 3 {
			t.Errorf("bypassed requests sent: %d, want 3 (unpaced)", n)
		}
		body := &closeTracker{Reader: strings.NewReader("x")}
		if _, err := post(t, tr, "/elsewhere", body); err == nil || !strings.Contains(err.Error(), "unknown path") {
			t.Errorf("classify error: got %v, want it returned", err)
		}
		if !body.closed {
			t.Error("the request body was not closed after a classify error")
		}
	})
}

func TestInvalidTargets(t *testing.T) {
	t.Parallel()
	lim := mustLimiter(t)
	tests := []struct {
		target transport.Target
		want   string
	}{
		{transport.Target{Endpoint: "a"}, "channel must not be empty"},
		{transport.Target{Channel: "a{b", Endpoint: "a"}, `channel "a{b"`},
		{transport.Target{Channel: "a"}, "endpoint must not be empty"},
		{transport.Target{Channel: "a", Endpoint: "x#pause"}, `endpoint "x#pause"`},
		{transport.Target{Channel: "a", Endpoint: "b", Cost: -1}, "cost must be >= 0, got -1"},
	}
	for _, tc := range tests {
		tr, err := transport.New(lim, func(*http.Request) (transport.Target, error) { return tc.target, nil },
			transport.Options{Base: inMemory(&upstream{}), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		_, err = get(t, t.Context(), tr, "/x")
		if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("target %+v: err = %v, want ErrInvalid mentioning %q", tc.target, err, tc.want)
		}
	}
}

func TestNewValidatesOptions(t *testing.T) {
	t.Parallel()
	lim := mustLimiter(t)
	classify := func(*http.Request) (transport.Target, error) { return transport.Target{}, nil }
	tests := []struct {
		name string
		lim  *fleetrate.Limiter
		cls  transport.Classify
		opts transport.Options
		want string
	}{
		{"nil limiter", nil, classify, transport.Options{}, "limiter must not be nil"},
		{"nil classify", lim, nil, transport.Options{}, "classify must not be nil"},
		{"negative max wait", lim, classify, transport.Options{MaxWait: -1}, "max wait"},
		{"max wait above the limiter's", lim, classify, transport.Options{MaxWait: time.Minute}, "max wait must be between 0 and the limiter's max wait 5s, got 1m0s"},
		{"negative attempts", lim, classify, transport.Options{MaxAttempts: -2}, "max attempts must be >= 0, got -2"},
		{"negative backoff min", lim, classify, transport.Options{BackoffMin: -1}, "backoff min"},
		{"negative backoff max", lim, classify, transport.Options{BackoffMax: -1}, "backoff max"},
		{"backoff max below min", lim, classify, transport.Options{BackoffMin: time.Second, BackoffMax: time.Millisecond}, "backoff max 1ms is below backoff min 1s"},
		{"negative max retry-after", lim, classify, transport.Options{MaxRetryAfter: -1}, "max retry-after"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := transport.New(tc.lim, tc.cls, tc.opts)
			if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

func TestExponentialJitter(t *testing.T) {
	t.Parallel()
	lo, hi := 500*time.Millisecond, 30*time.Second
	for attempt := range 12 {
		ceil := min(lo<<max(attempt-1, 0), hi)
		for range 100 {
			if d := transport.ExponentialJitter(attempt, lo, hi); d < 0 || d > ceil {
				t.Fatalf("attempt %d: backoff %v outside [0, %v]", attempt, d, ceil)
			}
		}
	}
	if d := transport.ExponentialJitter(80, time.Duration(1<<62), time.Duration(1<<63-1)); d < 0 {
		t.Errorf("huge bounds overflowed: %v", d)
	}
	if d := transport.ExponentialJitter(3, 0, 0); d != 0 {
		t.Errorf("zero bounds gave %v, want 0", d)
	}
}
