package transport

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/fleetrate/fleetrate/transport/internal/pacer"
)

// limitInfo is what a rate-limited answer told the transport.
type limitInfo struct {
	limited           bool
	retryAfter, pause time.Duration
	atFloor           bool // the rate was at its floor already
	// cause is why the transport gives up on the request, when it does
	// before its last attempt (its context's deadline); nil otherwise.
	cause error
}

// onLimited handles a 429 (or 503 with Retry-After) to a request sent at
// sent: every rate limit pauses the fleet (without a usable Retry-After,
// for the backoff of this attempt) and lowers the rate (see
// pacer.Pacer.Limited).
func (t *Transport) onLimited(ctx context.Context, tg Target, pt pacer.Target, resp *http.Response, sent time.Time, attempt int) (limitInfo, error) {
	ra, ok := ParseRetryAfter(resp.Header.Get(HeaderRetryAfter), t.now(), t.maxRetryAfter)
	t.m.rateLimited(tg, resp.StatusCode)
	lim, atFloor, err := t.pacer.Limited(ctx, pt, ra, sent, func(lim pacer.Limit) {
		t.log.LogAttrs(ctx, slog.LevelWarn, "rate_limited", append(pt.Attrs,
			slog.Int("status", resp.StatusCode),
			slog.String("retry_after", resp.Header.Get(HeaderRetryAfter)),
			slog.Bool("retry_after_valid", ok),
			slog.Int64("pause_ms", lim.Pause.Milliseconds()),
			slog.Int("attempt", attempt))...)
	})
	return limitInfo{limited: true, retryAfter: ra, pause: lim.Pause, atFloor: atFloor}, err
}

// gaveUp ends a request still rate limited after attempt attempts.
func (t *Transport) gaveUp(ctx context.Context, tg Target, attrs []slog.Attr, attempt int, resp *http.Response, li limitInfo) error {
	cause := li.cause
	if cause == nil && li.atFloor {
		cause = ErrPersistentLimit
	}
	t.m.gaveUpOn(tg)
	t.log.LogAttrs(ctx, slog.LevelError, "rate_gave_up", append(attrs,
		slog.Int("attempts", attempt),
		slog.Int("status", resp.StatusCode))...)
	discard(resp)
	return &GaveUpError{Channel: tg.Channel, Endpoint: tg.Endpoint, Entity: tg.Entity,
		Attempts: attempt, StatusCode: resp.StatusCode, RetryAfter: li.retryAfter, Cause: cause}
}
