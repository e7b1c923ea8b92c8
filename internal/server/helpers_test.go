package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/harness/manualclock"
	"github.com/fleetrate/fleetrate/memstore"
)

// clock is a manual clock for the memory store.
type clock = manualclock.Clock

func newClock() *clock { return manualclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)) }

// testServer is a running server on loopback ports.
type testServer struct {
	*Server
	clock   *clock
	url     string
	grpcAdr string
	rls     rlspb.RateLimitServiceClient
	conn    *grpc.ClientConn // rls's connection, for other services' clients
	cancel  context.CancelFunc
	done    chan error
	path    string
}

type testOpt func(*Options)

func writeConfig(t *testing.T, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fleetrate.yaml")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// quietLogger discards logs unless the test is verbose.
func quietLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// start runs a server over a memory store with a manual clock (unless an
// option sets another store) and returns it with a gRPC client.
func start(t *testing.T, src string, opts ...testOpt) *testServer {
	t.Helper()
	path := writeConfig(t, src)
	cfg, err := config.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	clk := newClock()
	o := Options{
		Store:      memstore.New(memstore.Options{Clock: clk.Now}),
		StoreName:  "memory",
		Config:     cfg,
		ConfigPath: path,
		Logger:     quietLogger(t),
		Clock:      clk.Now,
		// 1 s unless a test sets it: the default (15 ms, for Envoy's
		// 20 ms) is for production, not for -race on a loaded machine.
		StoreTimeout: time.Second,
		// Off unless a test sets it: under -race on a loaded machine a
		// burst of concurrent decisions queues longer than the 5 ms
		// target, and the concurrency limit would shed what a test
		// counts (shed_test.go and cmd/fleetrate test it).
		LatencyTarget: -1,
	}
	for _, opt := range opts {
		opt(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{Server: s, clock: clk, url: "http://" + hl.Addr().String(), grpcAdr: gl.Addr().String(),
		cancel: cancel, done: make(chan error, 1), path: path}
	go func() { ts.done <- s.Serve(ctx, hl, gl) }()
	conn, err := grpc.NewClient(ts.grpcAdr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ts.rls = rlspb.NewRateLimitServiceClient(conn)
	ts.conn = conn
	t.Cleanup(func() {
		conn.Close()
		ts.stop(t)
	})
	return ts
}

var stopOnce sync.Map

func (ts *testServer) stop(t *testing.T) {
	if _, loaded := stopOnce.LoadOrStore(ts, true); loaded {
		return
	}
	ts.cancel()
	select {
	case err := <-ts.done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Error("Serve did not return after cancel: a stream held the graceful stop?")
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// desc builds a descriptor from key/value pairs.
func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (ts *testServer) should(t *testing.T, domain string, hits uint32, ds ...*rlcommon.RateLimitDescriptor) *rlspb.RateLimitResponse {
	t.Helper()
	resp, err := ts.rls.ShouldRateLimit(ctxT(t), &rlspb.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// post sends a JSON body and decodes the JSON answer into out (if not
// nil), returning the status.
func (ts *testServer) post(t *testing.T, path string, body any, out any, header ...string) int {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case string:
		r = bytes.NewBufferString(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, ts.url+path, r)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("POST %s: status %d, body %q: %v", path, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode
}

func (ts *testServer) get(t *testing.T, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodGet, ts.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// failingStore fails every call, as a store that is down does.
type failingStore struct{}

var errDown = errors.New("connection refused")

func (failingStore) Take(context.Context, fleetrate.Request) (fleetrate.Result, error) {
	return fleetrate.Result{}, errors.Join(fleetrate.ErrStoreUnavailable, errDown)
}
func (failingStore) Refund(context.Context, []fleetrate.Bucket, int64, time.Time) error {
	return errors.Join(fleetrate.ErrStoreUnavailable, errDown)
}
func (failingStore) Cancel(context.Context, []fleetrate.Bucket, int64, fleetrate.Booking) error {
	return errors.Join(fleetrate.ErrStoreUnavailable, errDown)
}
func (failingStore) Drain(context.Context, []fleetrate.Bucket, time.Duration) error {
	return errors.Join(fleetrate.ErrStoreUnavailable, errDown)
}
func (failingStore) Reset(context.Context, ...string) error {
	return errors.Join(fleetrate.ErrStoreUnavailable, errDown)
}
func (failingStore) DrainEach(context.Context, []fleetrate.Drain) error {
	return errors.Join(fleetrate.ErrStoreUnavailable, errDown)
}
func (failingStore) Settle(context.Context, []fleetrate.Bucket, fleetrate.Settlement) error {
	return errors.Join(fleetrate.ErrStoreUnavailable, errDown)
}
func (failingStore) Release(context.Context, []fleetrate.Bucket, string) (int, error) {
	return 0, errors.Join(fleetrate.ErrStoreUnavailable, errDown)
}
func (failingStore) Renew(context.Context, []fleetrate.Bucket, fleetrate.Permit) (int, error) {
	return 0, errors.Join(fleetrate.ErrStoreUnavailable, errDown)
}

// gatedStore blocks every Take until the gate opens, counting the takes
// that are waiting.
type gatedStore struct {
	fleetrate.Store
	gate    chan struct{}
	waiting atomic.Int64
}

func (g *gatedStore) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if req.N > 0 {
		g.waiting.Add(1)
		<-g.gate
	}
	return g.Store.Take(ctx, req)
}
