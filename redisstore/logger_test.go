package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/logbuf"
	"github.com/fleetrate/fleetrate/internal/harness/manualclock"
)

func logLines(s string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// TestLoggerIsRateLimited: 10,000 go-redis lines within 5 s of a manual
// clock are written as at most 6, and the suppressed counts add up.
func TestLoggerIsRateLimited(t *testing.T) {
	t.Parallel()
	buf := &logbuf.Buffer{}
	l := NewLogger(slog.New(slog.NewJSONHandler(buf, nil)), time.Second)
	c := manualclock.New(time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC))
	l.w.Now = c.Now
	for range 10_000 {
		l.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v", 5, errors.New("connection refused"))
		c.Advance(500 * time.Microsecond)
	}
	// One more a second later reports what was left out since the last.
	c.Advance(time.Second)
	l.Printf(context.Background(), "redis: last")
	lines := logLines(buf.String())
	if len(lines) < 6 || len(lines) > 7 {
		t.Fatalf("%d lines for 10,001 messages over 6 s, want 6 or 7:\n%s", len(lines), buf)
	}
	if !strings.Contains(lines[0], `"level":"WARN"`) || !strings.Contains(lines[0], `"source":"go-redis"`) ||
		!strings.Contains(lines[0], "failed to dial after 5 attempts: connection refused") {
		t.Errorf("line %s is not a structured warning carrying the message", lines[0])
	}
	if total := len(lines) + sumSuppressed(t, lines); total != 10_001 {
		t.Errorf("written %d + suppressed = %d, want 10,001", len(lines), total)
	}
}

func sumSuppressed(t *testing.T, lines []string) int {
	t.Helper()
	n := 0
	for _, l := range lines {
		i := strings.Index(l, `"suppressed":`)
		if i < 0 {
			t.Fatalf("line without suppressed: %s", l)
		}
		var v int
		for _, ch := range l[i+len(`"suppressed":`):] {
			if ch < '0' || ch > '9' {
				break
			}
			v = v*10 + int(ch-'0')
		}
		n += v
	}
	return n
}

// TestOutageLogsBoundedLines points a real go-redis client at a closed
// loopback port with the Logger installed: 300 failing takes write at most
// one go-redis line per second elapsed (plus the first), not one per take.
func TestOutageLogsBoundedLines(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now: every dial is refused

	buf := &logbuf.Buffer{}
	redis.SetLogger(NewLogger(slog.New(slog.NewTextHandler(buf, nil)), time.Second))
	t.Cleanup(func() { SetLogger(slog.Default()) })

	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = client.Close() })
	s, err := New(client, Options{})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := fleetrate.New(s, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	failed := 0
	for range 300 {
		if _, err := lim.Allow(context.Background(), "k"); errors.Is(err, fleetrate.ErrStoreUnavailable) {
			failed++
		}
	}
	elapsed := time.Since(start)
	if failed != 300 {
		t.Fatalf("%d of 300 takes failed, want all", failed)
	}
	var redisLines int
	for _, l := range logLines(buf.String()) {
		if strings.Contains(l, "source=go-redis") {
			redisLines++
		}
	}
	if bound := int(elapsed/time.Second) + 1; redisLines > bound {
		t.Errorf("%d go-redis lines in %v for 300 failing takes, want at most %d:\n%s", redisLines, elapsed, bound, buf)
	}
	t.Logf("300 failing takes in %v: %d go-redis log lines", elapsed, redisLines)
}
