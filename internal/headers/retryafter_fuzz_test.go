// FuzzRetryAfter lives in the external test package: it reads back through
// transport.ParseRetryAfter, and the transport imports this package (its
// upstream-header reader parses structured fields with it), which an
// internal test may not import back.
package headers_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/headers"
	"github.com/fleetrate/fleetrate/transport"
)

// FuzzRetryAfter checks that a formatted Retry-After is never earlier
// than the wait it encodes and never a whole second later, and that
// FormatRetryAfter always writes delta-seconds that the one Retry-After
// parser (transport.ParseRetryAfter) reads back as at least the wait and
// less than a second more.
func FuzzRetryAfter(f *testing.F) {
	f.Add(int64(1))
	f.Add(int64(999_999_999))
	f.Add(int64(-5))
	f.Add(int64(1 << 62))
	f.Fuzz(func(t *testing.T, ns int64) {
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		d := time.Duration(ns)
		if d <= 0 || d > maxRetryAfter {
			return
		}
		s := headers.FormatRetryAfter(d)
		got, ok := transport.ParseRetryAfter(s, now, maxRetryAfter)
		if !ok || s == "" || strings.Trim(s, "0123456789") != "" {
			t.Fatalf("FormatRetryAfter(%v) = %q, which is not delta-seconds", d, s)
		}
		if got < d || got-d >= time.Second {
			t.Fatalf("FormatRetryAfter(%v) = %q = %v: want within [d, d+1s)", d, s, got)
		}
	})
}

// maxRetryAfter bounds the waits FuzzRetryAfter formats: 400 days.
const maxRetryAfter = 400 * 24 * time.Hour
