package main

import (
	"fmt"
	"io"
	"math"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetrate/fleetrate/internal/cli/mockota"
	"github.com/fleetrate/fleetrate/transport"
)

// printHeader says what the demo runs.
func printHeader(w io.Writer, o demoOptions) {
	cfg := demoOTA()
	ota, _ := mockota.New(cfg) // valid: demoOTA is fixed
	where := "goroutines"
	if o.processes > 1 {
		where = fmt.Sprintf("%d processes", o.processes)
	}
	store := o.storeName()
	fmt.Fprintf(w, "fleetrate demo: three fleets of %d workers (%s) side by side for %v, each against its own mock OTA\n", o.workers, where, o.duration)
	fmt.Fprintf(w, "documented limits: %s (sliding 1 s window)\n", ota.Describe())
	fmt.Fprintf(w, "hidden limit: %s %d/s (not documented; its 429s say Retry-After: %d)\n",
		cfg.Hidden.Endpoint, cfg.Hidden.Limit, int(cfg.Hidden.RetryAfter.Seconds()))
	var mix []string
	for _, m := range demoMix {
		mix = append(mix, fmt.Sprintf("%d %s", m.parts, m.endpoint))
	}
	fmt.Fprintf(w, "each worker sends one request after another, of every %d: %s (a fleet whose requests all end ok gets at most %.0f ok/s past the hidden limit)\n",
		demoMixTotal, strings.Join(mix, ", "), hiddenCap())
	fmt.Fprintf(w, "  %-9s each worker has its own local %g/s bucket and honours Retry-After alone\n", modeNaive, o.rate)
	fmt.Fprintf(w, "  %-9s all workers share buckets at %g%% of each documented limit, in %s; a 429 pauses the endpoint fleet-wide\n", modeShared, o.share*100, store)
	fmt.Fprintf(w, "  %-9s as shared, and each 429 also lowers the endpoint's shared rate (x%g), which climbs back without 429s\n", modeAdaptive, transport.DefaultDecrease)
}

// storeName names the store the shared fleets and the priority runs use.
func (o demoOptions) storeName() string {
	if o.redis != "" {
		if u, err := url.Parse(o.redis); err == nil {
			return "Redis at " + u.Redacted() // without its password
		}
		return "Redis"
	}
	return "the in-memory store"
}

// printComparison prints the three fleets side by side: what the OTAs
// counted, what the workers counted, the rate per endpoint, a check that
// the two counts agree, what every column means, and the verdict.
func printComparison(w io.Writer, o demoOptions, rs []modeResult) {
	if len(rs) == 0 {
		return
	}
	cfg := demoOTA()
	secs := o.duration.Seconds()
	printTable(w, func(tw io.Writer) {
		fmt.Fprintf(tw, "what the OTA counted\tsent\tok\t429 documented\t429 hidden\tok/s\tok/s of %d/s\tpeak in 1 s\t\n", cfg.Credential)
		for _, r := range rs {
			t := r.total()
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.1f\t%.0f%%\t%d/%d\t\n", r.mode, t.Requests, t.Accepted, t.Documented, t.Hidden,
				float64(t.Accepted)/secs, 100*float64(t.Accepted)/secs/float64(cfg.Credential), t.Peak, cfg.Credential)
		}
	})
	printTable(w, func(tw io.Writer) {
		fmt.Fprintln(tw, "what the workers counted\trequests\tok\t429\tgave up\tbackpressure\tcut\terror\tsent\twait p50\twait p99\t")
		for _, r := range rs {
			oc := r.report.Outcomes
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%v\t%v\t\n", r.mode, r.report.requests(), oc[outcomeOK], oc[outcomeLimited],
				oc[outcomeGaveUp], oc[outcomeBackpressure], oc[outcomeCut], oc[outcomeError], r.report.Sends,
				percentile(r.report.Waits, 50).Round(time.Millisecond), percentile(r.report.Waits, 99).Round(time.Millisecond))
		}
	})
	printTable(w, func(tw io.Writer) {
		fmt.Fprint(tw, "ok/s per endpoint\tdocumented\thidden")
		for _, r := range rs {
			fmt.Fprintf(tw, "\t%s", r.mode)
		}
		fmt.Fprintln(tw, "\t")
		for _, e := range rs[0].endpoints {
			hidden := "-"
			if cfg.Hidden != nil && cfg.Hidden.Endpoint == e.Name && cfg.Hidden.Key == "" {
				hidden = fmt.Sprintf("%d/s", cfg.Hidden.Limit)
			}
			fmt.Fprintf(tw, "%s\t%d/s\t%s", e.Name, e.Limit, hidden)
			for _, r := range rs {
				fmt.Fprintf(tw, "\t%.1f", float64(r.stats[e.Name].Accepted)/secs)
			}
			fmt.Fprintln(tw, "\t")
		}
	})
	printCheck(w, rs)
	printLegend(w, cfg)
	printVerdict(w, rs)
}

// printTable prints one right-aligned table, then a blank line.
func printTable(w io.Writer, rows func(tw io.Writer)) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	rows(tw)
	tw.Flush()
	fmt.Fprintln(w)
}

// countsDisagree lists where the workers' counts and the OTA's differ.
func countsDisagree(rs []modeResult) []string {
	var bad []string
	for _, r := range rs {
		t := r.total()
		if r.report.Sends != t.Requests {
			bad = append(bad, fmt.Sprintf("%s: the workers sent %d, the OTA counted %d", r.mode, r.report.Sends, t.Requests))
		}
		if ok := r.report.Outcomes[outcomeOK]; ok != t.Accepted {
			bad = append(bad, fmt.Sprintf("%s: the workers saw ok %d, the OTA answered ok %d", r.mode, ok, t.Accepted))
		}
		if t.Requests != t.Accepted+t.Limited() {
			bad = append(bad, fmt.Sprintf("%s: the OTA counted %d sent but %d ok and %d 429s", r.mode, t.Requests, t.Accepted, t.Limited()))
		}
	}
	return bad
}

// printCheck says whether the workers' counts and the OTA's agree.
func printCheck(w io.Writer, rs []modeResult) {
	if bad := countsDisagree(rs); len(bad) > 0 {
		fmt.Fprintf(w, "counts disagree: %s\n\n", strings.Join(bad, "; "))
		return
	}
	fmt.Fprint(w, "counts agree: in every fleet the workers' sent and ok equal the OTA's, and the OTA's sent = ok + 429s\n\n")
}

// demoColumns explains every column printComparison prints, in order.
var demoColumns = [][2]string{
	{"sent", "requests that reached the OTA, retries included; for the workers too"},
	{"ok", "answered 200"},
	{"429 documented", "refused for breaking a documented limit; the shared fleets promise 0"},
	{"429 hidden", "refused by the hidden limit"},
	{"ok/s", "ok per second of the run"},
	{"ok/s of 30/s", "ok/s against the documented credential limit"},
	{"peak in 1 s", "most requests the OTA accepted in any 1-second window"},
	{"requests", "requests the workers made, each counted once however often it was sent:"},
	{"", "ok + 429 + gave up + backpressure + cut + error"},
	{"429", "the worker got a 429 back (naive workers then honour Retry-After alone)"},
	{"gave up", "sent, answered 429, and the transport stopped retrying: its attempts"},
	{"", "were spent, or no retry could be booked before the end of the run"},
	{"backpressure", "not sent: its wait for the shared buckets exceeded the max wait (5s)"},
	{"cut", "not sent: its turn came after the end of the run (a worker's last request)"},
	{"error", "any other failure"},
	{"wait p50, wait p99", "from a request's start to its first send, over the requests sent"},
	{"ok/s per endpoint", "ok/s of each endpoint in each fleet"},
	{"documented, hidden", "the endpoint's documented limit, and its hidden one"},
}

// printLegend explains every column.
func printLegend(w io.Writer, cfg mockota.Config) {
	fmt.Fprintln(w, "columns:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range demoColumns {
		name := strings.ReplaceAll(c[0], "30/s", fmt.Sprintf("%d/s", cfg.Credential))
		fmt.Fprintf(tw, "  %s\t%s\n", name, c[1])
	}
	tw.Flush()
	fmt.Fprintln(w)
}

// printVerdict says which fleets broke a documented limit.
func printVerdict(w io.Writer, rs []modeResult) {
	var parts []string
	for _, r := range rs {
		if n := r.documented(); n > 0 {
			parts = append(parts, fmt.Sprintf("%s broke documented limits (%s)", r.mode, plural(n, "429")))
		} else {
			parts = append(parts, fmt.Sprintf("%s broke none", r.mode))
		}
	}
	fmt.Fprintf(w, "verdict: %s\n", strings.Join(parts, "; "))
}

// percentile returns the p-th percentile of ds (nearest rank), 0 when
// empty.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(float64(p) / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// plural is n and what, with an s unless n is 1: "1 429", "3 429s".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
