package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetrate/fleetrate/internal/cli/loadgen"
	"github.com/fleetrate/fleetrate/redisstore"
)

// recommend derives the recommended settings from the measurements.
func recommend(cfg benchConfig, rep benchReport) []benchAdvice {
	batch := adviseBatch(cfg, rep.Rows)
	batchOn := strings.HasPrefix(batch.Value, "on")
	out := []benchAdvice{batch, advisePool(cfg, rep, batchOn), adviseTimeout(rep.Rows, batchOn)}
	if a, ok := adviseLease(cfg, rep); ok {
		out = append(out, a)
	}
	return out
}

// find returns the row of mode and config at g callers over n keys.
func find(rows []benchRow, mode, conf string, g, n int) (benchRow, bool) {
	i := slices.IndexFunc(rows, func(r benchRow) bool {
		return r.Mode == mode && r.Config == conf && r.Concurrency == g && r.Keys == n
	})
	if i < 0 {
		return benchRow{}, false
	}
	return rows[i], true
}

// batchRatio is batched over unbatched Allow throughput at g callers,
// the geometric mean over the key spreads.
func batchRatio(cfg benchConfig, rows []benchRow, g int) float64 {
	logSum, k := 0.0, 0
	for _, n := range cfg.keys {
		b, ok1 := find(rows, "allow", "batch", g, n)
		u, ok2 := find(rows, "allow", "unbatched", g, n)
		if ok1 && ok2 && b.PerSecond > 0 && u.PerSecond > 0 {
			logSum += math.Log(b.PerSecond / u.PerSecond)
			k++
		}
	}
	if k == 0 {
		return 1
	}
	return math.Exp(logSum / float64(k))
}

// adviseBatch recommends batching where it is never slower (within 5 %,
// the noise of a short run) and, when it is slower for few callers,
// from the concurrency on where it is faster.
func adviseBatch(cfg benchConfig, rows []benchRow) benchAdvice {
	var why []string
	from := 0
	allGood := true
	for _, g := range cfg.concurrency {
		r := batchRatio(cfg, rows, g)
		why = append(why, fmt.Sprintf("%.2f× at %s", r, callers(g)))
		allGood = allGood && r >= 0.95
		switch {
		case r >= 1.05 && from == 0:
			from = g
		case r < 0.95:
			from = 0
		}
	}
	a := benchAdvice{Setting: "redisstore.Options batching", Why: "batched over unbatched Allow throughput: " + strings.Join(why, ", ")}
	g0, n0 := cfg.concurrency[0], cfg.keys[0]
	if b, ok := find(rows, "allow", "batch", g0, n0); ok {
		u, _ := find(rows, "allow", "unbatched", g0, n0)
		a.Why += fmt.Sprintf("; p50 at %s over %d keys: %.0fµs batched, %.0fµs unbatched", callers(g0), n0, b.P50Micros, u.P50Micros)
	}
	switch {
	case allGood:
		a.Value = "on"
	case from > 0:
		a.Value = fmt.Sprintf("on where a process has %d or more concurrent callers; off for fewer", from)
	default:
		a.Value = "off"
	}
	return a
}

// callers is "1 caller" or "n callers".
func callers(n int) string {
	if n == 1 {
		return "1 caller"
	}
	return fmt.Sprintf("%d callers", n)
}

// advisePool recommends a connection pool size from the calls that
// waited for a connection at the highest concurrency.
func advisePool(cfg benchConfig, rep benchReport, batchOn bool) benchAdvice {
	g := slices.Max(cfg.concurrency)
	conf := "unbatched"
	if batchOn {
		conf = "batch"
	}
	var waits int64
	for _, n := range cfg.keys {
		if r, ok := find(rep.Rows, "allow", conf, g, n); ok {
			waits += r.PoolWaits
		}
	}
	a := benchAdvice{Setting: "go-redis PoolSize"}
	if waits == 0 {
		a.Value = fmt.Sprintf("your client's %d is enough", rep.PoolSize)
		a.Why = fmt.Sprintf("at %d callers (%s) no call waited for a connection", g, conf)
		return a
	}
	a.Value = fmt.Sprintf("at least %d (your peak concurrent callers)", g)
	a.Why = fmt.Sprintf("at %d callers (%s) calls waited %d times for one of the pool's %d connections", g, conf, waits, rep.PoolSize)
	return a
}

// adviseTimeout checks the store's call timeout against the worst p99 of
// the recommended configuration.
func adviseTimeout(rows []benchRow, batchOn bool) benchAdvice {
	worst, errs, first := 0.0, int64(0), ""
	for _, r := range rows {
		if r.Config == "lease" || (r.Config == "batch") != batchOn {
			continue
		}
		worst = max(worst, r.P99Micros)
		errs += r.Errors
		if first == "" {
			first = r.FirstError
		}
	}
	def := redisstore.DefaultTimeout
	p99 := time.Duration(worst * 1e3).Round(time.Microsecond)
	a := benchAdvice{Setting: "redisstore.Options.Timeout"}
	if errs == 0 && p99 <= def/4 {
		a.Value = fmt.Sprintf("the default, %v", def)
		a.Why = fmt.Sprintf("worst p99 %v, no errors", p99)
		return a
	}
	a.Value = max(def, (4 * p99).Round(time.Millisecond)).String()
	a.Why = fmt.Sprintf("worst p99 %v and %d errors with the default %v", p99, errs, def)
	if first != "" {
		a.Why += " (first: " + first + ")"
	}
	return a
}

// adviseLease reports how far a lease takes one hot key.
func adviseLease(cfg benchConfig, rep benchReport) (benchAdvice, bool) {
	g := slices.Max(cfg.concurrency)
	l, ok := find(rep.Rows, "allow", "lease", g, 1)
	if !ok {
		return benchAdvice{}, false
	}
	best := benchRow{}
	for _, conf := range []string{"unbatched", "batch"} {
		if r, ok := find(rep.Rows, "allow", conf, g, 1); ok && r.PerSecond > best.PerSecond {
			best = r
		}
	}
	return benchAdvice{
		Setting: "lease (package lease)",
		Value:   fmt.Sprintf("only for a key that needs more than %.0f decisions/s", best.PerSecond),
		Why: fmt.Sprintf("one hot key at %d callers: %.0f/s %s (%.2f× the script's ceiling), %.0f/s through lease.Options{Tokens: %d}; leased takes are not exact: a process may spend tokens it took up to MaxAge earlier",
			g, best.PerSecond, best.Config, best.OfCeiling, l.PerSecond, benchLeaseTokens),
	}, true
}

// printBench writes the report, as text tables or as JSON.
func printBench(w io.Writer, rep benchReport, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Fprintf(w, "fleetrate bench on %s, %s per measurement, keys under %s (%d deleted)\n\n", rep.Redis, rep.Duration, rep.Prefix, rep.KeysDeleted)
	if rep.Stopped != "" {
		fmt.Fprintf(w, "STOPPED EARLY: %s\nBelow is what was measured before; nothing is recommended.\n\n", rep.Stopped)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "take script ceiling (%d clients, %d per pipeline)\tkeys\ttakes/s\t\n", loadgen.CeilingClients, loadgen.CeilingDepth)
	for _, c := range rep.Ceilings {
		fmt.Fprintf(tw, "\t%d\t%.0f\t\n", c.Keys, c.PerSecond)
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "mode\tconfig\tcallers\tkeys\tdecisions/s\t× ceiling\tp50 µs\tp99 µs\terrors\tpool waits\t\n")
	for _, r := range rep.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.0f\t%.2f\t%.0f\t%.0f\t%d\t%d\t\n", r.Mode, r.Config, r.Concurrency, r.Keys,
			r.PerSecond, r.OfCeiling, r.P50Micros, r.P99Micros, r.Errors, r.PoolWaits)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nWait rows run with the faster Allow config; the limit never runs out, so no call sleeps.\n")
	if len(rep.Recommendations) > 0 {
		fmt.Fprintf(w, "\nRecommended:\n")
	}
	for _, a := range rep.Recommendations {
		fmt.Fprintf(w, "  %s: %s\n      (%s)\n", a.Setting, a.Value, a.Why)
	}
	return nil
}
