// Package notice is the transport's fleet notice: the announcements by
// which the processes of a fleet tell each other of pauses and lowered
// rates the moment they drain them, and the listener's trust rule.
//
// The trust rule: a listener trusts that it heard every announcement made
// from the moment its subscription began until the Announcer reports it
// lost (Listener.Listening). The Announcer must notice a connection that
// went silent within a bound it documents.
package notice

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetrate/fleetrate"
)

// Announcer carries announcements between the processes of a fleet (the
// transport's public Announcer has the same methods).
type Announcer interface {
	Announce(ctx context.Context, topic, msg string) error
	Listen(ctx context.Context, topic string, fn func(msg string), state func(listening bool)) error
}

// Topic is the channel on which transports announce.
const Topic = "fleetrate:transport:announce"

// Kind is what a message announces.
type Kind byte

// The kinds of message.
const (
	// Pause announces a bucket paused for Message.Pause.
	Pause Kind = 'p'
	// Rate announces a bucket whose rate was lowered.
	Rate Kind = 'r'
)

// Message is one announcement, of the bucket keyed Key (a limiter's key,
// without its store prefix).
type Message struct {
	Kind  Kind
	Key   string
	Pause time.Duration // for Pause, above 0 and at most fleetrate.MaxWaitCap
}

// Format returns m as sent on the wire, for a limiter whose store keys
// begin with prefix: "p <store key> <pause ns>" or "r <store key>".
func (m Message) Format(prefix string) string {
	if m.Kind == Pause {
		return "p " + prefix + m.Key + " " + strconv.FormatInt(int64(m.Pause), 10)
	}
	return "r " + prefix + m.Key
}

// Parse reads a message for a limiter whose store keys begin with prefix.
// It reports false for a malformed message, a pause out of bounds, or a
// message for another limiter's keys.
func Parse(msg, prefix string) (Message, bool) {
	kind, rest, ok := strings.Cut(msg, " ")
	if !ok || len(kind) != 1 {
		return Message{}, false
	}
	switch Kind(kind[0]) {
	case Pause:
		i := strings.LastIndexByte(rest, ' ')
		if i < 0 {
			return Message{}, false
		}
		key, ok := strings.CutPrefix(rest[:i], prefix)
		d, err := strconv.ParseInt(rest[i+1:], 10, 64)
		if !ok || err != nil || d <= 0 || d > int64(fleetrate.MaxWaitCap) {
			return Message{}, false
		}
		return Message{Kind: Pause, Key: key, Pause: time.Duration(d)}, true
	case Rate:
		key, ok := strings.CutPrefix(rest, prefix)
		if !ok {
			return Message{}, false
		}
		return Message{Kind: Rate, Key: key}, true
	}
	return Message{}, false
}

// Of returns the Announcer of store, looking through wrappers that unwrap
// to the store they wrap (every wrapper this module ships does: failsafe,
// lease, overlimit, statuspage.Counter), or nil and the store where the
// search stopped: one that neither announces nor unwraps.
func Of(store fleetrate.Store) (Announcer, fleetrate.Store) {
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

// ProcessLocal reports whether store keeps its buckets in this process
// only, so that no other process could hear an announcement: a
// memstore.Store does, and says so with ProcessLocal.
func ProcessLocal(store fleetrate.Store) bool {
	l, ok := store.(interface{ ProcessLocal() bool })
	return ok && l.ProcessLocal()
}

// Listener is a transport's side of an Announcer.
type Listener struct {
	a       Announcer
	prefix  string // the limiter's key prefix: messages name store keys
	log     *slog.Logger
	now     func() time.Time
	timeout time.Duration
	stop    context.CancelFunc
	done    chan struct{}

	mu    sync.Mutex
	since time.Time // when the current subscription began; zero: none
	lost  bool      // a subscription was lost, and none began since
}

// ListenOptions are where a Listener listens and how: the store keys'
// prefix of its limiter, its logger, its clock, and how long its own
// announcements may take.
type ListenOptions struct {
	Prefix  string
	Log     *slog.Logger
	Now     func() time.Time
	Timeout time.Duration
}

// Listen starts listening on a for the messages of a limiter whose store
// keys begin with o.Prefix, calling heard with each, on the clock o.Now.
// Its own announcements give up after o.Timeout. Close stops it.
func Listen(a Announcer, o ListenOptions, heard func(Message)) *Listener {
	prefix, log, now, timeout := o.Prefix, o.Log, o.Now, o.Timeout
	ctx, stop := context.WithCancel(context.Background())
	l := &Listener{a: a, prefix: prefix, log: log, now: now, timeout: timeout, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		err := a.Listen(ctx, Topic, func(msg string) {
			if m, ok := Parse(msg, prefix); ok {
				heard(m)
			}
		}, l.state)
		if err != nil {
			log.Warn("rate_announcements_off", "error", err.Error())
		}
		l.mu.Lock()
		l.since = time.Time{}
		l.mu.Unlock()
	}()
	return l
}

// state records that the subscription began (on) or was lost, and logs a
// loss and a return.
func (l *Listener) state(on bool) {
	l.mu.Lock()
	was, lost := !l.since.IsZero(), l.lost
	switch {
	case !on && was:
		l.since, l.lost = time.Time{}, true
	case on && !was:
		l.since, l.lost = l.now(), false
	}
	l.mu.Unlock()
	switch {
	case !on && was:
		l.log.Warn("rate_announcements_lost", "detail", "until announcements are heard again, a request that slept reads the pause markers before it sends")
	case on && !was && lost:
		l.log.Info("rate_announcements_back")
	}
}

// Listening reports whether every announcement since at has been heard:
// the subscription began before at and still holds. A nil Listener hears
// nothing.
func (l *Listener) Listening(at time.Time) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.since.IsZero() && !l.since.After(at)
}

// Announce tells the fleet m, best effort, even once ctx has ended. A nil
// Listener announces nothing.
func (l *Listener) Announce(ctx context.Context, m Message) {
	if l == nil {
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
	defer cancel()
	if err := l.a.Announce(actx, Topic, m.Format(l.prefix)); err != nil {
		l.log.Warn("rate_announce_failed", "error", err.Error())
	}
}

// Close stops listening and waits for the listening goroutine to end.
func (l *Listener) Close() {
	if l != nil {
		l.stop()
		<-l.done
	}
}
