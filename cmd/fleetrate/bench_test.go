package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

// benchShort are the flags of a bench run that is short on a loaded
// machine: two concurrencies, a hot key and a small spread.
var benchShort = []string{"--duration", "100ms", "--concurrency", "1,4", "--keys", "1,50"}

// keyWatch records every key Redis reports written, by keyspace
// notifications (writes, deletes and expiries: every way of touching a
// key's value).
type keyWatch struct {
	c       *redis.Client
	ps      *redis.PubSub
	mu      sync.Mutex
	keys    map[string]int
	markers chan struct{}
}

func watchKeys(t *testing.T, c *redis.Client) *keyWatch {
	t.Helper()
	ctx := context.Background()
	if err := c.ConfigSet(ctx, "notify-keyspace-events", "KEA").Err(); err != nil {
		t.Fatal(err)
	}
	w := &keyWatch{c: c, ps: c.PSubscribe(ctx, "__keyevent@0__:*"), keys: map[string]int{}, markers: make(chan struct{}, 1)}
	if _, err := w.ps.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	go func() {
		for m := range w.ps.Channel(redis.WithChannelSize(1 << 16)) {
			if m.Payload == "bench-test-marker" {
				w.markers <- struct{}{}
				continue
			}
			w.mu.Lock()
			w.keys[m.Payload]++
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = w.ps.Close() })
	return w
}

// touched returns the keys written so far, once every notification
// before the call has arrived.
func (w *keyWatch) touched(t *testing.T) map[string]int {
	t.Helper()
	if err := w.c.Set(context.Background(), "bench-test-marker", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.markers:
	case <-time.After(30 * time.Second):
		t.Fatal("the marker key's notification never came")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int, len(w.keys))
	for k, n := range w.keys {
		out[k] = n
	}
	return out
}

// foreign are keys that are not the bench's: they must be left as they
// are, another bench run's prefix included.
var foreign = map[string]string{
	"app:session:42":           "alice",
	"fleetrate:partner":        "1700000000000000 0",
	"fleetrate:bench:other1:0": "not this run's",
}

func seedForeign(t *testing.T, c *redis.Client) {
	t.Helper()
	for k, v := range foreign {
		if err := c.Set(context.Background(), k, v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// checkForeign fails unless every foreign key holds its value and only
// foreign keys (and the test's marker) are left.
func checkForeign(t *testing.T, c *redis.Client) {
	t.Helper()
	ctx := context.Background()
	for k, want := range foreign {
		if got, err := c.Get(ctx, k).Result(); err != nil || got != want {
			t.Errorf("key %q: got %q, %v; want %q untouched", k, got, err, want)
		}
	}
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, ok := foreign[k]; !ok && k != "bench-test-marker" {
			t.Errorf("key %q left behind", k)
		}
	}
}

func TestBenchReportsAndCleansUp(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	seedForeign(t, c)
	w := watchKeys(t, c)
	var stdout, stderr bytes.Buffer
	args := append([]string{"bench", "--redis", srv.URL(), "--json"}, benchShort...)
	if err := run(context.Background(), args, func(string) string { return "" }, &stdout, &stderr); err != nil {
		t.Fatalf("bench: %v\nstderr:\n%s", err, stderr.String())
	}
	var rep benchReport
	dec := json.NewDecoder(&stdout)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("stdout is not the JSON report: %v\n%s", err, stdout.String())
	}
	if !benchPrefixRE.MatchString(rep.Prefix) {
		t.Errorf("prefix %q is not of the bench's own form", rep.Prefix)
	}
	// 2 spreads × (Allow unbatched, Allow batched, Wait) × 2 concurrencies,
	// and the hot key through a lease.
	if got, want := len(rep.Rows), 2*3*2+1; got != want {
		t.Errorf("got %d rows, want %d", got, want)
	}
	for _, r := range rep.Rows {
		if r.PerSecond <= 0 || r.P50Micros <= 0 || r.P99Micros < r.P50Micros || r.OfCeiling <= 0 {
			t.Errorf("row %+v: want positive throughput and p50 <= p99", r)
		}
	}
	if len(rep.Ceilings) != 2 || rep.Ceilings[0].PerSecond <= 0 {
		t.Errorf("ceilings %+v: want one positive ceiling per spread", rep.Ceilings)
	}
	if len(rep.Recommendations) < 3 {
		t.Errorf("recommendations %+v: want batching, pool size and timeout at least", rep.Recommendations)
	}
	// At most the 50 keys of the largest spread; fewer when a bucket that
	// refilled expired by its TTL before the cleanup (a slow machine made
	// the run long). That nothing is left behind is checked below.
	if rep.KeysDeleted < 1 || rep.KeysDeleted > 50 {
		t.Errorf("deleted %d keys, want 1 to the 50 of the largest spread", rep.KeysDeleted)
	}
	own := 0
	for k := range w.touched(t) {
		if !strings.HasPrefix(k, rep.Prefix) {
			t.Errorf("bench wrote key %q, outside its prefix %s", k, rep.Prefix)
		}
		own++
	}
	if own != 50 { // the watch saw the run's writes
		t.Errorf("saw %d keys written under %s, want 50", own, rep.Prefix)
	}
	checkForeign(t, c)
	if n := strings.Count(stderr.String(), "fleetrate bench: ["); n != 2+len(rep.Rows) {
		t.Errorf("got %d progress lines, want one per measurement (%d):\n%s", n, 2+len(rep.Rows), stderr.String())
	}
}

func TestBenchTextReport(t *testing.T) {
	srv := redistest.Start(t)
	var stdout, stderr bytes.Buffer
	args := append([]string{"bench", "--redis", srv.URL(), "--concurrency", "2", "--keys", "1"}, benchShort[:2]...)
	if err := run(context.Background(), args, func(string) string { return "" }, &stdout, &stderr); err != nil {
		t.Fatalf("bench: %v\nstderr:\n%s", err, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"take script ceiling", "decisions/s", "Recommended:", "redisstore.Options batching: ", "go-redis PoolSize: "} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "fleetrate bench: [") {
		t.Errorf("progress lines went to stdout:\n%s", out)
	}
}

func TestBenchInterruptedCleansUp(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	seedForeign(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Interrupt as the third measurement starts, as Ctrl-C would.
	stderr := &onLine{want: "[2/", do: cancel}
	var stdout bytes.Buffer
	args := append([]string{"bench", "--redis", srv.URL()}, benchShort...)
	err := run(ctx, args, func(string) string { return "" }, &stdout, stderr)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled\nstderr:\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "deleted 50 keys") {
		t.Errorf("no cleanup reported:\n%s", stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("an interrupted run printed a report:\n%s", stdout.String())
	}
	checkForeign(t, c)
}

// TestBenchStopsWhenRedisDies: a Redis killed during the run stops it at
// the first measurement whose calls fail, rather than measuring failures
// for the rest of the run; the report shows what was measured before,
// marked as stopped, with no advice built on failures, and the command
// fails.
func TestBenchStopsWhenRedisDies(t *testing.T) {
	srv := redistest.Start(t)
	// Kill Redis once the ceilings are measured, before the first Allow.
	stderr := &onLine{want: "[2/", do: srv.Kill}
	var stdout bytes.Buffer
	args := append([]string{"bench", "--redis", srv.URL()}, benchShort...)
	err := run(context.Background(), args, func(string) string { return "" }, &stdout, stderr)
	if err == nil || !strings.Contains(err.Error(), "calls failed") || !strings.Contains(err.Error(), "stopped measuring") {
		t.Fatalf("got %v, want the failed measurement named\nstderr:\n%s", err, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"STOPPED EARLY: allow unbatched", "take script ceiling"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Recommended:") {
		t.Errorf("a stopped run recommended settings:\n%s", out)
	}
	if n := strings.Count(stderr.String(), "fleetrate bench: ["); n != 3 {
		t.Errorf("got %d progress lines, want 3 (two ceilings and the failed measurement):\n%s", n, stderr.String())
	}
}

// onLine is an io.Writer that calls do once when want is written.
type onLine struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	do   func()
	done bool
}

func (w *onLine) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.done && strings.Contains(w.buf.String(), w.want) {
		w.done = true
		w.do()
	}
	return len(p), nil
}

func (w *onLine) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func TestBenchRefusesKeysNotItsOwn(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	seedForeign(t, c)
	for _, tc := range []struct {
		name, prefix, want string
	}{
		{"another prefix", "app:session:", "--prefix"},
		{"the service's prefix", "fleetrate:", "--prefix"},
		{"no random part", "fleetrate:bench:", "--prefix"},
		{"a prefix whose keys exist", "fleetrate:bench:other1:", "exist already"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"bench", "--redis", srv.URL(), "--prefix", tc.prefix}, benchShort...)
			err := run(context.Background(), args, func(string) string { return "" }, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %q", err, tc.want)
			}
		})
	}
	checkForeign(t, c)
}

func TestBenchFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no redis", nil, "--redis"},
		{"bad url", []string{"--redis", "http://127.0.0.1:1"}, "scheme"},
		{"short duration", []string{"--redis", "redis://127.0.0.1:1", "--duration", "1ms"}, "--duration"},
		{"zero callers", []string{"--redis", "redis://127.0.0.1:1", "--concurrency", "0"}, "--concurrency"},
		{"no keys", []string{"--redis", "redis://127.0.0.1:1", "--keys", "0"}, "--keys"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(context.Background(), append([]string{"bench"}, tc.args...), func(string) string { return "" }, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestBenchOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3, 0)
	addrs := cl.Addrs()
	url := "redis+cluster://" + addrs[0] + "?addr=" + addrs[1] + "&addr=" + addrs[2]
	var stdout, stderr bytes.Buffer
	args := append([]string{"bench", "--redis", url, "--json"}, benchShort...)
	if err := run(context.Background(), args, func(string) string { return "" }, &stdout, &stderr); err != nil {
		t.Fatalf("bench: %v\nstderr:\n%s", err, stderr.String())
	}
	var rep benchReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	for _, m := range cl.Masters() {
		keys, err := m.Client().Keys(context.Background(), "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if strings.HasPrefix(k, rep.Prefix) {
				t.Errorf("node %s: key %q left behind", m.Addr(), k)
			}
		}
	}
	for _, r := range rep.Rows {
		if r.Errors > 0 && !strings.Contains(r.FirstError, "deadline") && !strings.Contains(r.FirstError, "timeout") {
			t.Errorf("row %+v: errors other than timeouts", r)
		}
	}
}
