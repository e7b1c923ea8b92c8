package server

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fleetrate/fleetrate/internal/config"
)

// debugEndpoints are the paths of DebugHandler with their help, listed at
// its root as envoyproxy/ratelimit's debug port lists its own.
var debugEndpoints = [][2]string{
	{"/rlconfig", "the configuration in force, one line per rule"},
	{"/stats", "the metrics, in Prometheus text format"},
	{"/debug/pprof/", "Go's profiles (net/http/pprof): index"},
	{"/debug/pprof/profile", "CPU profile (?seconds=N)"},
	{"/debug/pprof/trace", "execution trace (?seconds=N)"},
	{"/debug/pprof/cmdline", "the command line"},
	{"/debug/pprof/symbol", "symbol lookup"},
}

// DebugHandler serves envoyproxy/ratelimit's debug port (DEBUG_PORT): the
// configuration in force at /rlconfig, the metrics at /stats, Go's pprof
// under /debug/pprof/, and the list of them at /. It has no access
// control: serve it on a loopback address, or one only operators reach.
func (s *Server) DebugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /rlconfig", s.rlconfig)
	mux.Handle("GET /stats", promhttp.HandlerFor(s.opts.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		for _, e := range debugEndpoints {
			fmt.Fprintf(w, "%s: %s\n", e[0], e[1])
		}
	})
	return mux
}

// rlconfig writes the configuration in force as envoyproxy/ratelimit's
// /rlconfig does, one line per rule, sorted:
// "domain.key_value: 10/minute, shadow_mode: false, quota_mode: false"
// (fleetrate's limit notation: several limits, a burst), then the file's
// buckets.
func (s *Server) rlconfig(w http.ResponseWriter, r *http.Request) {
	cfg := s.Config()
	var lines []string
	for _, d := range cfg.Domains {
		d.Walk(func(r *config.Rule) {
			lim := "unlimited"
			if !r.Unlimited {
				lim = strings.Join(append(specs(r.Limits), quotaSpecs(r.Quotas)...), " + ")
			}
			lines = append(lines, fmt.Sprintf("%s: %s, shadow_mode: %t, quota_mode: %t\n", r.ID, lim, r.ShadowMode, r.QuotaMode))
		})
	}
	slices.Sort(lines)
	for _, b := range cfg.Buckets {
		lines = append(lines, fmt.Sprintf("bucket %s (key %s%s): %s\n", b.Name, s.opts.Prefix, b.Key, strings.Join(append(specs(b.Limits), quotaSpecs(b.Quotas)...), " + ")))
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	for _, l := range lines {
		_, _ = w.Write([]byte(l))
	}
}
