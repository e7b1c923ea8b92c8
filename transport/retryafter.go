package transport

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// HeaderRetryAfter is the response header a server uses to say how long a
// client must wait before it tries again (RFC 9110, section 10.2.3).
const HeaderRetryAfter = "Retry-After"

// maxDeltaDigits is the longest run of significant digits parsed as
// seconds: 999,999,999 s (about 31 years) still fits a Duration. Longer
// values saturate, which any cap then brings down.
const maxDeltaDigits = 9

// ParseRetryAfter reads a Retry-After value at time now and returns how long
// to wait, capped at max, and whether the value was usable.
//
// Both forms of RFC 9110 are accepted: delta-seconds ("120") and an
// HTTP-date in any of the three formats http.ParseTime knows. A decimal
// fraction of seconds ("1.5"), which some servers send, is accepted too. A
// date in the past means "now" and returns (0, true). A huge value returns
// (max, true). A missing, negative or otherwise unparsable value returns
// (0, false), and the caller should fall back to its own backoff.
//
// The result is never negative and never above max; a max below zero is
// treated as zero.
func ParseRetryAfter(value string, now time.Time, max time.Duration) (time.Duration, bool) {
	max = capAtZero(max)
	v := strings.TrimSpace(value)
	if v == "" {
		return 0, false
	}
	if d, ok := parseDelta(v); ok {
		return min(d, max), true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	// Sub saturates instead of overflowing, so a date centuries away still
	// compares correctly with max.
	return min(capAtZero(t.Sub(now)), max), true
}

// parseDelta parses delta-seconds, optionally with a decimal fraction. It
// accepts only ASCII digits with at most one dot between digits: no sign,
// no exponent, no spaces inside.
func parseDelta(v string) (time.Duration, bool) {
	whole, frac, hasDot := strings.Cut(v, ".")
	if whole == "" || !allDigits(whole) || (hasDot && (frac == "" || !allDigits(frac))) {
		return 0, false
	}
	whole = strings.TrimLeft(whole, "0")
	if len(whole) > maxDeltaDigits {
		return time.Duration(1<<63 - 1), true
	}
	secs := int64(0)
	if whole != "" {
		n, err := strconv.ParseInt(whole, 10, 64)
		if err != nil {
			return 0, false
		}
		secs = n
	}
	d := time.Duration(secs) * time.Second
	if hasDot {
		// Nanoseconds are the finest a Duration holds; digits beyond the
		// ninth are dropped.
		if len(frac) > 9 {
			frac = frac[:9]
		}
		ns, err := strconv.ParseInt(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
		if err != nil {
			return 0, false
		}
		d += time.Duration(ns)
	}
	return d, true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func capAtZero(d time.Duration) time.Duration {
	if d < 0 {
		return 0
	}
	return d
}
