package transport_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/logbuf"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/transport"
)

// strictWindow is a fake upstream that admits one request per 50 ms as it
// sees them: it records when each arrived, on the bubble's clock, after a
// one-way delay of 1 ms plus, for the requests late marks (counted from
// 1, in the order they were sent), 8 ms more on the way there and back.
type strictWindow struct {
	mu       sync.Mutex
	sent     int
	late     map[int]bool
	arrivals []time.Time
	// oneWay and extra replace the 1 ms and the 8 ms when set.
	oneWay, extra time.Duration
}

func (s *strictWindow) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.sent++
	oneWay, extra := time.Millisecond, 8*time.Millisecond
	if s.oneWay > 0 {
		oneWay, extra = s.oneWay, s.extra
	}
	if s.late[s.sent] {
		oneWay += extra
	}
	s.mu.Unlock()
	time.Sleep(oneWay)
	s.mu.Lock()
	s.arrivals = append(s.arrivals, time.Now())
	s.mu.Unlock()
	time.Sleep(oneWay)
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
}

// after returns the time from the i-th arrival (from 1) to the next.
func (s *strictWindow) after(i int) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.arrivals[i].Sub(s.arrivals[i-1])
}

// closest returns the shortest time between two arrivals, and how many
// arrived.
func (s *strictWindow) closest() (time.Duration, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	least := time.Duration(1<<63 - 1)
	for i := 1; i < len(s.arrivals); i++ {
		least = min(least, s.arrivals[i].Sub(s.arrivals[i-1]))
	}
	return least, len(s.arrivals)
}

// strictUpstream paces a 50 ms strict window at 19/s, with the window
// declared as Spacing when spaced.
func strictUpstream(spaced bool) transport.Upstream {
	up := transport.Upstream{
		Channel: "ota",
		Endpoints: []transport.Endpoint{
			{Name: "avail", Pattern: "/avail", Limits: []fleetrate.Limit{fleetrate.PerSecond(19, 1)}},
		},
	}
	if spaced {
		up.Endpoints[0].Spacing = 50 * time.Millisecond
	}
	return up
}

// runStrict sends 60 requests from 2 processes × 2 goroutines to up.
func runStrict(t *testing.T, up *strictWindow, spaced bool, opts transport.Options) {
	t.Helper()
	trs, _ := fleetOf(t, 2, strictUpstream(spaced), up, opts)
	sendAll(t, trs, 2, 15)
}

// sendAll has goroutines goroutines of each transport send n requests
// each, one after the other, and waits for them.
func sendAll(t *testing.T, trs []*transport.Transport, goroutines, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for _, tr := range trs {
		for range goroutines {
			wg.Go(func() {
				for range n {
					if _, err := get(t, t.Context(), tr, "/avail"); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
}

// holdOf returns the hold marker of the strict upstream's spacing gate in
// store, for a test to drain.
func holdOf(t *testing.T, store fleetrate.Store) fleetrate.Bucket {
	t.Helper()
	lim, err := fleetrate.New(store, fleetrate.Config{Buckets: strictUpstream(true).Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := lim.Bucket(transport.EndpointBucket("ota", "avail"))
	if err != nil {
		t.Fatal(err)
	}
	return fleetrate.Bucket{Prefix: b.Prefix, Key: b.Key + "#hold", Limits: []fleetrate.Limit{transport.PauseLimit}}
}

// holds returns the late_ms of each rate_spacing_hold a debug log holds.
func holds(log string) []float64 {
	var out []float64
	for line := range strings.Lines(log) {
		if !strings.Contains(line, "msg=rate_spacing_hold") {
			continue
		}
		_, v, _ := strings.Cut(line, "late_ms=")
		v, _, _ = strings.Cut(v, " ")
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
			out = append(out, f)
		}
	}
	return out
}

// debugLog returns a logger that writes debug events to buf.
func debugLog(buf *logbuf.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestSpacingHoldsTheFleetAfterALateRequest: paced at 19/s (52.6 ms
// apart), a request 8 ms late on the wire reaches a 50 ms strict window
// 44.6 ms before the next one, whichever process sends that; with the
// window declared as Spacing, the late answer holds the gate, and no two
// requests reach the upstream less than 50 ms apart. The late requests
// come after each process's first 16 answers, which are compared with
// none (see rttSamples), so their holds are lateness seen.
func TestSpacingHoldsTheFleetAfterALateRequest(t *testing.T) {
	late := map[int]bool{45: true, 55: true}
	synctest.Test(t, func(t *testing.T) {
		up := &strictWindow{late: late}
		runStrict(t, up, false, transport.Options{})
		least, n := up.closest()
		t.Logf("without spacing: closest %v of %d", least, n)
		if n != 60 || least >= 50*time.Millisecond {
			t.Fatalf("without spacing: %d arrivals, closest %v apart; want 60, some under 50ms (the test would prove nothing)", n, least)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		var buf logbuf.Buffer
		up := &strictWindow{late: late}
		runStrict(t, up, true, transport.Options{Registerer: reg, Logger: debugLog(&buf)})
		least, n := up.closest()
		t.Logf("with spacing: closest %v of %d", least, n)
		if n != 60 || least < 50*time.Millisecond {
			t.Errorf("with spacing: %d arrivals, closest %v apart; want 60, none under 50ms", n, least)
		}
		// Each late request came back 16 ms late; the others' holds are
		// the processes' first answers (2 ms each, over the 1 ms margin).
		var lateHolds int
		for _, ms := range holds(buf.String()) {
			if ms >= 15 {
				lateHolds++
			}
		}
		if lateHolds != 2 {
			t.Errorf("holds of 15 ms or more: %d, want the 2 late requests'; all: %v", lateHolds, holds(buf.String()))
		}
		if got, want := testutil.ToFloat64(counter(t, reg, transport.MetricSpacingHolds)), float64(len(holds(buf.String()))); got != want {
			t.Errorf("%s = %v, want one per logged hold, %v", transport.MetricSpacingHolds, got, want)
		}
	})
}

// TestSpacingHoldsOnlyAsLongAsTheLateness: from an upstream 15 ms away
// each way, a request 4 ms late each way comes back 8 ms later than the
// quickest answer; the gate then holds the next request until 50 ms + 8
// ms after the late one left, not a whole interval from its answer
// (which would leave 85 ms between the two arrivals).
// (A process's first 16 answers are compared with none, and do hold the
// gate a whole interval from their answer.)
func TestSpacingHoldsOnlyAsLongAsTheLateness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := &strictWindow{late: map[int]bool{50: true}, oneWay: 15 * time.Millisecond, extra: 4 * time.Millisecond}
		runStrict(t, up, true, transport.Options{})
		least, n := up.closest()
		gap := up.after(50)
		t.Logf("closest %v of %d; the late one to the next: %v", least, n, gap)
		if n != 60 || least < 50*time.Millisecond {
			t.Errorf("%d arrivals, closest %v apart; want 60, none under 50ms", n, least)
		}
		// Sent 50 ms + 8 ms after the late one, which arrived 4 ms late.
		if gap < 53*time.Millisecond || gap > 56*time.Millisecond {
			t.Errorf("the late request to the next: %v, want 54 ms (50 + 8 - 4), give or take a millisecond", gap)
		}
	})
}

// TestSpacingValidation: a spacing out of bounds, or limits that pace
// faster than the gate lets through, fail with the field named.
func TestSpacingValidation(t *testing.T) {
	for _, c := range []struct {
		name    string
		spacing time.Duration
		rate    float64
		want    string
	}{
		{"negative", -time.Millisecond, 10, "endpoints[0].spacing: must be 0 or between 1ms and 1m0s, got -1ms"},
		{"too short", 500 * time.Microsecond, 10, "endpoints[0].spacing"},
		{"too long", 2 * time.Minute, 0.001, "endpoints[0].spacing"},
		{"the full window's rate", 50 * time.Millisecond, 20, "endpoints[0].limits[0]: rate 20/s is faster than spacing 50ms lets through (at most 19.61/s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := strictUpstream(true)
			up.Endpoints[0].Spacing = c.spacing
			up.Endpoints[0].Limits = []fleetrate.Limit{fleetrate.PerSecond(c.rate, 1)}
			err := up.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, c.want)
			}
		})
	}
	up := strictUpstream(true)
	if err := up.Validate(); err != nil {
		t.Fatalf("19/s under a 50ms spacing: %v", err)
	}
	if got := transport.SpacingMargin(50 * time.Millisecond); got != time.Millisecond {
		t.Errorf("SpacingMargin(50ms) = %v, want 1ms", got)
	}
	if got := transport.SpacingMargin(10 * time.Millisecond); got != 500*time.Microsecond {
		t.Errorf("SpacingMargin(10ms) = %v, want a twentieth, 500µs", got)
	}
}

// TestSpacingFromAClassifyOfOwnIsChecked: a Target's spacing out of
// bounds fails the request before anything is sent.
func TestSpacingFromAClassifyOfOwnIsChecked(t *testing.T) {
	up := strictUpstream(false)
	lim, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Buckets: up.Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	sent := 0
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent++
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	})
	classify := func(*http.Request) (transport.Target, error) {
		return transport.Target{Channel: "ota", Endpoint: "avail", Spacing: -time.Second}, nil
	}
	tr, err := transport.New(lim, classify, transport.Options{Base: base, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	_, err = get(t, t.Context(), tr, "/avail")
	if err == nil || !strings.Contains(err.Error(), "spacing must be 0 or between") || sent != 0 {
		t.Fatalf("err = %v, %d sent; want the spacing named, nothing sent", err, sent)
	}
}

// slowStore answers every call of its store d later, and sends it d later:
// a store a round trip of 2d away, inside a synctest bubble.
type slowStore struct {
	fleetrate.Store
	d time.Duration
}

func (s slowStore) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	time.Sleep(s.d)
	r, err := s.Store.Take(ctx, req)
	time.Sleep(s.d)
	return r, err
}

// TestSpacingCountsTheGatesRoundTrip: a gate 2 ms away by round trip is
// not lateness: after each process's first answers, no request holds the
// gate, and none reaches the upstream under 50 ms after another.
func TestSpacingCountsTheGatesRoundTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf logbuf.Buffer
		up := &strictWindow{}
		store := slowStore{Store: memstore.New(memstore.Options{}), d: time.Millisecond}
		trs := fleetOver(t, store, 2, strictUpstream(true), up, transport.Options{Logger: debugLog(&buf)})
		sendAll(t, trs, 1, 30)
		least, n := up.closest()
		if n != 60 || least < 50*time.Millisecond {
			t.Errorf("%d arrivals, closest %v apart; want 60, none under 50ms", n, least)
		}
		// Each process's first 16 answers are compared with none.
		if got := len(holds(buf.String())); got > 32 {
			t.Errorf("%d holds, want at most the 2 × 16 first answers': %v", got, holds(buf.String()))
		}
	})
}

// failingGate is a store whose takes of a spacing gate fail.
type failingGate struct{ fleetrate.Store }

func (s failingGate) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if strings.HasSuffix(req.Buckets[0].Key, "#gate") {
		return fleetrate.Result{}, fmt.Errorf("%w: the gate's shard is down", fleetrate.ErrStoreUnavailable)
	}
	return s.Store.Take(ctx, req)
}

// TestSpacingGateFailures: a store failure at the gate fails the request
// (sending nothing) unless the transport fails open; a gate held past the
// request's budget fails it at once with backpressure that says so.
func TestSpacingGateFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := &strictWindow{}
		trs := fleetOver(t, failingGate{memstore.New(memstore.Options{})}, 1, strictUpstream(true), up, transport.Options{})
		_, err := get(t, t.Context(), trs[0], "/avail")
		if !errors.Is(err, fleetrate.ErrStoreUnavailable) || !strings.Contains(err.Error(), "spacing gate") {
			t.Errorf("store down at the gate: err = %v, want ErrStoreUnavailable, naming the spacing gate", err)
		}
		if _, n := up.closest(); n != 0 {
			t.Errorf("store down at the gate: %d sent, want none", n)
		}
		open := fleetOver(t, failingGate{memstore.New(memstore.Options{})}, 1, strictUpstream(true), up, transport.Options{FailOpen: true})
		if _, err := get(t, t.Context(), open[0], "/avail"); err != nil {
			t.Errorf("store down at the gate, failing open: %v, want the request sent", err)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New(memstore.Options{})
		up := &strictWindow{}
		trs := fleetOver(t, store, 1, strictUpstream(true), up, transport.Options{MaxWait: time.Second})
		hold := holdOf(t, store)
		if err := store.Drain(t.Context(), []fleetrate.Bucket{hold}, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		_, err := get(t, t.Context(), trs[0], "/avail")
		var bp *fleetrate.BackpressureError
		if !errors.As(err, &bp) || !strings.Contains(err.Error(), "spacing gate") || bp.MaxWait > time.Second || time.Since(began) > 0 {
			t.Errorf("gate held 10 s, max wait 1 s: err = %v after %v; want backpressure at once, naming the spacing gate, within the 1 s", err, time.Since(began))
		}
	})
}

// TestSpacingOnRedis: the gate and its hold are one atomic take on a real
// redis-server, and a late answer's hold is a drain of the hold marker:
// requests flow, the 16 ms late one holds the gate, and no store call
// fails.
func TestSpacingOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	store, err := redisstore.New(srv.Client(), redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var buf logbuf.Buffer
	up := &strictWindow{late: map[int]bool{18: true}, oneWay: 100 * time.Microsecond, extra: 8 * time.Millisecond}
	trs := fleetOver(t, store, 1, strictUpstream(true), up, transport.Options{Logger: debugLog(&buf)})
	for range 20 {
		if _, err := get(t, t.Context(), trs[0], "/avail"); err != nil {
			t.Fatal(err)
		}
	}
	if _, n := up.closest(); n != 20 {
		t.Errorf("%d arrivals, want 20", n)
	}
	// Real time: the late request's 16 ms, less whatever its gate take
	// and answer gained on their quickest, is well over 8 ms.
	var lateHolds int
	for _, ms := range holds(buf.String()) {
		if ms >= 8 {
			lateHolds++
		}
	}
	if lateHolds < 1 || strings.Contains(buf.String(), "error=") {
		t.Errorf("holds %v, want the late request's (8 ms or more) and no store error; log:\n%s", holds(buf.String()), buf.String())
	}
}

// fleetOver is fleetOf over a given store.
func fleetOver(t *testing.T, store fleetrate.Store, n int, up transport.Upstream, base http.RoundTripper, opts transport.Options) []*transport.Transport {
	t.Helper()
	classify, err := up.Classifier()
	if err != nil {
		t.Fatal(err)
	}
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	opts.Base = base
	var out []*transport.Transport
	for range n {
		lim, err := fleetrate.New(store, fleetrate.Config{Buckets: up.Buckets()})
		if err != nil {
			t.Fatal(err)
		}
		tr, err := transport.New(lim, classify, opts)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tr)
	}
	return out
}

// TestSpacingCancelGivesTheTurnBack: a request cancelled while it sleeps
// for its booked turn at the gate gives the turn back, and the next
// request goes on that turn, not an interval after it.
func TestSpacingCancelGivesTheTurnBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New(memstore.Options{})
		up := &strictWindow{}
		trs := fleetOver(t, store, 1, strictUpstream(true), up, transport.Options{})
		hold := holdOf(t, store)
		if _, err := get(t, t.Context(), trs[0], "/avail"); err != nil {
			t.Fatal(err)
		}
		// Hold the gate until 60 ms from now: the next request's slot
		// comes at 52.6 ms, and it books the gate's turn at 60 ms.
		start := time.Now()
		if err := store.Drain(t.Context(), []fleetrate.Bucket{hold}, 60*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(56*time.Millisecond, cancel)
		if _, err := get(t, ctx, trs[0], "/avail"); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "spacing gate") {
			t.Fatalf("cancelled at the gate: err = %v, want context.Canceled while waiting for the spacing gate", err)
		}
		// The next request's slot is 52.6 ms after the cancelled one's;
		// the gate's turn at 60 ms was given back, so it goes on its slot.
		if _, err := get(t, t.Context(), trs[0], "/avail"); err != nil {
			t.Fatal(err)
		}
		up.mu.Lock()
		last := up.arrivals[len(up.arrivals)-1].Sub(start)
		up.mu.Unlock()
		if last > 110*time.Millisecond {
			t.Errorf("the request after the cancelled one arrived %v after the hold began, want on its slot (about 106 ms), not a gate interval after the given-up turn (111 ms or later)", last)
		}
	})
}
