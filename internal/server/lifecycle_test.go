package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/harness/logbuf"
	"github.com/fleetrate/fleetrate/memstore"
)

const reloadV1 = `
domain: edge
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 5}
buckets:
  - name: api
    rate_limit: {unit: second, requests_per_unit: 1000}
`

const reloadV2 = `
domain: edge
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
buckets:
  - name: api
    rate_limit: {unit: second, requests_per_unit: 1000}
  - name: new/bucket
    rate_limit: {unit: second, requests_per_unit: 1}
`

func limitOf(t *testing.T, ts *testServer, value string) uint32 {
	t.Helper()
	return ts.should(t, "edge", 0, desc("k", value)).Statuses[0].CurrentLimit.GetRequestsPerUnit()
}

// TestReloadWithoutDroppingRequests hammers the service over HTTP and
// gRPC while the configuration flips between two versions: no request
// fails, and the new limits apply.
func TestReloadWithoutDroppingRequests(t *testing.T) {
	t.Parallel()
	ts := start(t, reloadV1)
	if got := limitOf(t, ts, "a"); got != 5 {
		t.Fatalf("limit %d, want 5", got)
	}
	stop := make(chan struct{})
	var served, failed atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Go(func() {
			client := &http.Client{}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Post(ts.url+"/v1/take", "application/json", strings.NewReader(`{"bucket":"api","n":0}`))
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
				}
				_, err = ts.rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{
					Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "load")}})
				if err != nil {
					failed.Add(1)
				}
				served.Add(2)
			}
		})
	}
	for i := 0; i < 20; i++ {
		// Let requests through between every two reloads.
		before := served.Load()
		waitFor(t, func() bool { return served.Load() >= before+8 })
		src := reloadV1
		if i%2 == 0 {
			src = reloadV2
		}
		if err := os.WriteFile(ts.path, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := ts.Reload(); err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
	}
	close(stop)
	wg.Wait()
	if failed.Load() != 0 || served.Load() == 0 {
		t.Fatalf("%d of %d requests failed during reloads", failed.Load(), served.Load())
	}
	// The last write was v1; write v2 and reload once more.
	if err := os.WriteFile(ts.path, []byte(reloadV2), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ts.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := limitOf(t, ts, "b"); got != 1 {
		t.Errorf("after reload limit %d, want 1", got)
	}
	var d Decision
	if code := ts.post(t, "/v1/take", `{"bucket":"new/bucket"}`, &d); code != 200 || !d.Allowed {
		t.Errorf("new bucket after reload: %d %+v", code, d)
	}
	if !metricHas(t, ts, `fleetrate_config_reloads_total{result="success"} 21`) {
		t.Error("reloads not counted")
	}
}

func TestBadReloadKeepsOldConfig(t *testing.T) {
	t.Parallel()
	ts := start(t, reloadV1)
	for _, bad := range []string{
		"domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: sec, requests_per_unit: 1}\n",
		"domain: [\n",
	} {
		if err := os.WriteFile(ts.path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		err := ts.Reload()
		if err == nil || !strings.Contains(err.Error(), ts.path+":") {
			t.Fatalf("Reload of a bad file: %v, want an error naming %s", err, ts.path)
		}
		if got := limitOf(t, ts, "x"); got != 5 {
			t.Errorf("after a bad reload limit %d, want the old 5", got)
		}
	}
	if err := os.Remove(ts.path); err != nil {
		t.Fatal(err)
	}
	if err := ts.Reload(); err == nil {
		t.Error("Reload of a missing file succeeded")
	}
	if got := limitOf(t, ts, "y"); got != 5 {
		t.Errorf("after the file vanished limit %d, want the old 5", got)
	}
	if !metricHas(t, ts, `fleetrate_config_reloads_total{result="failure"} 3`) {
		t.Error("failed reloads not counted")
	}
}

func TestWatchReloadsOnChange(t *testing.T) {
	t.Parallel()
	ts := start(t, reloadV1, func(o *Options) { o.ReloadInterval = 5 * time.Millisecond })
	writeAtomic(t, ts.path, "domain: [\n")
	waitFor(t, func() bool { return metricHas(t, ts, `fleetrate_config_reloads_total{result="failure"} 1`) })
	if got := limitOf(t, ts, "w"); got != 5 {
		t.Fatalf("bad file picked up: limit %d", got)
	}
	writeAtomic(t, ts.path, reloadV2)
	waitFor(t, func() bool {
		return ts.Config().Domain("edge").Match([]config.Entry{{Key: "k", Value: "v"}}).Rule.Limits[0].RequestsPerUnit == 1
	})
	// A bad file is reported once, not on every poll.
	if metricHas(t, ts, `fleetrate_config_reloads_total{result="failure"} 2`) {
		t.Error("the same bad file was reloaded twice")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestShutdownLosesNoInflightRequests starts requests that are held inside
// the store, begins the shutdown, then lets them finish: every one of them
// gets its answer, and new connections are refused.
func TestShutdownLosesNoInflightRequests(t *testing.T) {
	t.Parallel()
	gate := &gatedStore{Store: memstore.New(memstore.Options{}), gate: make(chan struct{})}
	ts := start(t, bucketConfig, func(o *Options) {
		o.Store = gate
		o.StoreTimeout = 20 * time.Second
	})
	const httpN, grpcN = 8, 8
	var wg sync.WaitGroup
	errs := make(chan string, httpN+grpcN)
	for i := 0; i < httpN; i++ {
		wg.Go(func() {
			resp, err := http.Post(ts.url+"/v1/take", "application/json", bytes.NewBufferString(`{"bucket":"booking_com"}`))
			if err != nil {
				errs <- "http: " + err.Error()
				return
			}
			defer resp.Body.Close()
			var d Decision
			if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || resp.StatusCode != 200 || !d.Allowed {
				errs <- "http: bad answer"
			}
		})
	}
	for i := 0; i < grpcN; i++ {
		wg.Go(func() {
			resp, err := ts.rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{
				Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("ldap", "x"), desc("api_key", "k")}})
			if err != nil {
				errs <- "grpc: " + err.Error()
				return
			}
			if resp.OverallCode == rlspb.RateLimitResponse_UNKNOWN {
				errs <- "grpc: no code"
			}
		})
	}
	waitFor(t, func() bool { return gate.waiting.Load() == httpN+grpcN })
	ts.cancel() // as SIGTERM does
	addr := strings.TrimPrefix(ts.url, "http://")
	waitFor(t, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil && ts.draining.Load()
	})
	close(gate.gate)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	select {
	case err := <-ts.done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
		stopOnce.Store(ts, true)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
}

// TestDrainDelay keeps serving, with /readyz failing, for the drain delay.
// The delay is long enough for three requests on a loaded machine (300 ms
// was not, under -race with the machine at load 10): the test waits it
// out when it stops the server.
func TestDrainDelay(t *testing.T) {
	t.Parallel()
	ts := start(t, bucketConfig, func(o *Options) { o.DrainDelay = 3 * time.Second })
	ts.cancel()
	waitFor(t, func() bool { return ts.draining.Load() })
	if code, body := ts.get(t, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "shutting down") {
		t.Errorf("/readyz while draining: %d %s", code, body)
	}
	if code, _ := ts.get(t, "/healthcheck"); code != http.StatusInternalServerError {
		t.Errorf("/healthcheck while draining: %d, want 500 as envoyproxy/ratelimit", code)
	}
	var d Decision
	if code := ts.post(t, "/v1/take", `{"bucket":"booking_com"}`, &d); code != 200 || !d.Allowed {
		t.Errorf("take while draining: %d %+v", code, d)
	}
}

// writeAtomic replaces a file the way Kubernetes and most editors do, so
// that a watcher never reads half of it.
func writeAtomic(t *testing.T, path, src string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestShutdownEndsHealthWatch: a client watching health with a plain
// Watch RPC reads NOT_SERVING when shutdown begins, then its stream ends,
// and Serve returns without waiting out ShutdownTimeout (a minute here).
// Before, the stream held every graceful stop for the whole timeout.
func TestShutdownEndsHealthWatch(t *testing.T) {
	t.Parallel()
	ts := start(t, bucketConfig, func(o *Options) { o.ShutdownTimeout = time.Minute })
	stream, err := healthpb.NewHealthClient(ts.conn).Watch(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first health: %v, %v", r, err)
	}
	ts.cancel() // as SIGTERM does
	var statuses []healthpb.HealthCheckResponse_ServingStatus
	for {
		r, err := stream.Recv()
		if err != nil {
			break
		}
		statuses = append(statuses, r.Status)
	}
	if len(statuses) == 0 || statuses[len(statuses)-1] != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health read during shutdown: %v, want NOT_SERVING before the stream ends", statuses)
	}
	ts.stop(t) // Serve returns, not held by the Watch stream
}

// switchStore fails every take while down is set.
type switchStore struct {
	fleetrate.Store
	down atomic.Bool
}

func (s *switchStore) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if s.down.Load() {
		return fleetrate.Result{}, errors.Join(fleetrate.ErrStoreUnavailable, errDown)
	}
	return s.Store.Take(ctx, req)
}

// TestHealthChecksStore: with HealthChecksStore (envoyproxy/ratelimit's
// REDIS_HEALTH_CHECK_ACTIVE_CONNECTION) the gRPC health service and
// /healthcheck follow the store, as the background probe finds it; without
// it they report the process only, and the outage is logged either way.
func TestHealthChecksStore(t *testing.T) {
	t.Parallel()
	for _, checks := range []bool{true, false} {
		t.Run(fmt.Sprint("HealthChecksStore=", checks), func(t *testing.T) {
			t.Parallel()
			st := &switchStore{Store: memstore.New(memstore.Options{})}
			var logs logbuf.Buffer
			ts := start(t, bucketConfig, func(o *Options) {
				o.Store, o.HealthChecksStore = st, checks
				o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			})
			conn, err := grpc.NewClient(ts.grpcAdr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			hc := healthpb.NewHealthClient(conn)
			health := func() (healthpb.HealthCheckResponse_ServingStatus, int) {
				r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
				if err != nil {
					t.Fatal(err)
				}
				resp, err := http.Get(ts.url + "/healthcheck")
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return r.Status, resp.StatusCode
			}
			st.down.Store(true)
			waitFor(t, func() bool { return strings.Contains(logs.String(), "store unavailable") })
			grpcWant, httpWant := healthpb.HealthCheckResponse_SERVING, http.StatusOK
			if checks {
				grpcWant, httpWant = healthpb.HealthCheckResponse_NOT_SERVING, http.StatusInternalServerError
			}
			if g, h := health(); g != grpcWant || h != httpWant {
				t.Errorf("store down: health %v, /healthcheck %d; want %v, %d", g, h, grpcWant, httpWant)
			}
			st.down.Store(false)
			waitFor(t, func() bool { return strings.Contains(logs.String(), "store available again") })
			if g, h := health(); g != healthpb.HealthCheckResponse_SERVING || h != http.StatusOK {
				t.Errorf("store back: health %v, /healthcheck %d; want SERVING, 200", g, h)
			}
		})
	}
}
