package transport_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/internal/harness/schednoise"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/transport"
)

// The helper process of TestFleetPauseAcrossProcesses reads its settings
// from these variables.
const (
	envChild  = "FLEETRATE_TRANSPORT_TEST_CHILD"
	envRedis  = "FLEETRATE_TRANSPORT_TEST_REDIS"
	envOTA    = "FLEETRATE_TRANSPORT_TEST_OTA"
	envPrefix = "FLEETRATE_TRANSPORT_TEST_PREFIX"
	envUntil  = "FLEETRATE_TRANSPORT_TEST_UNTIL"
)

const workerHeader = "X-Fleet-Worker"

// send is one request handed to the network by a worker, after its wait.
type send struct {
	worker string
	at     time.Time
}

// sendLog is a base transport that records when each request leaves its
// process: the moment the rate limiter let it go.
type sendLog struct {
	base  http.RoundTripper
	mu    sync.Mutex
	sends []send
}

func (l *sendLog) RoundTrip(r *http.Request) (*http.Response, error) {
	l.mu.Lock()
	l.sends = append(l.sends, send{worker: r.Header.Get(workerHeader), at: time.Now()})
	l.mu.Unlock()
	return l.base.RoundTrip(r)
}

// drainWatch records when each pause (a drain of pause markers) of the
// wrapped store completed.
type drainWatch struct {
	fleetrate.Store
	mu      sync.Mutex
	drained []time.Time
}

// Unwrap lets the transport find the Redis store's Announcer.
func (d *drainWatch) Unwrap() fleetrate.Store { return d.Store }

func (d *drainWatch) Drain(ctx context.Context, bs []fleetrate.Bucket, dur time.Duration) error {
	err := d.Store.Drain(ctx, bs, dur)
	if slices.ContainsFunc(bs, func(b fleetrate.Bucket) bool { return strings.HasSuffix(b.Key, "#pause") }) {
		d.mu.Lock()
		d.drained = append(d.drained, time.Now())
		d.mu.Unlock()
	}
	return err
}

func (d *drainWatch) DrainEach(ctx context.Context, drains []fleetrate.Drain) error {
	err := d.Store.DrainEach(ctx, drains)
	if slices.ContainsFunc(drains, func(dr fleetrate.Drain) bool { return strings.HasSuffix(dr.Bucket.Key, "#pause") }) {
		d.mu.Lock()
		d.drained = append(d.drained, time.Now())
		d.mu.Unlock()
	}
	return err
}

// redisFleet runs workers named name-0, name-1, ... each with its own
// limiter and transport over store, sending to ota until until. It returns
// every send.
func redisFleet(t *testing.T, store fleetrate.Store, prefix, ota, name string, workers int, until time.Time) []send {
	up := bookingCom(10)
	classify, err := up.Classifier()
	if err != nil {
		t.Fatal(err)
	}
	log := &sendLog{base: http.DefaultTransport}
	var wg sync.WaitGroup
	for i := range workers {
		lim, err := fleetrate.New(store, fleetrate.Config{Prefix: prefix, Buckets: up.Buckets()})
		if err != nil {
			t.Fatal(err)
		}
		tr, err := transport.New(lim, classify, transport.Options{Base: log, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		worker := fmt.Sprintf("%s-%d", name, i)
		wg.Go(func() {
			ctx, cancel := context.WithDeadline(context.Background(), until)
			defer cancel()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ota+"/availability", strings.NewReader(`{"rooms":1}`))
				req.Header.Set(workerHeader, worker)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					if ctx.Err() != nil || strings.Contains(err.Error(), "max wait") {
						return // the run is over
					}
					t.Errorf("%s: %v", worker, err)
					return
				}
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	log.mu.Lock()
	defer log.mu.Unlock()
	return slices.Clone(log.sends)
}

func openRedisStore(t *testing.T, url string) fleetrate.Store {
	t.Helper()
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	store, err := redisstore.New(client, redisstore.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// TestFleetPauseAcrossProcesses: a 429 with Retry-After: 2 received by one
// worker pauses every worker sharing the Redis store, the other goroutines
// of its process and the workers of another OS process, for 2 s; then the
// fleet resumes at the bucket's rate, without a burst.
func TestFleetPauseAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 5 s of real time")
	}
	srv := redistest.Start(t)
	watch := schednoise.Start()

	var mu sync.Mutex
	var t429 time.Time
	childSeen := 0
	start := time.Now()
	ota := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		worker := r.Header.Get(workerHeader)
		mu.Lock()
		if strings.HasPrefix(worker, "child") {
			childSeen++
		}
		// Once the other process is sending, answer one of this process's
		// workers 429.
		limit := t429.IsZero() && childSeen >= 3 && strings.HasPrefix(worker, "parent") && time.Since(start) > time.Second
		if limit {
			t429 = time.Now()
		}
		mu.Unlock()
		if limit {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	defer ota.Close()

	prefix := fmt.Sprintf("fleetrate:transport-test:%d:", time.Now().UnixNano())
	until := start.Add(5500 * time.Millisecond)
	child := exec.Command(os.Args[0], "-test.run=^TestFleetPauseHelperProcess$", "-test.count=1")
	child.Env = append(os.Environ(),
		envChild+"=1", envRedis+"="+srv.URL(), envOTA+"="+ota.URL, envPrefix+"="+prefix,
		envUntil+"="+strconv.FormatInt(until.UnixNano(), 10))
	var childOut bytes.Buffer
	child.Stdout, child.Stderr = &childOut, &childOut
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}

	store := &drainWatch{Store: openRedisStore(t, srv.URL())}
	sends := redisFleet(t, store, prefix, ota.URL, "parent", 3, until)
	if err := child.Wait(); err != nil {
		t.Fatalf("helper process: %v\n%s", err, childOut.String())
	}
	sc := bufio.NewScanner(&childOut)
	for sc.Scan() {
		var worker string
		var ns int64
		if _, err := fmt.Sscanf(sc.Text(), "SENT %s %d", &worker, &ns); err == nil {
			sends = append(sends, send{worker: worker, at: time.Unix(0, ns)})
		}
	}
	slices.SortFunc(sends, func(a, b send) int { return a.at.Compare(b.at) })

	mu.Lock()
	limitedAt := t429
	mu.Unlock()
	store.mu.Lock()
	drains := slices.Clone(store.drained)
	store.mu.Unlock()
	noise := watch.Stop()
	if limitedAt.IsZero() || len(drains) != 1 {
		t.Fatalf("the 429 was not served and drained once (429 at %v, drains %v)\n%s", limitedAt, drains, childOut.String())
	}
	drained := drains[0]
	resumed := limitedAt.Add(2 * time.Second)
	t.Logf("429 at +%v, drain done %v later", limitedAt.Sub(start), drained.Sub(limitedAt))

	var childBefore, childAfter int
	var after []send
	for _, s := range sends {
		switch {
		case s.at.Before(limitedAt):
			if strings.HasPrefix(s.worker, "child") {
				childBefore++
			}
		case s.at.Before(drained):
			// Let go before the drain landed: in flight, allowed.
		case s.at.Before(resumed):
			t.Errorf("%s sent %v after the 429, inside the 2s pause", s.worker, s.at.Sub(limitedAt))
		default:
			after = append(after, s)
			if strings.HasPrefix(s.worker, "child") {
				childAfter++
			}
		}
	}
	if childBefore == 0 || childAfter == 0 {
		t.Errorf("the other process sent %d requests before the pause and %d after; want both > 0", childBefore, childAfter)
	}
	if len(after) < 5 {
		t.Fatalf("only %d sends after the pause", len(after))
	}
	// Resume without a burst: at the lowered 8.5/s the granted slots are
	// 118 ms apart, from one interval after the pause. A send can be late
	// by this machine's scheduling noise (measured during the run), which
	// narrows the gap to the next one.
	if first := after[0].at.Sub(limitedAt); first < 2*time.Second+100*time.Millisecond {
		t.Errorf("first send after the pause at +%v, want >= 2.1s: the bucket did not refill from empty", first)
	}
	minGap := 100*time.Millisecond - noise
	t.Logf("scheduling noise %v: a gap below %v after the pause is a burst", noise, minGap)
	for i := 1; i < len(after); i++ {
		if gap := after[i].at.Sub(after[i-1].at); gap < minGap {
			t.Errorf("after the pause, %s and %s sent %v apart: a burst", after[i-1].worker, after[i].worker, gap)
		}
	}
}

// TestFleetPauseHelperProcess is the other OS process of
// TestFleetPauseAcrossProcesses; run alone it skips.
func TestFleetPauseHelperProcess(t *testing.T) {
	if os.Getenv(envChild) != "1" {
		t.Skip("helper process for TestFleetPauseAcrossProcesses")
	}
	ns, err := strconv.ParseInt(os.Getenv(envUntil), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", envUntil, err)
	}
	store := openRedisStore(t, os.Getenv(envRedis))
	sends := redisFleet(t, store, os.Getenv(envPrefix), os.Getenv(envOTA), "child", 2, time.Unix(0, ns))
	for _, s := range sends {
		fmt.Printf("SENT %s %d\n", s.worker, s.at.UnixNano())
	}
}
