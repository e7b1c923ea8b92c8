// Command plans is an API sold in plans that reset on the calendar,
// protected by fleetrate's HTTP middleware:
//
//   - free: 100 requests a day, resetting at midnight in the customer's
//     time zone, at most 10 a minute;
//   - pro: 10,000 requests a month, resetting on the 1st (midnight in the
//     customer's time zone), at most 100 a minute.
//
// The per-minute bucket smooths the plan: no customer spends the day's
// quota in one burst. GET /v1/usage answers the calling customer's usage
// as JSON, for a "my usage" page.
//
//	go run ./examples/plans
//
//	curl -i -X POST localhost:8091/v1/messages -H 'X-API-Key: sk_free_tokyo'
//	curl -s localhost:8091/v1/usage -H 'X-API-Key: sk_free_tokyo'
//
// The customers are a fixed table (see customers); a real service would
// look the API key up in its accounts. The buckets live in memory; give
// httplimit.Config a redisstore to share them across a fleet.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
	"github.com/fleetrate/fleetrate/httplimit"
	"github.com/fleetrate/fleetrate/memstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "plans:", err)
		os.Exit(1)
	}
}

// customer is an account: its plan and the time zone its quota follows.
type customer struct {
	Plan string // "free" or "pro"
	Zone string // as calendar.Parse reads it
}

// customers are the demo accounts, by API key.
var customers = map[string]customer{
	"sk_free_tokyo": {Plan: "free", Zone: "Asia/Tokyo"},
	"sk_free_paris": {Plan: "free", Zone: "Europe/Paris"},
	"sk_pro_acme":   {Plan: "pro", Zone: "America/New_York"},
}

// errUnknownCustomer answers a request whose API key is no customer's.
var errUnknownCustomer = errors.New("unknown API key")

// customerOf returns the customer calling r.
func customerOf(r *http.Request) (customer, error) {
	c, ok := customers[r.Header.Get("X-API-Key")]
	if !ok {
		return customer{}, errUnknownCustomer
	}
	return c, nil
}

// plans is the API's policy: one tier per plan, each a calendar quota in
// the customer's zone smoothed by a per-minute bucket.
func plans() httplimit.Policy {
	day := calendar.Period{Unit: calendar.Day}
	month := calendar.Period{Unit: calendar.Month, Day: 1}
	return httplimit.Policy{
		Name: "api",
		Tiers: []httplimit.Tier{{
			Name:   "free",
			Limits: []fleetrate.Limit{fleetrate.PerPeriod(10, time.Minute).Named("minute")},
			Quotas: []fleetrate.Quota{{Name: "day", Count: 100, Period: day}},
		}, {
			Name:   "pro",
			Limits: []fleetrate.Limit{fleetrate.PerPeriod(100, time.Minute).Named("minute")},
			Quotas: []fleetrate.Quota{{Name: "month", Count: 10_000, Period: month}},
		}},
		Tier: func(r *http.Request) (string, error) {
			c, err := customerOf(r)
			return c.Plan, err
		},
		QuotaZone: func(r *http.Request) (string, error) {
			c, err := customerOf(r)
			return c.Zone, err
		},
	}
}

// newServer returns the API over store: POST /v1/messages within the
// caller's plan, GET /v1/usage and GET /healthz.
func newServer(store fleetrate.Store, logger *slog.Logger) (http.Handler, error) {
	m, err := httplimit.New(httplimit.Config{
		Store:         store,
		Key:           httplimit.APIKey("X-API-Key"),
		LegacyHeaders: true,
		Logger:        logger,
		KeyError: func(w http.ResponseWriter, _ *http.Request, err error) {
			httplimit.WriteProblem(w, http.StatusUnauthorized, httplimit.Problem{
				Title: http.StatusText(http.StatusUnauthorized), Detail: err.Error(),
			})
		},
	})
	if err != nil {
		return nil, err
	}
	limit, err := m.Limit(plans())
	if err != nil {
		return nil, err
	}
	usage, err := m.UsageHandler(plans())
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/messages", limit(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"status":"sent"}`+"\n")
	})))
	mux.Handle("GET /v1/usage", usage)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	return mux, nil
}

// run parses args and serves the API until ctx ends.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plans", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8091", "listen address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	api, err := newServer(memstore.New(memstore.Options{}), logger)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	fmt.Fprintf(stdout, "plans: listening on http://%s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
