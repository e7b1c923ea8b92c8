// Package ratelog rate-limits log lines that a peer can trigger at will
// (a failed dial per request while Redis is down, a failed TLS handshake
// per connection): at most one line per interval, with the count of the
// lines left out in between, so that no client writes the log at its
// connection rate.
package ratelog

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// DefaultInterval is the least time between two lines: one a second.
const DefaultInterval = time.Second

// Gate lets one line through per interval and counts the rest. The zero
// Gate lets one line a DefaultInterval through. It is safe for concurrent
// use.
type Gate struct {
	// Interval is the least time between two lines; zero or negative
	// means DefaultInterval.
	Interval time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// Pass reports whether a line at now may be written and, when it may,
// how many lines were left out since the last one written.
func (g *Gate) Pass(now time.Time) (ok bool, suppressed int) {
	interval := g.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.last.IsZero() && now.Sub(g.last) < interval {
		g.suppressed++
		return false, 0
	}
	suppressed = g.suppressed
	g.last, g.suppressed = now, 0
	return true, suppressed
}

// Writer is an io.Writer for a log.Logger (such as http.Server.ErrorLog)
// that writes each line it is given to Log at Warn level, with the
// attribute source=Source and the count of lines left out, through Gate.
type Writer struct {
	Log    *slog.Logger
	Source string
	Gate   Gate
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Write logs p as one line; it never fails.
func (w *Writer) Write(p []byte) (int, error) {
	w.Logf(context.Background(), "%s", p)
	return len(p), nil
}

// Logf logs one line, formatted as fmt.Sprintf does and trimmed of
// surrounding space, unless Gate holds it back.
func (w *Writer) Logf(ctx context.Context, format string, v ...any) {
	now := time.Now
	if w.Now != nil {
		now = w.Now
	}
	if ok, suppressed := w.Gate.Pass(now()); ok {
		w.Log.LogAttrs(ctx, slog.LevelWarn, strings.TrimSpace(fmt.Sprintf(format, v...)),
			slog.String("source", w.Source), slog.Int("suppressed", suppressed))
	}
}
