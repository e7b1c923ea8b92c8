package redisstore

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate/internal/ratelog"
)

// DefaultLogInterval is the least time between two lines a Logger writes:
// one a second, as the rest of fleetrate logs a failing store.
const DefaultLogInterval = ratelog.DefaultInterval

// Logger carries go-redis's own log lines (such as "redis: connection pool:
// failed to dial after 5 attempts") to a *slog.Logger at Warn level,
// rate-limited: at most one line per interval. The lines in between are
// counted, and the count is logged as "suppressed" with the next line, so
// a Redis outage writes a line a second however many requests fail. It is
// safe for concurrent use. Install it with SetLogger.
type Logger struct {
	w ratelog.Writer
}

// NewLogger returns a Logger writing to log (slog.Default() when nil) at
// most one line per interval (DefaultLogInterval when zero or negative).
func NewLogger(log *slog.Logger, interval time.Duration) *Logger {
	if log == nil {
		log = slog.Default()
	}
	return &Logger{w: ratelog.Writer{Log: log, Source: "go-redis", Gate: ratelog.Gate{Interval: interval}}}
}

// Printf implements go-redis's logging interface.
func (l *Logger) Printf(ctx context.Context, format string, v ...any) {
	if ctx == nil {
		ctx = context.Background()
	}
	l.w.Logf(ctx, format, v...)
}

// SetLogger makes log, through a Logger of DefaultLogInterval, the
// process-wide logger of go-redis (redis.SetLogger), in place of its
// default, which prints one unstructured line to stderr per failed dial,
// that is per request while Redis is down. Call it once at start-up,
// before making clients.
func SetLogger(log *slog.Logger) {
	redis.SetLogger(NewLogger(log, DefaultLogInterval))
}
