package transport_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/transport"
)

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC)
	limit := time.Minute
	tests := []struct {
		name  string
		value string
		want  time.Duration
		ok    bool
	}{
		{"seconds", "2", 2 * time.Second, true},
		{"zero", "0", 0, true},
		{"leading zeros", "007", 7 * time.Second, true},
		{"surrounding spaces", "  3 ", 3 * time.Second, true},
		{"fraction", "1.5", 1500 * time.Millisecond, true},
		{"fraction beyond nanoseconds", "0.0000000019", 1, true},
		{"seconds at the cap", "60", time.Minute, true},
		{"seconds above the cap", "61", time.Minute, true},
		{"huge seconds", "99999999999999999999999999", time.Minute, true},
		{"huge with leading zeros", "0000000000000000000005", 5 * time.Second, true},
		{"http-date IMF-fixdate", now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second, true},
		{"http-date RFC 850", now.Add(10 * time.Second).Format(time.RFC850), 10 * time.Second, true},
		{"http-date ANSI C", now.Add(5 * time.Second).Format(time.ANSIC), 5 * time.Second, true},
		{"http-date now", now.Format(http.TimeFormat), 0, true},
		{"past date", now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"far past date", "Thu, 01 Jan 1970 00:00:00 GMT", 0, true},
		{"date beyond the cap", now.Add(time.Hour).Format(http.TimeFormat), time.Minute, true},
		{"date centuries ahead", "Fri, 31 Dec 9999 23:59:59 GMT", time.Minute, true},
		{"missing", "", 0, false},
		{"blank", "   ", 0, false},
		{"negative", "-5", 0, false},
		{"plus sign", "+5", 0, false},
		{"garbage", "soon", 0, false},
		{"unit suffix", "5s", 0, false},
		{"exponent", "1e3", 0, false},
		{"lone dot", ".", 0, false},
		{"dot without fraction", "5.", 0, false},
		{"dot without whole", ".5", 0, false},
		{"two dots", "1.2.3", 0, false},
		{"inner space", "1 0", 0, false},
		{"hex", "0x10", 0, false},
		{"date with garbage", "Mon, 02 Jan 2006 15:04:05 GMT x", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, ok := transport.ParseRetryAfter(tc.value, now, limit)
			if got != tc.want || ok != tc.ok {
				t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tc.value, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestParseRetryAfterCaps(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name  string
		value string
		max   time.Duration
		want  time.Duration
	}{
		{"zero cap", "10", 0, 0},
		{"negative cap is zero", "10", -time.Second, 0},
		{"cap below a second", "1", 250 * time.Millisecond, 250 * time.Millisecond},
		{"largest duration cap", "999999999", time.Duration(1<<63 - 1), 999999999 * time.Second},
		{"saturated seconds with the largest cap", "9999999999", time.Duration(1<<63 - 1), time.Duration(1<<63 - 1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got, ok := transport.ParseRetryAfter(tc.value, now, tc.max); got != tc.want || !ok {
				t.Errorf("ParseRetryAfter(%q, max %v) = %v, %v; want %v, true", tc.value, tc.max, got, ok, tc.want)
			}
		})
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	now := time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC)
	for _, seed := range []string{
		"", "0", "1", "2", "120", "1.5", "-1", "+1", "1e9", "soon", " 7 ",
		"99999999999999999999", "0000000000000000001", ".5", "5.", "1..2",
		now.Add(90 * time.Second).Format(http.TimeFormat),
		now.Add(-90 * time.Second).Format(http.TimeFormat),
		now.Format(time.RFC850), now.Format(time.ANSIC),
		"Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 01 Jan 0001 00:00:00 GMT",
	} {
		f.Add(seed, int64(time.Minute), now.UnixNano())
	}
	f.Add("30", int64(-1), int64(0))
	f.Add("30", int64(1<<63-1), int64(-1<<63))
	f.Fuzz(func(t *testing.T, value string, maxNanos, nowNanos int64) {
		got, ok := transport.ParseRetryAfter(value, time.Unix(0, nowNanos), time.Duration(maxNanos))
		limit := time.Duration(max(maxNanos, 0))
		if got < 0 || got > limit {
			t.Fatalf("ParseRetryAfter(%q, max %v) = %v, outside [0, %v]", value, time.Duration(maxNanos), got, limit)
		}
		if !ok && got != 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, false; an unusable value must give 0", value, got)
		}
	})
}
