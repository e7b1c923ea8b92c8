package transport

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/notice"
)

// Announcer carries announcements between the processes of a fleet, such
// as Redis pub/sub (redisstore.Store implements it). A transport whose
// store is an Announcer (or that is given one in Options.Announcer) tells
// the fleet of every pause and every lowered rate the moment it drains
// them, and listens for the others': a request that slept for its slot
// then knows of a pause announced while it slept without reading the
// markers again, so a queued fleet makes one store call per request.
// Without one (or while it is not listening), such a request reads the
// markers before it sends (see Options.PauseCheckAge).
//
// The transport trusts a subscription from state(true) until state(false),
// so an Announcer must notice a connection that goes silent without
// failing (a NAT that drops it without a reset) within a bounded time:
// redisstore.Store notices within 2 × its Options.ListenCheck (2 s by
// default). Until then a pause announced by another process is not heard,
// and a request booked before it that wakes in that time can be sent
// during it. The transport logs rate_announcements_lost when a
// subscription that held is lost, and rate_announcements_back when one
// holds again.
type Announcer interface {
	// Announce sends msg to every listener of topic.
	Announce(ctx context.Context, topic, msg string) error
	// Listen calls fn with every message on topic until ctx ends, and
	// state(true) each time it begins to listen, state(false) each time it
	// stops or finds the subscription dead, a silent one included, within
	// a bound it documents (a message announced in between is lost). It
	// returns nil when ctx ends, or an error at once when it cannot listen.
	Listen(ctx context.Context, topic string, fn func(msg string), state func(listening bool)) error
}

// AnnounceTopic is the channel on which transports announce pauses and
// lowered rates.
const AnnounceTopic = notice.Topic

// announcerFor returns the Announcer a transport over limiter uses: the
// one given, or else the limiter's store's, looking through wrappers that
// unwrap (nil when there is none). A store that neither announces nor
// unwraps to one that does, and is not process-local, is logged as
// rate_announcer_missing: a fleet whose processes do not all announce
// sends during pauses it was not told of, so that never happens silently.
func announcerFor(limiter *fleetrate.Limiter, given Announcer, log *slog.Logger) notice.Announcer {
	if given != nil {
		return given
	}
	a, stopped := notice.Of(limiter.Store())
	if a == nil && stopped != nil && !notice.ProcessLocal(stopped) {
		log.Warn("rate_announcer_missing",
			slog.String("store", fmt.Sprintf("%T", stopped)),
			slog.String("why", "the store neither announces nor unwraps to one that does: this process will not tell the fleet of its pauses; give it an Unwrap() fleetrate.Store method or set Options.Announcer"))
	}
	return a
}

// Close stops listening for announcements. The transport still works;
// requests that sleep then read the pause markers before they send.
func (t *Transport) Close() error {
	t.pacer.Close()
	return nil
}
