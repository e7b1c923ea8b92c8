package transport

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetrate/fleetrate"
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
const AnnounceTopic = "fleetrate:transport:announce"

// listener is a transport's side of an Announcer.
type listener struct {
	a      Announcer
	prefix string // the limiter's key prefix: messages name store keys
	stop   context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	since time.Time // when the current subscription began; zero: none
	lost  bool      // a subscription was lost, and none began since
}

// announcerOf returns the Announcer of store, looking through wrappers
// that unwrap to the store they wrap (every wrapper this module ships
// does: failsafe, lease, overlimit, statuspage.Counter), or nil and the
// store where the search stopped: one that neither announces nor
// unwraps.
func announcerOf(store fleetrate.Store) (Announcer, fleetrate.Store) {
	for store != nil {
		if a, ok := store.(Announcer); ok {
			return a, nil
		}
		u, ok := store.(interface{ Unwrap() fleetrate.Store })
		if !ok {
			return nil, store
		}
		store = u.Unwrap()
	}
	return nil, nil
}

// processLocal reports whether store keeps its buckets in this process
// only, so that no other process could hear an announcement: a
// memstore.Store does, and says so with ProcessLocal.
func processLocal(store fleetrate.Store) bool {
	l, ok := store.(interface{ ProcessLocal() bool })
	return ok && l.ProcessLocal()
}

// listen starts listening on a, for the transport t.
func (t *Transport) listen(a Announcer, prefix string) {
	ctx, stop := context.WithCancel(context.Background())
	l := &listener{a: a, prefix: prefix, stop: stop, done: make(chan struct{})}
	t.ann = l
	go func() {
		defer close(l.done)
		err := a.Listen(ctx, AnnounceTopic, t.heard, func(on bool) {
			l.mu.Lock()
			was, lost := !l.since.IsZero(), l.lost
			switch {
			case !on && was:
				l.since, l.lost = time.Time{}, true
			case on && !was:
				l.since, l.lost = time.Now(), false
			}
			l.mu.Unlock()
			switch {
			case !on && was:
				t.log.Warn("rate_announcements_lost", "detail", "until announcements are heard again, a request that slept reads the pause markers before it sends")
			case on && !was && lost:
				t.log.Info("rate_announcements_back")
			}
		})
		if err != nil {
			t.log.Warn("rate_announcements_off", "error", err.Error())
		}
		l.mu.Lock()
		l.since = time.Time{}
		l.mu.Unlock()
	}()
}

// listening reports whether every announcement since at has been heard:
// the subscription began before at and still holds.
func (t *Transport) listening(at time.Time) bool {
	if t.ann == nil {
		return false
	}
	t.ann.mu.Lock()
	defer t.ann.mu.Unlock()
	return !t.ann.since.IsZero() && !t.ann.since.After(at)
}

// Close stops listening for announcements. The transport still works;
// requests that sleep then read the pause markers before they send.
func (t *Transport) Close() error {
	if t.ann != nil {
		t.ann.stop()
		<-t.ann.done
	}
	return nil
}

// Announcement messages: "p <store key> <pause ns>" for a pause, "r <store
// key>" for a lowered rate.

// announcePause tells the fleet that bucket b pauses for d, best effort.
func (t *Transport) announcePause(ctx context.Context, b fleetrate.Bucket, d time.Duration) {
	t.announce(ctx, "p "+b.StoreKey()+" "+strconv.FormatInt(int64(d), 10))
}

// announceRate tells the fleet that bucket b's rate was lowered.
func (t *Transport) announceRate(ctx context.Context, b fleetrate.Bucket) {
	t.announce(ctx, "r "+b.StoreKey())
}

func (t *Transport) announce(ctx context.Context, msg string) {
	if t.ann == nil {
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	defer cancel()
	if err := t.ann.a.Announce(actx, AnnounceTopic, msg); err != nil {
		t.log.Warn("rate_announce_failed", "error", err.Error())
	}
}

// heard applies an announcement to this process's views. Messages for
// other limiters' keys, and malformed ones, are ignored.
func (t *Transport) heard(msg string) {
	kind, rest, ok := strings.Cut(msg, " ")
	if !ok {
		return
	}
	now := time.Now()
	switch kind {
	case "p":
		i := strings.LastIndexByte(rest, ' ')
		if i < 0 {
			return
		}
		key, ok := strings.CutPrefix(rest[:i], t.ann.prefix)
		d, err := strconv.ParseInt(rest[i+1:], 10, 64)
		if !ok || err != nil || d <= 0 || d > int64(fleetrate.MaxWaitCap) {
			return
		}
		t.views.mu.Lock()
		v := t.views.get(key)
		t.learnPause(v, key, now.Add(time.Duration(d)))
		// Announced once the bucket was reset: any slot booked before now
		// may be from before the reset, so it is void.
		v.pauseAt = now
		t.views.mu.Unlock()
	case "r":
		key, ok := strings.CutPrefix(rest, t.ann.prefix)
		if !ok {
			return
		}
		t.views.mu.Lock()
		t.views.get(key).read = time.Time{} // read the climb with the next take
		t.views.mu.Unlock()
	}
}
