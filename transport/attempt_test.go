package transport_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport"
)

// answered is an upstream's answer as a worker that sent the request
// itself reports it.
func answered(status int, header ...string) transport.Answer {
	h := http.Header{}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	return transport.Answer{Response: &http.Response{StatusCode: status, Header: h, Body: http.NoBody}, Sent: true}
}

func book(t *testing.T, ctx context.Context, tr *transport.Transport, path string, attempt int) (*transport.Attempt, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://ota.test"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tr.Book(req, attempt)
}

// TestReportedLimitPausesTheFleet: a 429 reported on an Attempt (a
// request some other client sent) pauses the whole fleet as one RoundTrip
// saw: a Go transport of another process sends nothing until the
// Retry-After has passed, and Report says to send again after it.
func TestReportedLimitPausesTheFleet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &upstream{}
		trs, _ := fleetOf(t, 2, bookingCom(10), inMemory(srv), transport.Options{Backoff: fixedBackoff(0)})
		a, err := book(t, t.Context(), trs[0], "/availability", 1)
		if err != nil {
			t.Fatal(err)
		}
		if a.Endpoint() != "availability" {
			t.Errorf("Endpoint() = %q, want availability", a.Endpoint())
		}
		limitedAt := time.Now()
		next, err := a.Report(answered(http.StatusTooManyRequests, "Retry-After", "2"))
		if err != nil || !next.Retry || next.Attempt != 2 || next.After < 2*time.Second {
			t.Fatalf("Report(429, Retry-After 2) = %+v, %v; want a retry, attempt 2, after at least 2s", next, err)
		}
		if _, err := get(t, t.Context(), trs[1], "/availability"); err != nil {
			t.Fatal(err)
		}
		got := srv.got()
		if len(got) != 1 || got[0].at.Sub(limitedAt) < 2*time.Second {
			t.Fatalf("the other process's request reached the upstream %v after the reported 429, want at least the 2s pause", got[0].at.Sub(limitedAt))
		}
		time.Sleep(next.After)
		a, err = book(t, t.Context(), trs[0], "/availability", next.Attempt)
		if err != nil {
			t.Fatal(err)
		}
		if next, err := a.Report(answered(http.StatusOK)); err != nil || next.Retry {
			t.Fatalf("Report(200) = %+v, %v; want no retry", next, err)
		}
		if _, err := a.Report(answered(http.StatusOK)); !errors.Is(err, fleetrate.ErrInvalid) {
			t.Errorf("a second Report = %v, want ErrInvalid", err)
		}
	})
}

// TestReportedLimitGivesUp: the last attempt still rate limited ends with
// a *GaveUpError, as RoundTrip's.
func TestReportedLimitGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		trs, _ := fleetOf(t, 1, bookingCom(10), inMemory(&upstream{}), transport.Options{MaxAttempts: 2, Backoff: fixedBackoff(0)})
		attempt := 1
		for {
			a, err := book(t, t.Context(), trs[0], "/availability", attempt)
			if err != nil {
				t.Fatal(err)
			}
			next, err := a.Report(answered(http.StatusTooManyRequests, "Retry-After", "1"))
			if err != nil {
				var g *transport.GaveUpError
				if !errors.As(err, &g) || g.Attempts != 2 || g.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("Report at attempt %d = %v, want a GaveUpError after 2 attempts", attempt, err)
				}
				return
			}
			if !next.Retry || attempt > 2 {
				t.Fatalf("Report at attempt %d = %+v, want a retry", attempt, next)
			}
			time.Sleep(next.After)
			attempt = next.Attempt
		}
	})
}

// TestAttemptHoldsItsPermit: a booked Attempt holds its in-flight permit
// until it is reported; a failure before the send gives it back at once,
// one after the send keeps it until its lease ends.
func TestAttemptHoldsItsPermit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := bookingCom(1000)
		up.Endpoints[0].Limits = []fleetrate.Limit{fleetrate.PerSecond(1000, 100)}
		up.Endpoints[0].InFlight = 1
		trs, _ := fleetOf(t, 1, up, inMemory(&upstream{}), transport.Options{MaxWait: time.Second})
		tr := trs[0]
		a, err := book(t, t.Context(), tr, "/availability", 1)
		if err != nil {
			t.Fatal(err)
		}
		second := make(chan time.Time)
		go func() {
			if b, err := book(t, t.Context(), tr, "/availability", 1); err == nil {
				second <- time.Now()
				_, _ = b.Report(transport.Answer{Err: errors.New("connection refused"), Sent: false})
			}
			close(second)
		}()
		time.Sleep(300 * time.Millisecond)
		reported := time.Now()
		if _, err := a.Report(answered(http.StatusOK)); err != nil {
			t.Fatal(err)
		}
		if at, ok := <-second; !ok || at.Before(reported) {
			t.Fatalf("the second Book was granted at %v, want when the first was reported (%v)", at, reported)
		}
		<-second
		// The second gave its permit back at once (not sent): a third is
		// granted now.
		c, err := book(t, t.Context(), tr, "/availability", 1)
		if err != nil {
			t.Fatalf("Book after a failure before the send: %v", err)
		}
		// Failed after the send: the permit stays taken until its lease.
		if _, err := c.Report(transport.Answer{Err: context.DeadlineExceeded, Sent: true}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		if _, err := book(t, ctx, tr, "/availability", 1); err == nil {
			t.Fatal("Book right after a failure after the send was granted, want the permit kept until its lease ends")
		}
	})
}

// TestBookRefusesBadInput names what is wrong.
func TestBookRefusesBadInput(t *testing.T) {
	trs, _ := fleetOf(t, 1, bookingCom(10), inMemory(&upstream{}), transport.Options{})
	if _, err := book(t, t.Context(), trs[0], "/availability", 0); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("Book(attempt 0) = %v, want ErrInvalid", err)
	}
	if _, err := book(t, t.Context(), trs[0], "/nowhere", 1); !errors.Is(err, transport.ErrNoRoute) {
		t.Errorf("Book(/nowhere) = %v, want ErrNoRoute", err)
	}
	ctx := transport.WithCosts(t.Context(), map[string]int64{"tokens": 5})
	if _, err := book(t, ctx, trs[0], "/availability", 1); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("Book with costs of a meter the upstream lacks = %v, want ErrInvalid", err)
	}
}

// TestSpacingReadsARemoteWorkersTiming: a worker of the service's
// outbound protocol sends a booked request a little after Book returned
// (the booking's way back to it, its own scheduling) and reports the
// answer a little after it came (the report's way to the service). Its
// round trips, as the service sees them, are all slow beside the
// upstream's, so without the worker's timing the gate took its usual
// delay for the upstream's: it never held after a usual request, and a Go
// worker of another process, which sends the moment it passes the gate,
// reached the strict window (paced at 19/s, 52.6 ms apart) 49.6 ms after it. With Answer.SentAfter and RTT
// the gate judges the arrival itself, and no two arrivals come closer
// than the window. (A process's first 16 answers hold the gate for their
// whole round trip, sendtime.RTTSamples: the late request comes after.)
func TestSpacingReadsARemoteWorkersTiming(t *testing.T) {
	for _, told := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			trs, _ := fleetOf(t, 2, strictUpstream(true), inMemory(&upstream{}), transport.Options{})
			var mu sync.Mutex
			var arrivals []time.Time
			arrive := func() {
				mu.Lock()
				arrivals = append(arrivals, time.Now())
				mu.Unlock()
			}
			var wg sync.WaitGroup
			for w, tr := range trs {
				remote := w == 0 // the service's transport; the other, a Go worker's
				wg.Go(func() {
					for i := range 40 {
						a, err := book(t, t.Context(), tr, "/avail", 1)
						if err != nil {
							t.Error(err)
							return
						}
						var sentAfter, reportAfter time.Duration
						if remote {
							sentAfter, reportAfter = 3*time.Millisecond, time.Millisecond
							if i == 30 {
								sentAfter = 6 * time.Millisecond // one later than usual
							}
						}
						time.Sleep(sentAfter)
						arrive()
						time.Sleep(time.Millisecond) // the upstream's answer
						time.Sleep(reportAfter)
						ans := answered(http.StatusOK)
						if told && remote {
							ans.SentAfter, ans.RTT = sentAfter, time.Millisecond
						}
						if _, err := a.Report(ans); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			slices.SortFunc(arrivals, time.Time.Compare)
			least := time.Hour
			for i := 1; i < len(arrivals); i++ {
				least = min(least, arrivals[i].Sub(arrivals[i-1]))
			}
			t.Logf("timing told: %t: closest arrivals %v apart, %d arrivals over %v", told, least, len(arrivals), arrivals[len(arrivals)-1].Sub(arrivals[0]))
			switch {
			case told && least < 50*time.Millisecond:
				t.Errorf("with the remote worker's timing two arrivals came %v apart, want at least the 50 ms window", least)
			case !told && least >= 50*time.Millisecond:
				t.Errorf("without the remote worker's timing the arrivals kept the window (closest %v): the test shows nothing", least)
			}
		})
	}
}
