package ratelog_test

import (
	"bytes"
	"log"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/ratelog"
)

func TestGateLetsOneLinePerInterval(t *testing.T) {
	var g ratelog.Gate
	t0 := time.Unix(1000, 0)
	if ok, n := g.Pass(t0); !ok || n != 0 {
		t.Fatalf("first line: ok %v, suppressed %d; want true, 0", ok, n)
	}
	for i := range 5 {
		if ok, _ := g.Pass(t0.Add(time.Duration(i+1) * 100 * time.Millisecond)); ok {
			t.Fatalf("line %d within the interval passed", i+1)
		}
	}
	if ok, n := g.Pass(t0.Add(time.Second)); !ok || n != 5 {
		t.Fatalf("line after the interval: ok %v, suppressed %d; want true, 5", ok, n)
	}
}

// TestWriterUnderALogLogger: a log.Logger writing through a Writer, as
// http.Server.ErrorLog does, turns 200 lines in a second into one
// structured line, and the next second's first line reports the 199.
func TestWriterUnderALogLogger(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(2000, 0)
	w := &ratelog.Writer{Log: slog.New(slog.NewTextHandler(&buf, nil)), Source: "http", Now: func() time.Time { return now }}
	l := log.New(w, "", 0)
	for range 200 {
		l.Printf("http: TLS handshake error from 127.0.0.1:1234: client didn't provide a certificate")
	}
	now = now.Add(time.Second)
	l.Printf("http: TLS handshake error from 127.0.0.1:1235: EOF")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2:\n%s", len(lines), buf.String())
	}
	for i, want := range []string{"suppressed=0", "suppressed=199"} {
		if !strings.Contains(lines[i], want) || !strings.Contains(lines[i], "level=WARN") || !strings.Contains(lines[i], "source=http") {
			t.Errorf("line %d = %q, want WARN, source=http and %s", i, lines[i], want)
		}
	}
}
