package main

import (
	"net/http"
	"sync/atomic"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/server"
	"github.com/fleetrate/fleetrate/statuspage"
)

// statusPath is where `fleetrate serve` mounts the status page.
const statusPath = "/status/"

// newServerWithStatus is server.New with the status page mounted at
// /status/ behind the same tokens: the store is wrapped by the page's
// Counter, and the page shows the configured buckets of the configuration
// in force (reloads included).
func newServerWithStatus(opts server.Options) (*server.Server, error) {
	counter := statuspage.NewCounter()
	peek := opts.Store
	opts.Store = counter.Wrap(opts.Store)
	prefix := opts.Prefix
	if prefix == "" {
		prefix = server.DefaultPrefix
	}
	var srv atomic.Pointer[server.Server]
	page, err := statuspage.New(statuspage.Options{
		Store:   peek,
		Counter: counter,
		Title:   "fleetrate serve",
		Buckets: func() []statuspage.Bucket {
			s := srv.Load()
			if s == nil {
				return nil
			}
			return configBuckets(s, prefix)
		},
	})
	if err != nil {
		return nil, err
	}
	pages := map[string]http.Handler{statusPath: http.StripPrefix(statusPath[:len(statusPath)-1], page)}
	for p, h := range opts.Pages {
		pages[p] = h
	}
	opts.Pages = pages
	s, err := server.New(opts)
	if err != nil {
		return nil, err
	}
	srv.Store(s)
	page.Track()
	return s, nil
}

// configBuckets lists the buckets of the configuration in force.
func configBuckets(s *server.Server, prefix string) []statuspage.Bucket {
	cfg := s.Config()
	out := make([]statuspage.Bucket, 0, len(cfg.Buckets))
	for _, b := range cfg.Buckets {
		out = append(out, statuspage.Bucket{Name: b.Name, Bucket: fleetrate.Bucket{Prefix: prefix, Key: b.Key, Limits: b.TokenLimits()}})
	}
	return out
}
