package mockota

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// ReportForm is the form of rate-limit fields an Adversary's answers
// carry.
type ReportForm int

// The forms an Adversary reports its limit in.
const (
	// ReportNone sends no rate-limit fields.
	ReportNone ReportForm = iota
	// ReportXRateLimit sends X-RateLimit-Limit (per second: it states no
	// window), -Remaining and -Reset (a delay in seconds).
	ReportXRateLimit
	// ReportDraft sends the IETF draft's RateLimit-Policy and RateLimit,
	// `"hidden";q=..;w=1` and `"hidden";r=..;t=1`.
	ReportDraft
	// ReportOpenAI sends x-ratelimit-{limit,remaining,reset}-requests, the
	// limit per minute and the reset as "1s".
	ReportOpenAI
	// ReportAnthropic sends anthropic-ratelimit-requests-{limit,remaining,
	// reset}, the limit per minute and the reset as an RFC 3339 time.
	ReportAnthropic
)

// String names the form.
func (f ReportForm) String() string {
	switch f {
	case ReportNone:
		return "none"
	case ReportXRateLimit:
		return "x-ratelimit"
	case ReportDraft:
		return "draft"
	case ReportOpenAI:
		return "openai"
	case ReportAnthropic:
		return "anthropic"
	}
	return fmt.Sprintf("ReportForm(%d)", int(f))
}

// report returns the rate-limit fields of an answer at now, after its
// decision. a.mu is held.
//
// Truthful, they describe the tightest limit (the hidden one when set) of
// rate h and the tokens x it holds now: h per second (or 60·h per
// minute), and, over the next second, r = ⌊x + h⌋ remaining at most, capped
// at the limit per second: the most the bucket admits in that second, so
// "r until the reset in 1 s" never overstates it. Misleading, they claim
// the documented rate, all of it remaining, and every other answer more
// remaining than the limit.
func (a *Adversary) report(now time.Time) map[string]string {
	if a.cfg.Report == ReportNone {
		return nil
	}
	b := a.doc
	if a.hid.rate > 0 {
		b = a.hid
	}
	perSec := int64(math.Floor(b.rate))
	rem := min(int64(math.Floor(b.tokens+b.rate)), perSec)
	if a.cfg.Misleading {
		perSec = int64(math.Ceil(a.cfg.Rate))
		rem = perSec
		if len(a.arrivals)%2 == 0 {
			rem = perSec + 5
		}
	}
	// OpenAI's and Anthropic's limits are per minute.
	perMin, remMin := perSec*60, rem
	if a.cfg.Misleading {
		remMin = perMin
		if len(a.arrivals)%2 == 0 {
			remMin = perMin + 5
		}
	}
	itoa := func(n int64) string { return strconv.FormatInt(n, 10) }
	switch a.cfg.Report {
	case ReportXRateLimit:
		return map[string]string{"X-RateLimit-Limit": itoa(perSec), "X-RateLimit-Remaining": itoa(rem), "X-RateLimit-Reset": "1"}
	case ReportDraft:
		return map[string]string{
			"RateLimit-Policy": fmt.Sprintf(`"hidden";q=%d;w=1`, perSec),
			"RateLimit":        fmt.Sprintf(`"hidden";r=%d;t=1`, rem),
		}
	case ReportOpenAI:
		return map[string]string{"x-ratelimit-limit-requests": itoa(perMin), "x-ratelimit-remaining-requests": itoa(remMin), "x-ratelimit-reset-requests": "1s"}
	case ReportAnthropic:
		return map[string]string{"anthropic-ratelimit-requests-limit": itoa(perMin), "anthropic-ratelimit-requests-remaining": itoa(remMin),
			"anthropic-ratelimit-requests-reset": now.Add(time.Second).UTC().Format(time.RFC3339Nano)}
	}
	return nil
}
