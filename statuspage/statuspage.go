// Package statuspage is a live status page for operators of a fleet that
// shares fleetrate buckets: every bucket with its limits, fill level, time
// to full, decisions and denials per second; the keys denied most over the
// last minute (hashed, never shown raw); and, for outbound upstreams, which
// endpoint is paused until when, how often it answers 429, and the rate
// the fleet paces it at (adaptive pacing) against its documented rate.
//
// A Page is an http.Handler: mount it in any Go program that has a store,
// e.g. with http.StripPrefix("/status", page) under "/status/". It serves
// plain HTML, CSS and JavaScript embedded in the binary (it works offline,
// with no build step) that polls the JSON document at "status.json" beside
// it. `fleetrate serve` mounts it at /status/ behind its bearer tokens.
//
// The decision path pays only for counting: wrap the store with a
// Counter's Wrap before building Limiters on it. Fill levels are peeks (a
// take of 0 tokens, one store call per bucket) made only while someone is
// watching, at most once per Options.Interval.
package statuspage

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetrate/fleetrate"
)

// Defaults applied by New when an Options field is zero.
const (
	// DefaultInterval is how often the page refreshes, and the least time
	// between two rounds of peeks however many viewers poll.
	DefaultInterval = time.Second
	// DefaultRateWindow is the time over which per-second rates are
	// averaged.
	DefaultRateWindow = 5 * time.Second
	// DefaultTitle heads the page.
	DefaultTitle = "fleetrate"
	// MaxBuckets bounds the buckets one refresh peeks; further buckets are
	// counted in Status.Hidden.
	MaxBuckets = 200
	// TopDeniedKeys is how many keys the top denied list holds.
	TopDeniedKeys = 10
	// peekTimeout bounds each peek.
	peekTimeout = time.Second
)

//go:embed assets
var assets embed.FS

// Bucket is one bucket the page shows.
type Bucket struct {
	// Name is shown on the page, e.g. "booking_com/availability".
	Name string
	// Bucket is the store key and limits that are peeked for the fill
	// level; they must be the ones the fleet takes from.
	Bucket fleetrate.Bucket
}

// LimiterBuckets returns a bucket list for Options.Buckets: the named
// buckets of l, as l resolves them. A name l does not know is skipped.
func LimiterBuckets(l *fleetrate.Limiter, names ...string) func() []Bucket {
	return func() []Bucket {
		out := make([]Bucket, 0, len(names))
		for _, n := range names {
			if b, err := l.Bucket(n); err == nil {
				out = append(out, Bucket{Name: n, Bucket: b})
			}
		}
		return out
	}
}

// Options configure a Page. The zero value of each field means its
// default.
type Options struct {
	// Store is peeked for fill levels. Required. Giving the store the
	// Counter wraps or the wrapped one is the same: peeks are not counted.
	Store fleetrate.Store
	// Buckets lists the buckets shown. It is called at each refresh, so a
	// reloaded configuration shows at once. Required.
	Buckets func() []Bucket
	// Counter supplies decisions and denials; without it the page shows
	// fill levels only.
	Counter *Counter
	// Upstreams, when set, supplies the outbound upstream rows (see
	// Upstream). It is called at each refresh.
	Upstreams func(context.Context) ([]Upstream, error)
	// Interval is how often the page refreshes. The default is
	// DefaultInterval (1 s).
	Interval time.Duration
	// RateWindow is the time rates are averaged over. The default is
	// DefaultRateWindow (5 s).
	RateWindow time.Duration
	// Title heads the page. The default is DefaultTitle.
	Title string
	// Clock reads the time. The default is time.Now.
	Clock func() time.Time
}

// Page serves the status page and its JSON document. Create it with New.
type Page struct {
	opts  Options
	files http.Handler

	mu      sync.Mutex
	last    *Status
	history []sample // oldest first, spanning about RateWindow
}

// sample is the counters at one refresh.
type sample struct {
	at                  time.Time
	takes, denied, errs int64
	buckets             map[storeKey][2]int64
	other               [2]int64
}

// New returns a Page, or an error naming the missing option.
func New(opts Options) (*Page, error) {
	switch {
	case opts.Store == nil:
		return nil, fmt.Errorf("%w: statuspage: store is required", fleetrate.ErrInvalid)
	case opts.Buckets == nil:
		return nil, fmt.Errorf("%w: statuspage: buckets is required", fleetrate.ErrInvalid)
	case opts.Interval < 0:
		return nil, fmt.Errorf("%w: statuspage: interval must not be negative, got %v", fleetrate.ErrInvalid, opts.Interval)
	case opts.RateWindow < 0:
		return nil, fmt.Errorf("%w: statuspage: rate window must not be negative, got %v", fleetrate.ErrInvalid, opts.RateWindow)
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultInterval
	}
	if opts.RateWindow == 0 {
		opts.RateWindow = DefaultRateWindow
	}
	if opts.Title == "" {
		opts.Title = DefaultTitle
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	p := &Page{opts: opts, files: http.FileServerFS(sub)}
	p.Track()
	return p, nil
}

// Track makes the Counter count each listed bucket on its own from now
// on; decisions before are counted in the totals only. New and every
// refresh call it; call it again when Options.Buckets starts listing
// buckets (e.g. once the program's configuration is loaded), so that the
// first view of the page already shows their counts.
func (p *Page) Track() {
	if p.opts.Counter == nil {
		return
	}
	all := p.opts.Buckets()
	fbs := make([]fleetrate.Bucket, min(len(all), MaxBuckets))
	for i := range fbs {
		fbs[i] = all[i].Bucket
	}
	p.opts.Counter.track(fbs)
}

// ServeHTTP serves the page at "/" (or "" under http.StripPrefix), its
// JSON document at "status.json" and its script and style sheet.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the status page needs GET", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:")
	switch name := strings.TrimPrefix(r.URL.Path, "/"); name {
	case "status.json":
		st := p.Status(r.Context())
		data, err := json.Marshal(st)
		if err != nil {
			http.Error(w, "encoding the status failed", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(append(data, '\n'))
	case "", "index.html", "app.js", "style.css":
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/" + name
		if name == "index.html" {
			r2.URL.Path = "/"
		}
		p.files.ServeHTTP(w, r2)
	default:
		http.NotFound(w, r)
	}
}

// Status returns the page's data: a fresh refresh, or the last one if it
// is younger than half the interval (so that any number of viewers cost
// the store one round of peeks per interval).
func (p *Page) Status(ctx context.Context) Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.opts.Clock()
	if p.last != nil && now.Sub(p.last.At) < p.opts.Interval/2 && now.Sub(p.last.At) >= 0 {
		return *p.last
	}
	st := p.refresh(ctx, now)
	p.last = &st
	return st
}

// refresh peeks every bucket and reads the counters. p.mu is held.
func (p *Page) refresh(ctx context.Context, now time.Time) Status {
	st := Status{
		Title:       p.opts.Title,
		At:          now,
		IntervalMS:  p.opts.Interval.Milliseconds(),
		Counting:    p.opts.Counter != nil,
		Buckets:     []BucketStatus{},
		TopDenied:   []DeniedKey{},
		Upstreams:   []Upstream{},
		DeniedWinS:  DeniedWindow.Seconds(),
		RateWindowS: 0,
	}
	all := p.opts.Buckets()
	if len(all) > MaxBuckets {
		st.Hidden = len(all) - MaxBuckets
		all = all[:MaxBuckets]
	}
	fbs := make([]fleetrate.Bucket, len(all))
	for i, b := range all {
		fbs[i] = b.Bucket
	}
	c := p.opts.Counter
	if c != nil {
		c.track(fbs)
	}
	// Read the counters before peeking, so that the rates cover the same
	// span for every bucket.
	cur := p.read(now, fbs)
	prev := p.push(cur)
	dt := cur.at.Sub(prev.at).Seconds()
	st.RateWindowS = dt
	for i, b := range all {
		bs := p.peek(ctx, b)
		if c != nil {
			k := storeKey{fbs[i].Prefix, fbs[i].Key}
			n, was := cur.buckets[k], prev.buckets[k]
			bs.Decisions, bs.Denied = n[0], n[1]
			bs.DecisionsPerS, bs.DeniedPerS = perSecond(n[0]-was[0], dt), perSecond(n[1]-was[1], dt)
		}
		st.Buckets = append(st.Buckets, bs)
	}
	if c != nil {
		st.Totals = Totals{
			Decisions: cur.takes, Denied: cur.denied, Errors: cur.errs,
			DecisionsPerS: perSecond(cur.takes-prev.takes, dt), DeniedPerS: perSecond(cur.denied-prev.denied, dt),
			OtherDecisions: cur.other[0], OtherDenied: cur.other[1],
		}
		st.addTopDenied(c, all)
	}
	if p.opts.Upstreams != nil {
		p.addUpstreams(ctx, now, &st)
	}
	return st
}

// perSecond is the rate of n events in dt seconds; 0 when dt is not
// positive (the first sample).
func perSecond(n int64, dt float64) float64 {
	if dt <= 0 {
		return 0
	}
	return float64(n) / dt
}

// addTopDenied adds the keys c saw denied most, named after the bucket of
// all they belong to, if any.
func (st *Status) addTopDenied(c *Counter, all []Bucket) {
	names := make(map[storeKey]string, len(all))
	for _, b := range all {
		names[storeKey{b.Bucket.Prefix, b.Bucket.Key}] = b.Name
	}
	top, overflow := c.topDenied(TopDeniedKeys)
	for _, d := range top {
		st.TopDenied = append(st.TopDenied, DeniedKey{Key: keyLabel(d.key), Bucket: names[d.key], Denied: d.denied})
	}
	st.DeniedOverflow = overflow
}

// addUpstreams adds the upstreams Options.Upstreams reports, or its error.
func (p *Page) addUpstreams(ctx context.Context, now time.Time, st *Status) {
	ups, err := p.opts.Upstreams(ctx)
	if err != nil {
		st.UpstreamError = err.Error()
	}
	for _, u := range ups {
		u.fill(now)
		st.Upstreams = append(st.Upstreams, u)
		if u.EffectiveRate > 0 || u.CredentialEffectiveRate > 0 {
			st.HasEffectiveRate = true
		}
	}
}

// read snapshots the counters.
func (p *Page) read(now time.Time, fbs []fleetrate.Bucket) sample {
	s := sample{at: now, buckets: make(map[storeKey][2]int64, len(fbs))}
	c := p.opts.Counter
	if c == nil {
		return s
	}
	s.takes, s.denied, s.other[0], s.other[1] = c.totals()
	s.errs = c.errs.Load()
	tr := *c.tracked.Load()
	for _, b := range fbs {
		if n, ok := tr[b.Prefix][b.Key]; ok {
			s.buckets[storeKey{b.Prefix, b.Key}] = [2]int64{n.decisions.Load(), n.denied.Load()}
		}
	}
	return s
}

// push appends s to the history and returns the sample to measure rates
// from: the newest one at least RateWindow old, else the oldest.
func (p *Page) push(s sample) sample {
	// A history older than the window plus a few refreshes means nobody
	// watched for a while: start again rather than average over the gap.
	if n := len(p.history); n > 0 && s.at.Sub(p.history[n-1].at) > p.opts.RateWindow+2*p.opts.Interval {
		p.history = p.history[:0]
	}
	p.history = append(p.history, s)
	from := 0
	for i, h := range p.history {
		if s.at.Sub(h.at) >= p.opts.RateWindow {
			from = i
		}
	}
	p.history = p.history[from:]
	return p.history[0]
}

// peek reads one bucket's fill level.
func (p *Page) peek(ctx context.Context, b Bucket) BucketStatus {
	bs := BucketStatus{Name: b.Name, Limits: make([]string, len(b.Bucket.Limits))}
	for i, l := range b.Bucket.Limits {
		bs.Limits[i] = limitString(l)
	}
	ctx, cancel := context.WithTimeout(ctx, peekTimeout)
	defer cancel()
	res, err := p.opts.Store.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{b.Bucket}})
	if err != nil {
		bs.Error = err.Error()
		return bs
	}
	bs.Limit = res.Limit.Name
	bs.Burst = res.Limit.Burst
	bs.Remaining = res.Remaining
	if res.Limit.Burst > 0 {
		bs.Fill = float64(res.Remaining) / float64(res.Limit.Burst)
	}
	bs.TimeToFullMS = millis(res.ResetAfter)
	if !res.Allowed {
		bs.InDebtMS = millis(res.RetryAfter)
	}
	return bs
}

// limitString shows a limit as "20/s burst 40", with its name first when
// it has one.
func limitString(l fleetrate.Limit) string {
	s := strconv.FormatFloat(l.Rate, 'g', 4, 64) + "/s burst " + strconv.FormatInt(l.Burst, 10)
	if l.Name != "" {
		s = l.Name + " (" + s + ")"
	}
	return s
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// keyLabel shows a store key without revealing it: "h:" and the first 12
// hex digits of its SHA-256. An operator who suspects a key checks it with
// printf %s 'prefix+key' | sha256sum | cut -c1-12.
func keyLabel(k storeKey) string {
	h := sha256.Sum256([]byte(k.prefix + k.key))
	return "h:" + hex.EncodeToString(h[:6])
}
