package transport_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/failsafe"
	"github.com/fleetrate/fleetrate/internal/harness/logbuf"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/lease"
	"github.com/fleetrate/fleetrate/overlimit"
	"github.com/fleetrate/fleetrate/remotestore"
	"github.com/fleetrate/fleetrate/statuspage"
	"github.com/fleetrate/fleetrate/transport"
)

// opaque is a store wrapper that does not unwrap: the control case.
type opaque struct{ fleetrate.Store }

// TestWrappersKeepTheAnnouncer: every store wrapper the module ships
// unwraps to the store it wraps, so a transport over a Limiter on a
// wrapped redisstore.Store still finds its Announcer and does not log
// rate_announcer_missing; a wrapper that does not unwrap, or a shared
// store that cannot announce (remotestore), makes New say so, naming the
// store's type. Removing any one wrapper's Unwrap fails its case. (The
// service's own metrics wrapper is checked in internal/server.)
func TestWrappersKeepTheAnnouncer(t *testing.T) {
	srv := redistest.Start(t)
	redis := openRedisStore(t, srv.URL())

	wrap := map[string]func(t *testing.T, s fleetrate.Store) fleetrate.Store{
		"failsafe": func(t *testing.T, s fleetrate.Store) fleetrate.Store {
			f, err := failsafe.New(s, failsafe.Options{Logger: quiet})
			if err != nil {
				t.Fatalf("failsafe.New: %v", err)
			}
			return f
		},
		"lease": func(t *testing.T, s fleetrate.Store) fleetrate.Store {
			l, err := lease.New(s, lease.Options{Tokens: 4})
			if err != nil {
				t.Fatalf("lease.New: %v", err)
			}
			return l
		},
		"overlimit": func(t *testing.T, s fleetrate.Store) fleetrate.Store {
			return overlimit.New(s, overlimit.Options{})
		},
		"statuspage.Counter": func(t *testing.T, s fleetrate.Store) fleetrate.Store {
			return statuspage.NewCounter().Wrap(s)
		},
	}
	// statuspage.Counter.Wrap returns another type for a store that does
	// not bind takers: cover it too, over a store that hides Bind.
	counterNoBind := func(t *testing.T, s fleetrate.Store) fleetrate.Store {
		type unbound struct{ fleetrate.Store }
		w := statuspage.NewCounter().Wrap(unbound{s})
		if _, ok := w.(fleetrate.Binder); ok {
			t.Fatalf("Counter.Wrap of a store without Bind returned a Binder")
		}
		return w
	}

	cases := []struct {
		name  string
		store func(t *testing.T) fleetrate.Store
		warn  string // the type rate_announcer_missing names; "" for none
	}{
		{"redisstore alone", func(*testing.T) fleetrate.Store { return redis }, ""},
		{"failsafe", func(t *testing.T) fleetrate.Store { return wrap["failsafe"](t, redis) }, ""},
		{"lease", func(t *testing.T) fleetrate.Store { return wrap["lease"](t, redis) }, ""},
		{"overlimit", func(t *testing.T) fleetrate.Store { return wrap["overlimit"](t, redis) }, ""},
		{"statuspage.Counter", func(t *testing.T) fleetrate.Store { return wrap["statuspage.Counter"](t, redis) }, ""},
		{"all nested", func(t *testing.T) fleetrate.Store {
			s := redis
			for _, name := range []string{"failsafe", "lease", "overlimit", "statuspage.Counter"} {
				s = wrap[name](t, s)
			}
			return s
		}, ""},
		// The control: the same search stops at a wrapper without Unwrap,
		// even when what it wraps unwraps on.
		{"no Unwrap", func(*testing.T) fleetrate.Store { return opaque{redis} }, "transport_test.opaque"},
		{"no Unwrap around lease", func(t *testing.T) fleetrate.Store { return opaque{wrap["lease"](t, redis)} }, "transport_test.opaque"},
		// A process on the service's store has no announcement channel
		// (see the remotestore package doc): New says so.
		{"remotestore", func(t *testing.T) fleetrate.Store {
			r, err := remotestore.New("http://127.0.0.1:1", remotestore.Options{})
			if err != nil {
				t.Fatalf("remotestore.New: %v", err)
			}
			return r
		}, "*remotestore.Store"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			checkAnnouncer(t, c.store(t), c.warn)
		})
	}
	t.Run("statuspage.Counter without Bind", func(t *testing.T) {
		checkAnnouncer(t, counterNoBind(t, redis), "transport_test.unbound")
	})
}

// checkAnnouncer builds a transport over a Limiter on store and checks
// that New logged rate_announcer_missing naming the type warn, or nothing
// of the kind when warn is "".
func checkAnnouncer(t *testing.T, store fleetrate.Store, warn string) {
	t.Helper()
	up := bookingCom(10)
	lim, err := fleetrate.New(store, fleetrate.Config{Buckets: up.Buckets()})
	if err != nil {
		t.Fatalf("fleetrate.New: %v", err)
	}
	classify, err := up.Classifier()
	if err != nil {
		t.Fatalf("Classifier: %v", err)
	}
	var log logbuf.Buffer
	tr, err := transport.New(lim, classify, transport.Options{
		Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatalf("transport.New: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	// New logs the warning before it returns; read the log now.
	var missing []string
	for line := range strings.Lines(log.String()) {
		if strings.Contains(line, "rate_announcer_missing") {
			missing = append(missing, line)
		}
	}
	switch {
	case warn == "" && len(missing) > 0:
		t.Errorf("store %T: transport.New warned, want no warning:\n%s", store, strings.Join(missing, ""))
	case warn != "" && len(missing) == 0:
		t.Errorf("store %T: transport.New did not log rate_announcer_missing, want a warning naming %s", store, warn)
	case warn != "" && !strings.Contains(missing[0], "store="+warn+" "):
		t.Errorf("store %T: the warning does not name %s:\n%s", store, warn, missing[0])
	}
}
