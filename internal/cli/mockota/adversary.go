package mockota

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// RetryAfterForm is how an Adversary announces its pauses.
type RetryAfterForm int

// The forms of Retry-After an Adversary can send.
const (
	// RetrySeconds sends delta-seconds, rounded up.
	RetrySeconds RetryAfterForm = iota
	// RetryDate sends an HTTP date, the pause's end rounded up to a second.
	RetryDate
	// RetryMissing sends no Retry-After.
	RetryMissing
	// RetryGarbage sends a value no parser accepts.
	RetryGarbage
	// RetryHuge sends a day.
	RetryHuge
)

// String names the form.
func (f RetryAfterForm) String() string {
	switch f {
	case RetrySeconds:
		return "seconds"
	case RetryDate:
		return "date"
	case RetryMissing:
		return "missing"
	case RetryGarbage:
		return "garbage"
	case RetryHuge:
		return "huge"
	}
	return fmt.Sprintf("RetryAfterForm(%d)", int(f))
}

// Announced reports whether the form tells the client when the pause ends.
func (f RetryAfterForm) Announced() bool {
	return f == RetrySeconds || f == RetryDate || f == RetryHuge
}

// AdversaryConfig configures an Adversary: an upstream as hostile as real
// ones are, one path, whose limits are token buckets kept exactly on its
// own clock.
type AdversaryConfig struct {
	// Rate and Burst are the documented limit: at most Burst + Rate × w
	// accepted requests in any window w. Burst 1 is a strict window: one
	// request per 1/Rate, a request a little early is refused.
	Rate  float64
	Burst int
	// HiddenRate and HiddenBurst, when HiddenRate is set, are a stricter
	// limit the documentation does not mention.
	HiddenRate  float64
	HiddenBurst int
	// Pause is how long the path refuses everything after a 429, or longer
	// if its bucket needs longer to hold a token. The default is 2 s.
	Pause time.Duration
	// RetryAfter is how 429s announce the pause.
	RetryAfter RetryAfterForm
	// Report is the form of rate-limit fields every answer carries (see
	// ReportForm); ReportNone sends none.
	Report ReportForm
	// Misleading makes the fields claim the documented limit, with all of
	// it remaining, whatever the hidden limit allows, and every other
	// answer contradict itself (more remaining than the limit).
	Misleading bool
	// Now is the clock. The default is time.Now.
	Now func() time.Time `json:"-"`
}

// Adversary is a one-path mock upstream with exact token-bucket limits, a
// pause after every 429, and Retry-After in the form configured. It
// records every arrival. It is an http.Handler safe for concurrent use.
type Adversary struct {
	cfg AdversaryConfig

	mu         sync.Mutex
	doc, hid   bucket
	pauseUntil time.Time
	announced  bool // the current pause's end was sent to the client
	arrivals   []AdversaryArrival
}

// AdversaryArrival is one request as the Adversary saw it.
type AdversaryArrival struct {
	At     time.Time
	Status int
	// DuringPause marks a request that arrived while a pause announced to
	// the client (in seconds or as a date) was in force.
	DuringPause bool
	// Wire is how long after the time in its SentHeader (Unix
	// nanoseconds) the request arrived; 0 without one.
	Wire time.Duration
}

// SentHeader is the request header a client may stamp with the time it
// handed the request to its connection, in Unix nanoseconds, so that an
// Adversary's log tells the wire's delay from the client's.
const SentHeader = "X-Sent-Unix-Nano"

// bucket is an exact token bucket in float64 tokens.
type bucket struct {
	rate, burst float64
	tokens      float64
	last        time.Time
}

func (b *bucket) refill(now time.Time) {
	if b.last.IsZero() {
		b.tokens, b.last = b.burst, now
		return
	}
	if now.After(b.last) {
		b.tokens = min(b.burst, b.tokens+b.rate*now.Sub(b.last).Seconds())
		b.last = now
	}
}

// need is how long until the bucket holds a token.
func (b *bucket) need() time.Duration {
	if b.rate == 0 || b.tokens >= 1 {
		return 0
	}
	return time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
}

// NewAdversary returns an Adversary, or an error naming the invalid field.
func NewAdversary(cfg AdversaryConfig) (*Adversary, error) {
	switch {
	case !(cfg.Rate > 0) || math.IsInf(cfg.Rate, 0):
		return nil, fmt.Errorf("mockota: adversary rate must be positive, got %v", cfg.Rate)
	case cfg.Burst < 1:
		return nil, fmt.Errorf("mockota: adversary burst must be at least 1, got %d", cfg.Burst)
	case cfg.HiddenRate < 0 || cfg.HiddenRate > 0 && cfg.HiddenBurst < 1:
		return nil, errors.New("mockota: adversary hidden limit needs a positive rate and a burst of at least 1")
	case cfg.Pause < 0:
		return nil, fmt.Errorf("mockota: adversary pause must not be negative, got %v", cfg.Pause)
	}
	if cfg.Pause == 0 {
		cfg.Pause = 2 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := &Adversary{cfg: cfg}
	a.doc = bucket{rate: cfg.Rate, burst: float64(cfg.Burst)}
	if cfg.HiddenRate > 0 {
		a.hid = bucket{rate: cfg.HiddenRate, burst: float64(cfg.HiddenBurst)}
	}
	return a, nil
}

// ServeHTTP answers 200 while both buckets hold a token and no pause is
// in force; otherwise 429, starting (or reporting) a pause.
func (a *Adversary) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	now := a.cfg.Now()
	arr := AdversaryArrival{At: now, Status: http.StatusOK}
	if ns, err := strconv.ParseInt(r.Header.Get(SentHeader), 10, 64); err == nil {
		arr.Wire = now.Sub(time.Unix(0, ns))
	}
	a.doc.refill(now)
	if a.hid.rate > 0 {
		a.hid.refill(now)
	}
	var header string
	switch {
	case now.Before(a.pauseUntil):
		arr.Status, arr.DuringPause = http.StatusTooManyRequests, a.announced
		header = a.retryAfter(now)
	case a.doc.tokens < 1 || a.hid.rate > 0 && a.hid.tokens < 1:
		arr.Status = http.StatusTooManyRequests
		a.pauseUntil = now.Add(max(a.cfg.Pause, a.doc.need(), a.hid.need()))
		a.announced = a.cfg.RetryAfter.Announced()
		header = a.retryAfter(now)
	default:
		a.doc.tokens--
		if a.hid.rate > 0 {
			a.hid.tokens--
		}
	}
	a.arrivals = append(a.arrivals, arr)
	fields := a.report(now)
	a.mu.Unlock()
	for k, v := range fields {
		w.Header().Set(k, v)
	}
	if header != "" {
		w.Header().Set("Retry-After", header)
	}
	w.WriteHeader(arr.Status)
}

// retryAfter formats the pause's end in the configured form. a.mu is held.
func (a *Adversary) retryAfter(now time.Time) string {
	switch a.cfg.RetryAfter {
	case RetrySeconds:
		return strconv.FormatInt(max(int64(math.Ceil(a.pauseUntil.Sub(now).Seconds())), 1), 10)
	case RetryDate:
		return a.pauseUntil.Add(time.Second - 1).Truncate(time.Second).UTC().Format(http.TimeFormat)
	case RetryGarbage:
		return "soon, please"
	case RetryHuge:
		return "86400"
	}
	return ""
}

// Arrivals returns a copy of every arrival so far.
func (a *Adversary) Arrivals() []AdversaryArrival {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]AdversaryArrival(nil), a.arrivals...)
}

// AdversaryReport sums up the arrivals between from and to.
type AdversaryReport struct {
	Requests, Accepted, Limited int
	// DuringPause counts arrivals during a pause announced in seconds or
	// as a date.
	DuringPause int
	// AcceptedPerSecond is Accepted over the span.
	AcceptedPerSecond float64
	// Overshoot is the largest excess of arrivals, accepted or not, over
	// the documented Burst + Rate × w in any window w.
	Overshoot float64
}

// Report sums up the arrivals between from and to.
func (a *Adversary) Report(from, to time.Time) AdversaryReport {
	var rep AdversaryReport
	var at []time.Time
	for _, arr := range a.Arrivals() {
		if arr.At.Before(from) || arr.At.After(to) {
			continue
		}
		rep.Requests++
		at = append(at, arr.At)
		switch {
		case arr.Status == http.StatusOK:
			rep.Accepted++
		default:
			rep.Limited++
		}
		if arr.DuringPause {
			rep.DuringPause++
		}
	}
	if span := to.Sub(from).Seconds(); span > 0 {
		rep.AcceptedPerSecond = float64(rep.Accepted) / span
	}
	for i := range at {
		for j := i; j < len(at); j++ {
			ex := float64(j-i+1) - (float64(a.cfg.Burst) + a.cfg.Rate*at[j].Sub(at[i]).Seconds())
			rep.Overshoot = max(rep.Overshoot, ex)
		}
	}
	return rep
}
