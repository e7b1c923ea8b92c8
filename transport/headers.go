package transport

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/pacer"
	"github.com/fleetrate/fleetrate/transport/internal/ratelimitheader"
)

// HeaderForm is a set of the rate-limit header forms the transport reads
// from an upstream's answers (see RateLimitHeaders).
type HeaderForm uint8

// The header forms built in. Their zero set means all of them.
const (
	// HeadersDraft is the IETF draft's RateLimit and RateLimit-Policy
	// fields (draft-ietf-httpapi-ratelimit-headers): the current
	// structured form, `"name";r=50;t=30` with the policy
	// `"name";q=100;w=60`, and the older ones (a RateLimit dictionary
	// `limit=100, remaining=50, reset=30`; RateLimit-Limit,
	// RateLimit-Remaining and RateLimit-Reset).
	HeadersDraft = HeaderForm(ratelimitheader.Draft)
	// HeadersAnthropic is anthropic-ratelimit-*-{limit,remaining,reset},
	// resets as RFC 3339 times, limits per minute.
	HeadersAnthropic = HeaderForm(ratelimitheader.Anthropic)
	// HeadersOpenAI is x-ratelimit-{limit,remaining,reset}-{requests,tokens},
	// resets as durations ("6m0s", "20ms"), limits per minute.
	HeadersOpenAI = HeaderForm(ratelimitheader.OpenAI)
	// HeadersXRateLimit is X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset. The reset is read as seconds from now, or, from
	// 1e9 up, as a Unix time (1e9 s is 31 years as a delay, and 2001 as a
	// time). Its limit states no window: see RateLimitHeaders.Window.
	HeadersXRateLimit = HeaderForm(ratelimitheader.XRateLimit)
)

// UpstreamQuota is what an upstream's answer says of its requests: the
// quota per window, and what remains of it until it is whole again.
type UpstreamQuota struct {
	// Limit is the quota per Window; 0 when not stated.
	Limit int64
	// Window is the window Limit counts over; 0 when not stated.
	Window time.Duration
	// Remaining is what is left until Reset; read only when Reset is
	// positive.
	Remaining int64
	// Reset is how long until the quota is whole again; 0 when Remaining
	// is not stated.
	Reset time.Duration
}

// RateLimitHeaders says how the transport reads the rate-limit fields an
// upstream sends on its answers, so that the fleet steers by them before
// any 429 (the zero value reads every form built in):
//
//   - a stated limit below the documented one (Limit per Window) caps the
//     endpoint's effective rate there instead of probing for it with 429s
//     (with adaptive pacing; see Adaptive);
//   - fewer requests remaining until the reset than the endpoint's bucket
//     would grant by then hold the bucket down fleet-wide, as a 429's
//     pause does (without lowering the rate): for reset − remaining/rate,
//     after which it refills from empty and grants no more than remaining
//     before the reset. The hold is at most Options.MaxRetryAfter.
//
// Headers never raise anything above the documented limits. A missing,
// garbage or contradictory value (remaining above the limit, a negative
// count, a reset in the past or over a day away) is ignored and counted
// (MetricHeaders). Every answer is read, a rate limit's after its pause is
// set (see Transport): its fields may state the limit, or a reset beyond
// its Retry-After.
type RateLimitHeaders struct {
	// Off reads no rate-limit fields.
	Off bool
	// Forms are the forms read; the first one present wins, in the order
	// draft, Anthropic, OpenAI, X-RateLimit. Zero reads all of them.
	Forms HeaderForm
	// Window is the window of a stated limit whose form states none
	// (X-RateLimit-Limit, the draft's fields without "w"). Zero takes no
	// ceiling from such a limit; its remaining and reset still count. At
	// most a day.
	Window time.Duration
	// Read, when set, reads the fields instead of the forms built in: for
	// an upstream of its own kind. It returns what the answer states (ok
	// false: nothing), which is checked as the built-in forms are.
	Read func(h http.Header, now time.Time) (q UpstreamQuota, ok bool)
}

// validate checks the setting, naming the failing field.
func (h RateLimitHeaders) validate(field string) error {
	switch {
	case h.Forms&^HeaderForm(ratelimitheader.All) != 0:
		return fmt.Errorf("%w: %s.forms: unknown forms %#x", fleetrate.ErrInvalid, field, uint8(h.Forms&^HeaderForm(ratelimitheader.All)))
	case h.Window < 0 || h.Window > ratelimitheader.MaxReset:
		return fmt.Errorf("%w: %s.window: must be between 0 and %v, got %v", fleetrate.ErrInvalid, field, ratelimitheader.MaxReset, h.Window)
	}
	return nil
}

// read returns what resp's fields say of the requests, read at now (nil
// h: every form built in).
func (h *RateLimitHeaders) read(resp *http.Response, now time.Time) ratelimitheader.Reading {
	if h == nil {
		return ratelimitheader.Parse(resp.Header, now, ratelimitheader.All)
	}
	if h.Off {
		return ratelimitheader.Reading{}
	}
	if h.Read != nil {
		q, ok := h.Read(resp.Header, now)
		if !ok {
			return ratelimitheader.Reading{}
		}
		return ratelimitheader.Check(ratelimitheader.Quota(q))
	}
	forms := ratelimitheader.Form(h.Forms)
	if forms == 0 {
		forms = ratelimitheader.All
	}
	r := ratelimitheader.Parse(resp.Header, now, forms)
	if r.Requests.Limit > 0 && r.Requests.Window == 0 {
		r.Requests.Window = h.Window
	}
	return r
}

// headerLog remembers, per endpoint, what the transport last logged of its
// answers' fields, so that it logs each change once: a new ceiling, and
// each reason for ignoring a field at most once a minute (an upstream
// whose every other answer contradicts itself would otherwise log half
// its answers).
type headerLog struct {
	mu   sync.Mutex
	last map[string]*headerSeen
}

type headerSeen struct {
	ceiling float64
	ignored map[string]time.Time // field: reason → when last logged
}

// ignoredEvery is how often one reason of one field is logged again.
const ignoredEvery = time.Minute

// changed records what key's answers now say at now and reports whether
// the ceiling changed, and which of the ignored fields (as "field:
// reason") are news.
func (l *headerLog) changed(key string, ceiling float64, ignored []string, now time.Time) (ceilingChanged bool, news []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = map[string]*headerSeen{}
	}
	s := l.last[key]
	if s == nil {
		s = &headerSeen{ignored: map[string]time.Time{}}
		l.last[key] = s
	}
	ceilingChanged, s.ceiling = s.ceiling != ceiling, ceiling
	for _, ig := range ignored {
		if at, ok := s.ignored[ig]; !ok || now.Sub(at) >= ignoredEvery {
			s.ignored[ig] = now
			news = append(news, ig)
		}
	}
	return ceilingChanged, news
}

// readHeaders steers the fleet by an answer's rate-limit fields (see
// RateLimitHeaders): counted, logged once per change, then applied
// through the pacer.
func (t *Transport) readHeaders(ctx context.Context, tg Target, pt pacer.Target, resp *http.Response) {
	r := tg.Headers.read(resp, t.now())
	if r.Form == 0 && len(r.Ignored) == 0 {
		return
	}
	var reasons []string
	for _, ig := range r.Ignored {
		t.m.headerRead(tg, string(ig.Reason))
		reasons = append(reasons, ig.Field+": "+string(ig.Reason))
	}
	slices.Sort(reasons)
	q := r.Requests
	if q.Stated() {
		t.m.headerRead(tg, "read")
	}
	held, ceiling, err := t.pacer.Stated(ctx, pt, q, t.maxRetryAfter)
	ceilingChanged, news := t.headerLog.changed(pt.EndpointKey, ceiling, slices.Compact(reasons), t.now())
	if ceilingChanged {
		t.log.LogAttrs(ctx, slog.LevelInfo, "rate_headers_limit", append(pt.Attrs,
			slog.String("form", r.Form.String()), slog.Int64("limit", q.Limit), slog.Duration("window", q.Window),
			slog.Float64("ceiling", ceiling))...)
	}
	if len(news) > 0 {
		t.log.LogAttrs(ctx, slog.LevelWarn, "rate_headers_ignored", append(pt.Attrs,
			slog.String("form", r.Form.String()), slog.String("ignored", strings.Join(news, "; ")))...)
	}
	if held > 0 {
		t.log.LogAttrs(ctx, slog.LevelInfo, "rate_headers_hold", append(pt.Attrs,
			slog.Int64("remaining", q.Remaining), slog.Duration("reset", q.Reset),
			slog.Int64("hold_ms", held.Milliseconds()), slog.Any("error", err))...)
	}
	if tq := r.Tokens; tq.Stated() {
		t.m.headerRead(tg, "read")
		t.holdMeter(ctx, tg, pt, TokensMeter, tq)
	}
}

// TokensMeter is the name of the meter (Upstream.Meters) that an
// upstream's token fields (OpenAI's x-ratelimit-*-tokens, Anthropic's
// anthropic-ratelimit-tokens-*) steer.
const TokensMeter = "tokens"

// holdMeter drains the channel's meter named name when the upstream says
// fewer of its units remain before the reset than the meter would grant
// by then, refilling at its fastest limit's rate: it grants no more than
// remaining before the reset afterwards. A drain never shortens another
// nor raises anything; a channel without the meter is left alone.
func (t *Transport) holdMeter(ctx context.Context, tg Target, pt pacer.Target, name string, q ratelimitheader.Quota) {
	if _, ok := tg.Costs[name]; !ok {
		return
	}
	b, err := t.lim.Bucket(MeterBucket(tg.Channel, name))
	if err != nil {
		return
	}
	var rate float64
	for _, l := range b.Limits {
		rate = max(rate, l.Rate)
	}
	d := min(pacer.HoldDown(q, rate), t.maxRetryAfter)
	if d <= 0 {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	defer cancel()
	err = t.lim.Store().Drain(dctx, []fleetrate.Bucket{b}, d)
	t.log.LogAttrs(ctx, slog.LevelInfo, "rate_headers_hold", append(pt.Attrs, slog.String("meter", name),
		slog.Int64("remaining", q.Remaining), slog.Duration("reset", q.Reset),
		slog.Int64("hold_ms", d.Milliseconds()), slog.Any("error", err))...)
}
