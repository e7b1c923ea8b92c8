package statuspage

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

// fakeClock is a manual clock shared by the store, the counter and the
// page.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// fixture is a memstore behind a Counter, a Limiter over it with two
// named buckets, and a Page showing them, all on one fake clock.
type fixture struct {
	clock *fakeClock
	store *memstore.Store
	c     *Counter
	lim   *fleetrate.Limiter
	page  *Page
}

func newFixture(t *testing.T, wrap func(fleetrate.Store) fleetrate.Store) *fixture {
	t.Helper()
	f := &fixture{clock: &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}}
	f.store = memstore.New(memstore.Options{Clock: f.clock.now})
	f.c = NewCounter()
	f.c.now = f.clock.now
	var inner fleetrate.Store = f.store
	if wrap != nil {
		inner = wrap(inner)
	}
	lim, err := fleetrate.New(f.c.Wrap(inner), fleetrate.Config{
		Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 2)},
		Buckets: []fleetrate.BucketConfig{
			{Name: "api", Limits: []fleetrate.Limit{fleetrate.PerPeriod(3, time.Minute).Named("minute")}},
			{Name: "cred", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	f.lim = lim
	f.page, err = New(Options{
		Store: f.store, Buckets: LimiterBuckets(lim, "api", "cred", ""), Counter: f.c,
		Clock: f.clock.now, Title: "test fleet",
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// allow takes one token from each name, returning how many were granted.
func (f *fixture) allow(t *testing.T, n int, names ...string) (granted int) {
	t.Helper()
	for range n {
		res, err := f.lim.AllowN(context.Background(), 1, names...)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			granted++
		}
	}
	return granted
}

func bucketRow(t *testing.T, st Status, name string) BucketStatus {
	t.Helper()
	for _, b := range st.Buckets {
		if b.Name == name {
			return b
		}
	}
	t.Fatalf("no bucket %q in %+v", name, st.Buckets)
	return BucketStatus{}
}

// noBinder hides the store's Binder, so the Limiter takes the general
// path.
type noBinder struct{ fleetrate.Store }

func TestPageCountsWhatTheStoreDecided(t *testing.T) {
	t.Parallel()
	for name, wrap := range map[string]func(fleetrate.Store) fleetrate.Store{
		"bound taker":  nil,
		"general take": func(s fleetrate.Store) fleetrate.Store { return noBinder{s} },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, wrap)
			ctx := context.Background()
			f.page.Status(ctx) // tracks the buckets from here on
			if got := f.allow(t, 5, "api"); got != 3 {
				t.Fatalf("granted %d of 5 from a 3/min bucket, want 3", got)
			}
			if _, err := f.lim.Peek(ctx, "api"); err != nil { // not counted
				t.Fatal(err)
			}
			f.allow(t, 4, "client-a") // default limits: 2 granted, 2 denied
			f.clock.add(time.Second)
			st := f.page.Status(ctx)

			api := bucketRow(t, st, "api")
			if api.Decisions != 5 || api.Denied != 2 {
				t.Errorf("api decisions, denied = %d, %d; want 5, 2", api.Decisions, api.Denied)
			}
			if api.Remaining != 0 || api.Burst != 3 || api.Fill != 0 || api.Limit != "minute" {
				t.Errorf("api fill = %+v, want 0 of 3 (minute)", api)
			}
			if api.TimeToFullMS != 59000 {
				t.Errorf("api time to full = %v ms, want 59000", api.TimeToFullMS)
			}
			if got, want := api.DecisionsPerS, 5.0; got != want {
				t.Errorf("api decisions/s = %v, want %v (5 over the 1 s since the first refresh)", got, want)
			}
			if cred := bucketRow(t, st, "cred"); cred.Fill != 1 || cred.Decisions != 0 {
				t.Errorf("untouched cred = %+v, want full, no decisions", cred)
			}
			if len(st.Buckets) != 2 {
				t.Errorf("buckets = %d, want 2 (an unknown name is skipped)", len(st.Buckets))
			}
			want := Totals{Decisions: 9, Denied: 4, DecisionsPerS: 9, DeniedPerS: 4, OtherDecisions: 4, OtherDenied: 2}
			if st.Totals != want {
				t.Errorf("totals = %+v, want %+v", st.Totals, want)
			}
			wantTop := []DeniedKey{
				{Key: keyLabel(storeKey{fleetrate.DefaultPrefix, "api"}), Bucket: "api", Denied: 2},
				{Key: keyLabel(storeKey{fleetrate.DefaultPrefix, "client-a"}), Denied: 2},
			}
			if len(st.TopDenied) != 2 {
				t.Fatalf("top denied = %+v, want %+v", st.TopDenied, wantTop)
			}
			// Equal counts sort by key: either order of the two is valid.
			if st.TopDenied[0].Bucket == "" {
				st.TopDenied[0], st.TopDenied[1] = st.TopDenied[1], st.TopDenied[0]
			}
			for i := range wantTop {
				if st.TopDenied[i] != wantTop[i] {
					t.Errorf("top denied[%d] = %+v, want %+v", i, st.TopDenied[i], wantTop[i])
				}
			}
		})
	}
}

func TestKeysAreNeverShownRaw(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	secret := "sk_live_51HtopSECRET"
	f.allow(t, 5, secret)
	rec := httptest.NewRecorder()
	f.page.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/status.json", nil))
	body := rec.Body.String()
	if strings.Contains(body, secret) || strings.Contains(body, "sk_live") {
		t.Fatalf("status.json shows the raw key: %s", body)
	}
	// The documented way to recognise a key gives the label shown.
	if want := keyLabel(storeKey{fleetrate.DefaultPrefix, secret}); !strings.Contains(body, want) {
		t.Errorf("status.json lacks the key's label %s: %s", want, body)
	}
}

func TestTakeOfSeveralBucketsCountsOncePerBucket(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx := context.Background()
	f.page.Status(ctx)
	f.allow(t, 4, "api", "cred") // api (3/min) denies the fourth
	f.clock.add(time.Second)
	st := f.page.Status(ctx)
	api, cred := bucketRow(t, st, "api"), bucketRow(t, st, "cred")
	if api.Decisions != 4 || api.Denied != 1 || cred.Decisions != 4 || cred.Denied != 0 {
		t.Errorf("api %d/%d, cred %d/%d decisions/denied; want 4/1 and 4/0", api.Decisions, api.Denied, cred.Decisions, cred.Denied)
	}
	if st.Totals.Decisions != 4 || st.Totals.Denied != 1 {
		t.Errorf("totals %+v, want 4 decisions (one per take), 1 denied", st.Totals)
	}
	if cred.Remaining != 10 {
		t.Errorf("cred remaining = %d, want 10 (3 granted takes, refilled over the second since)", cred.Remaining)
	}
}

func TestTopDeniedForgetsAfterAMinute(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.allow(t, 5, "k1")
	f.clock.add(30 * time.Second)
	f.allow(t, 1, "k2") // refilled 30 tokens: granted
	f.lim.Drain(context.Background(), time.Minute, "k2")
	f.allow(t, 1, "k2")
	top, _ := f.c.topDenied(10)
	if len(top) != 2 || top[0].key.key != "k1" || top[0].denied != 3 {
		t.Fatalf("top = %+v, want k1 (3) then k2 (1)", top)
	}
	f.clock.add(40 * time.Second) // k1's denials are now 70 s old
	top, _ = f.c.topDenied(10)
	if len(top) != 1 || top[0].key.key != "k2" {
		t.Errorf("top after 70 s = %+v, want only k2", top)
	}
}

func TestTopDeniedIsBounded(t *testing.T) {
	t.Parallel()
	c := NewCounter()
	// One instant for every denial: on a slow machine the loop could cross
	// into the next ten-second slot, which has a bound of its own.
	at := time.Now()
	for i := range shards * maxSlotKeys * 2 {
		c.deny("p:", strings.Repeat("x", i%7)+string(rune('a'+i%26))+time.Duration(i).String(), at)
	}
	top, overflow := c.topDenied(TopDeniedKeys)
	if len(top) != TopDeniedKeys || overflow == 0 {
		t.Errorf("top %d keys, overflow %d; want %d keys and some overflow", len(top), overflow, TopDeniedKeys)
	}
	remembered := 0
	for i := range c.keys {
		for _, s := range c.keys[i].slots {
			remembered += len(s.keys)
		}
	}
	if remembered > shards*maxSlotKeys {
		t.Errorf("remembers %d keys, want at most %d", remembered, shards*maxSlotKeys)
	}
}

func TestStoreFailureIsShownNotCounted(t *testing.T) {
	t.Parallel()
	c := NewCounter()
	down := failing{}
	lim, err := fleetrate.New(c.Wrap(down), fleetrate.Config{Buckets: []fleetrate.BucketConfig{{Name: "a", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Allow(context.Background(), "a"); err == nil {
		t.Fatal("a failing store granted")
	}
	p, err := New(Options{Store: down, Buckets: LimiterBuckets(lim, "a"), Counter: c})
	if err != nil {
		t.Fatal(err)
	}
	st := p.Status(context.Background())
	if st.Totals.Errors != 1 || st.Totals.Decisions != 0 || st.Totals.Denied != 0 {
		t.Errorf("totals = %+v, want 1 error and no decision", st.Totals)
	}
	if b := bucketRow(t, st, "a"); !strings.Contains(b.Error, "store unavailable") {
		t.Errorf("bucket error = %q, want the store's failure", b.Error)
	}
}

// failing is a store that never answers.
type failing struct{ fleetrate.Store }

func (failing) Take(context.Context, fleetrate.Request) (fleetrate.Result, error) {
	return fleetrate.Result{}, fleetrate.ErrStoreUnavailable
}

func TestRefreshesAtMostTwicePerInterval(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	peeks := 0
	f.page.opts.Store = peekCounter{Store: f.store, n: &peeks}
	ctx := context.Background()
	for range 10 {
		f.page.Status(ctx)
	}
	if peeks != 2 {
		t.Errorf("10 viewers within the interval made %d peeks, want 2 (one refresh of 2 buckets)", peeks)
	}
	f.clock.add(DefaultInterval)
	f.page.Status(ctx)
	if peeks != 4 {
		t.Errorf("after an interval: %d peeks, want 4", peeks)
	}
}

type peekCounter struct {
	fleetrate.Store
	n *int
}

func (p peekCounter) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	*p.n++
	return p.Store.Take(ctx, req)
}

func TestServeHTTP(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	h := http.StripPrefix("/status", f.page)
	for _, tc := range []struct {
		method, path string
		status       int
		ctype, body  string
	}{
		{"GET", "/status/", 200, "text/html", `<script src="app.js"`},
		{"GET", "/status/index.html", 200, "text/html", "<table id=\"buckets\">"},
		{"GET", "/status/app.js", 200, "javascript", "status.json"},
		{"GET", "/status/style.css", 200, "text/css", ".bar"},
		{"GET", "/status/status.json", 200, "application/json", `"title":"test fleet"`},
		{"HEAD", "/status/status.json", 200, "application/json", ""},
		{"GET", "/status/secret.txt", 404, "", ""},
		{"POST", "/status/status.json", 405, "", ""},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
			body, _ := io.ReadAll(rec.Body)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, body)
			}
			if ct := rec.Header().Get("Content-Type"); !strings.Contains(ct, tc.ctype) {
				t.Errorf("Content-Type %q, want %q", ct, tc.ctype)
			}
			if !strings.Contains(string(body), tc.body) {
				t.Errorf("body lacks %q:\n%s", tc.body, body)
			}
		})
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/status/status.json", nil))
	var st Status
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Buckets) != 2 || !st.Counting {
		t.Errorf("decoded status = %+v, want 2 buckets, counting", st)
	}
}

func TestNewNamesTheMissingOption(t *testing.T) {
	t.Parallel()
	buckets := func() []Bucket { return nil }
	store := memstore.New(memstore.Options{})
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Buckets: buckets}, "store is required"},
		{Options{Store: store}, "buckets is required"},
		{Options{Store: store, Buckets: buckets, Interval: -1}, "interval must not be negative"},
		{Options{Store: store, Buckets: buckets, RateWindow: -1}, "rate window must not be negative"},
	} {
		if _, err := New(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want %q", tc.opts, err, tc.want)
		}
	}
}

func TestTransportUpstreams(t *testing.T) {
	t.Parallel()
	store := memstore.New(memstore.Options{})
	up := transport.Upstream{
		Channel:    "booking_com",
		Credential: []fleetrate.Limit{fleetrate.PerSecond(30, 30)},
		Endpoints: []transport.Endpoint{
			{Name: "availability", Pattern: "POST /a", Limits: []fleetrate.Limit{fleetrate.PerSecond(18, 1), fleetrate.PerPeriod(1000, time.Hour)}},
			{Name: "rates", Pattern: "POST /r", Limits: []fleetrate.Limit{fleetrate.PerSecond(4.5, 1)}},
		},
	}
	lim, err := fleetrate.New(store, fleetrate.Config{Buckets: up.Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := lim.Drain(ctx, 30*time.Second, transport.PauseBucket(transport.EndpointBucket("booking_com", "rates"))); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	limited := prometheus.NewCounterVec(prometheus.CounterOpts{Name: transport.MetricRateLimited, Help: "h"}, []string{"channel", "endpoint", "code"})
	reg.MustRegister(limited)
	limited.WithLabelValues("booking_com", "rates", "429").Add(3)
	limited.WithLabelValues("booking_com", "rates", "503").Add(1)

	rows, err := TransportUpstreams(store, "", []transport.Upstream{up}, reg, transport.Adaptive{})(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("rows = %+v, want 2", rows)
	}
	av, rt := rows[0], rows[1]
	if av.PausedFor != 0 || av.DocumentedRate != 0.2777777777777778 || av.RateLimited != 0 {
		t.Errorf("availability = %+v, want not paused, documented 1000/h, no 429s", av)
	}
	if rt.PausedFor <= 29*time.Second || rt.PausedFor > 30*time.Second || rt.Reason == "" {
		t.Errorf("rates paused for %v (%q), want about 30 s and a reason", rt.PausedFor, rt.Reason)
	}
	if rt.RateLimited != 4 || rt.DocumentedRate != 4.5 || rt.EffectiveRate != 4.5 {
		t.Errorf("rates = %+v, want 4 rate limits, documented and effective 4.5/s (no 429 lowered it)", rt)
	}
	if rt.CredentialRate != 30 || rt.CredentialEffectiveRate != 30 {
		t.Errorf("credential rates = %v, %v, want 30/s and 30/s", rt.CredentialRate, rt.CredentialEffectiveRate)
	}
}

func TestTransportUpstreamsEffectiveRate(t *testing.T) {
	t.Parallel()
	// The settings the figures below were worked out for (the defaults
	// until 2026-12).
	oldDefaults := transport.Adaptive{Decrease: 0.8, Recovery: 2 * time.Minute}
	clock := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	store := memstore.New(memstore.Options{Clock: clock.now}) // frozen: penalties do not decay
	up := transport.Upstream{
		Channel:    "booking_com",
		Credential: []fleetrate.Limit{fleetrate.PerSecond(30, 30)},
		Endpoints: []transport.Endpoint{
			{Name: "availability", Pattern: "POST /a", Limits: []fleetrate.Limit{fleetrate.PerSecond(18, 1)}},
			{Name: "rates", Pattern: "POST /r", Limits: []fleetrate.Limit{fleetrate.PerSecond(4.5, 1), fleetrate.PerPeriod(1000, time.Hour)}},
		},
	}
	fixed := transport.Upstream{
		Channel:   "expedia",
		Fixed:     true,
		Endpoints: []transport.Endpoint{{Name: "search", Pattern: "GET /s", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}}},
	}
	ctx := context.Background()
	set := func(key string, f float64) {
		t.Helper()
		lim, err := fleetrate.New(store, fleetrate.Config{Buckets: append(up.Buckets(), fixed.Buckets()...)})
		if err != nil {
			t.Fatal(err)
		}
		b, err := lim.Bucket(key)
		if err != nil {
			t.Fatal(err)
		}
		if err := transport.SetEffectiveFactor(ctx, store, b, oldDefaults, f); err != nil {
			t.Fatal(err)
		}
	}
	// 0.7, rounded up to 90/128.
	set(transport.EndpointBucket("booking_com", "availability"), 0.7)
	// The floor (5 %), rounded up to 7/128.
	set(transport.EndpointBucket("booking_com", "rates"), transport.DefaultFloor)
	// 0.9 on the credential, rounded up to 116/128.
	set(transport.CredentialBucket("booking_com"), 0.9)
	set(transport.EndpointBucket("expedia", "search"), 0.7)

	rows, err := TransportUpstreams(store, "", []transport.Upstream{up, fixed}, nil, oldDefaults)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hourly := up.Endpoints[1].Limits[1].Rate // the slowest of rates' limits
	if len(rows) != 3 {
		t.Fatalf("rows = %+v, want 3", rows)
	}
	for _, tc := range []struct {
		row                 Upstream
		effective, credEff  float64
		documented, credDoc float64
	}{
		{rows[0], 18 * 90.0 / 128, 30 * 116.0 / 128, 18, 30},
		{rows[1], hourly * 7 / 128, 30 * 116.0 / 128, hourly, 30},
		{rows[2], 0, 0, 10, 0}, // Fixed: never adapted, so no effective rate
	} {
		r := tc.row
		if r.EffectiveRate != tc.effective || r.DocumentedRate != tc.documented ||
			r.CredentialEffectiveRate != tc.credEff || r.CredentialRate != tc.credDoc {
			t.Errorf("%s/%s: effective %v of documented %v, credential %v of %v; want %v of %v, credential %v of %v",
				r.Channel, r.Endpoint, r.EffectiveRate, r.DocumentedRate, r.CredentialEffectiveRate, r.CredentialRate,
				tc.effective, tc.documented, tc.credEff, tc.credDoc)
		}
	}

	// The rate climbs back with time (CUBIC, Recovery 2 min, Decrease 0.8): 15 s later
	// availability is at 0.7/0.8 × (1 − 0.2 × 0.875³) = 0.758, 97/128.
	clock.add(15 * time.Second)
	rows, err = TransportUpstreams(store, "", []transport.Upstream{up}, nil, oldDefaults)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rows[0].EffectiveRate, 18*97.0/128; got != want {
		t.Errorf("availability 15 s later: effective %v, want %v", got, want)
	}
	// The transports' own settings give the same reading: with a 60 s
	// recovery, 0.875 × (1 − 0.2 × 0.75³) = 0.801, 103/128.
	rows, err = TransportUpstreams(store, "", []transport.Upstream{up}, nil, transport.Adaptive{Decrease: 0.8, Recovery: time.Minute})(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rows[0].EffectiveRate, 18*103.0/128; got != want {
		t.Errorf("availability, 60 s recovery: effective %v, want %v", got, want)
	}
	// 4 minutes after: past the old peak (1.2 × 0.875) and back at the
	// documented rates.
	clock.add(225 * time.Second)
	rows, err = TransportUpstreams(store, "", []transport.Upstream{up}, nil, oldDefaults)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rows[0].EffectiveRate, 18.0; got != want {
		t.Errorf("availability 4 min later: effective %v, want %v", got, want)
	}
	if got, want := rows[0].CredentialEffectiveRate, 30.0; got != want {
		t.Errorf("credential 4 min later: effective %v, want %v (recovered)", got, want)
	}

	// Adaptation off: no effective rate anywhere, so the page hides it.
	rows, err = TransportUpstreams(store, "", []transport.Upstream{up}, nil, transport.Adaptive{Off: true})(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.EffectiveRate != 0 || r.CredentialEffectiveRate != 0 || r.DocumentedRate == 0 {
			t.Errorf("adaptation off: %+v, want documented rates only", r)
		}
	}

	// Invalid settings are an error, said once, not a silent 100 %.
	rows, err = TransportUpstreams(store, "", []transport.Upstream{up}, nil, transport.Adaptive{Floor: 2})(ctx)
	if err == nil || !errors.Is(err, fleetrate.ErrInvalid) || strings.Count(err.Error(), "floor") != 1 {
		t.Errorf("invalid floor: err = %v, want one error naming the floor", err)
	}
	if len(rows) != 2 || rows[0].EffectiveRate != 0 || rows[0].DocumentedRate != 18 {
		t.Errorf("invalid floor: rows = %+v, want both rows without effective rates", rows)
	}
}

// TestPageShowsEffectiveRate checks the JSON document a viewer reads: the
// effective rate of an endpoint a transport's 429 slowed, and the column
// shown, or hidden when adaptation is off.
func TestPageShowsEffectiveRate(t *testing.T) {
	t.Parallel()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(upstream.Close)
	clock := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	store := memstore.New(memstore.Options{Clock: clock.now})
	up := transport.Upstream{
		Channel:   "booking_com",
		Endpoints: []transport.Endpoint{{Name: "rates", Pattern: "GET /r", Limits: []fleetrate.Limit{fleetrate.PerSecond(4, 4)}}},
	}
	lim, err := fleetrate.New(store, fleetrate.Config{Buckets: up.Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	classify, err := up.Classifier()
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	tr, err := transport.New(lim, classify, transport.Options{MaxAttempts: 1, Registerer: reg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr}).Get(upstream.URL + "/r")
	if err == nil {
		resp.Body.Close()
		t.Fatal("a 429 on the only attempt returned no error")
	}

	for _, tc := range []struct {
		name      string
		adaptive  transport.Adaptive
		effective float64
		shown     bool
	}{
		// One 429 lowers the rate to 0.85 of 4/s, rounded up to 109/128.
		{"adaptive", transport.Adaptive{}, 4 * 109.0 / 128, true},
		{"off", transport.Adaptive{Off: true}, 0, false},
	} {
		page, err := New(Options{
			Store: store, Buckets: LimiterBuckets(lim), Clock: clock.now,
			Upstreams: TransportUpstreams(store, "", []transport.Upstream{up}, reg, tc.adaptive),
		})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		page.ServeHTTP(rec, httptest.NewRequest("GET", "/status.json", nil))
		var st struct {
			HasEffectiveRate bool `json:"has_effective_rate"`
			Upstreams        []map[string]any
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
			t.Fatal(err)
		}
		if len(st.Upstreams) != 1 {
			t.Fatalf("%s: upstreams = %v, want 1", tc.name, st.Upstreams)
		}
		u := st.Upstreams[0]
		eff, _ := u["effective_rate"].(float64)
		if eff != tc.effective || st.HasEffectiveRate != tc.shown || u["documented_rate"] != 4.0 || u["rate_limited"] != 1.0 {
			t.Errorf("%s: has_effective_rate %v, row %v; want effective_rate %v, documented 4, 1 rate limit, column shown %v",
				tc.name, st.HasEffectiveRate, u, tc.effective, tc.shown)
		}
		if u["paused_for_ms"].(float64) <= 0 {
			t.Errorf("%s: paused_for_ms = %v, want the 1 s pause the 429 asked for", tc.name, u["paused_for_ms"])
		}
	}
}
