package transport_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/transport"
)

// logWatch is a logger that reports the messages it is given on a channel.
type logWatch struct{ msgs chan string }

func (w logWatch) Enabled(context.Context, slog.Level) bool { return true }
func (w logWatch) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w logWatch) WithGroup(string) slog.Handler            { return w }
func (w logWatch) Handle(_ context.Context, r slog.Record) error {
	select {
	case w.msgs <- r.Message:
	default:
	}
	return nil
}

// stampSent is a base transport that marks each request with who sent it
// and when it left its transport.
type stampSent struct{ from string }

func (s stampSent) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-From", s.from)
	r.Header.Set("X-Sent", strconv.FormatInt(time.Now().UnixNano(), 10))
	return http.DefaultTransport.RoundTrip(r)
}

// TestSilentSubscriptionIsNotTrusted: process B hears announcements
// through a NAT that drops its subscription without a reset (a proxy that
// then forwards nothing and closes nothing, also on new connections). B
// notices within 2 × ListenCheck, logs it, and from then on reads the
// pause markers before a request that slept is sent: when process A gets a
// 429 with Retry-After: 2, the upstream receives nothing sent after the
// pause was marked until it ends, though B had requests booked across it.
func TestSilentSubscriptionIsNotTrusted(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 5 s of real time")
	}
	const check = 100 * time.Millisecond
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr())

	type arrival struct {
		from     string
		at, sent time.Time
	}
	var (
		mu       sync.Mutex
		arrivals []arrival
		limitAt  time.Time
		armed    atomic.Bool
	)
	ota := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		ns, _ := strconv.ParseInt(r.Header.Get("X-Sent"), 10, 64)
		a := arrival{from: r.Header.Get("X-From"), at: time.Now(), sent: time.Unix(0, ns)}
		mu.Lock()
		defer mu.Unlock()
		arrivals = append(arrivals, a)
		if a.from == "A" && armed.Load() && limitAt.IsZero() {
			limitAt = a.at
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer ota.Close()

	up := bookingCom(5)
	up.Fixed = true
	prefix := fmt.Sprintf("fleetrate:silent-test:%d:", time.Now().UnixNano())
	newTransport := func(store fleetrate.Store, opts transport.Options) *transport.Transport {
		t.Helper()
		lim, err := fleetrate.New(store, fleetrate.Config{Prefix: prefix, Buckets: up.Buckets()})
		if err != nil {
			t.Fatal(err)
		}
		classify, err := up.Classifier()
		if err != nil {
			t.Fatal(err)
		}
		tr, err := transport.New(lim, classify, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return tr
	}
	storeA := &drainWatch{Store: openRedisStore(t, srv.URL())}
	trA := newTransport(storeA, transport.Options{Base: stampSent{"A"}, Logger: quiet})
	// B takes from Redis directly, but hears announcements through the
	// proxy.
	annClient := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	t.Cleanup(func() { annClient.Close() })
	ann, err := redisstore.New(annClient, redisstore.Options{Timeout: time.Second, ListenCheck: check})
	if err != nil {
		t.Fatal(err)
	}
	logB := logWatch{msgs: make(chan string, 64)}
	trB := newTransport(openRedisStore(t, srv.URL()), transport.Options{Base: stampSent{"B"}, Logger: slog.New(logB), Announcer: ann})

	// Both listen before the traffic begins.
	for deadline := time.Now().Add(10 * time.Second); ; {
		n, err := srv.Client().PubSubNumSub(t.Context(), transport.AnnounceTopic).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n[transport.AnnounceTopic] >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d subscriptions to the announcements, want 2", n[transport.AnnounceTopic])
		}
		time.Sleep(10 * time.Millisecond)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	send := func(tr http.RoundTripper, senders int) {
		for range senders {
			wg.Go(func() {
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ota.URL+"/availability", strings.NewReader("{}"))
					resp, err := tr.RoundTrip(req)
					if err != nil {
						if ctx.Err() == nil {
							time.Sleep(20 * time.Millisecond) // backpressure during the pause
						}
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
	}
	send(trA, 2)
	send(trB, 6)

	time.Sleep(time.Second)
	proxy.BlackholeAll()
	silent := time.Now()
	lostWithin := 20 * 2 * check // the bound is 2 × check; the rest is room for a loaded machine
	for waiting := time.After(lostWithin); ; {
		select {
		case msg := <-logB.msgs:
			if msg != "rate_announcements_lost" {
				continue
			}
		case <-waiting:
			cancel()
			wg.Wait()
			t.Fatalf("B did not log rate_announcements_lost within %v of its subscription going silent", lostWithin)
		}
		break
	}
	t.Logf("B noticed its silent subscription %v after it went silent (bound 2 × %v)", time.Since(silent).Round(time.Millisecond), check)
	armed.Store(true)

	// Run until a second past the pause.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		at := limitAt
		mu.Unlock()
		if !at.IsZero() && time.Since(at) > 3*time.Second {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			wg.Wait()
			t.Fatal("A was never answered 429")
		}
	}
	cancel()
	wg.Wait()

	storeA.mu.Lock()
	drains := append([]time.Time(nil), storeA.drained...)
	storeA.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if len(drains) != 1 {
		t.Fatalf("A drained %d pauses, want 1", len(drains))
	}
	marked, resumed := drains[0], limitAt.Add(2*time.Second)
	t.Logf("429 at %v, pause marked %v later", limitAt.Format("15:04:05.000"), marked.Sub(limitAt))
	var bBefore, bAfter int
	for _, a := range arrivals {
		switch {
		case a.sent.Before(marked):
			// Let go before the pause was marked: allowed.
			if a.from == "B" {
				bBefore++
			}
		case a.at.Before(resumed):
			t.Errorf("%s's request sent %v after the 429 arrived %v after it, inside the 2 s pause", a.from, a.sent.Sub(limitAt), a.at.Sub(limitAt))
		case a.from == "B":
			bAfter++
		}
	}
	if bBefore == 0 || bAfter == 0 {
		t.Errorf("B sent %d requests before the pause and %d after it; want both > 0", bBefore, bAfter)
	}
}
