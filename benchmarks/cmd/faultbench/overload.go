package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"

	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

// envoyDeadline is the deadline Envoy's rate-limit filter gives each call
// by default.
const envoyDeadline = 20 * time.Millisecond

// overloadBounds is -bounds: the --max-in-flight values to run, or
// serve's flags ("--latency-target 5ms").
var overloadBounds = "default,1000000000"

// overload measures fleetrate on Redis at each -bounds value of
// --max-in-flight ("default": its default; 1000000000: no bound), at 3 and 10 times the decisions a second
// it makes at its best (measured first, closed loop).
func overload(out io.Writer, dir, bin string, srv *redistest.Server) error {
	redisPID, err := redisPID(srv)
	if err != nil {
		return err
	}
	if serverCPU != "" {
		if err := pinRedis(redisPID); err != nil {
			return err
		}
	}
	var services []service
	for _, b := range strings.Split(overloadBounds, ",") {
		switch {
		case b == "default":
			services = append(services, fleetrateService(bin, dir, srv.URL()))
		case strings.HasPrefix(b, "--"):
			services = append(services, fleetrateService(bin, dir, srv.URL(), strings.Fields(b)...))
		default:
			services = append(services, fleetrateService(bin, dir, srv.URL(), "--max-in-flight", b))
		}
	}
	for _, s := range services {
		if err := overloadService(out, s, redisPID); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return nil
}

// overloadService measures s at 3 and 10 times its maximum, each
// measured again just before and after the overload; redisPID is its
// Redis, whose CPU counts with the service's in the cost of a decision
// and of a shed.
//
// It is long because it runs the maximum, the two overloads and the
// CPU accounting in one sequence, each step using the last one's figures.
func overloadService(out io.Writer, s service, redisPID int) error {
	p, err := s.start()
	if err != nil {
		return err
	}
	defer p.stop()
	var clients []rlspb.RateLimitServiceClient
	for range 4 {
		conn, err := dial(p.grpc)
		if err != nil {
			return err
		}
		defer conn.Close()
		clients = append(clients, rlspb.NewRateLimitServiceClient(conn))
	}
	if err := waitServing(clients[0]); err != nil {
		return err
	}
	// A warm-up, not measured: the first second of a new service and
	// Redis ran at half their speed in some runs and not in others.
	closedLoop(clients, 4, 2*time.Second)
	cpu := cpuMeter{pids: []int{p.cmd.Process.Pid, redisPID}}
	capacity, perDecision := decisionLoop(clients, cpu, p.metrics)
	loops := []string{fmt.Sprintf("4: %.0f/s", capacity)}
	for _, callers := range []int{16, 64} {
		n := closedLoop(clients, callers, 2*time.Second)
		capacity = max(capacity, n)
		loops = append(loops, fmt.Sprintf("%d: %.0f/s", callers, n))
	}
	if capacity == 0 {
		return errNoDecisions
	}
	fmt.Fprintf(out, "\n%s: at most %.0f decisions/s (closed loop, 2 s each with %s callers), %.0f µs of CPU (service and Redis) each with 4 callers\n\n", s.name, capacity, strings.Join(loops, ", "), 1e6*perDecision)
	var costs []string
	// highest is the most decisions a second the service made anywhere in
	// the run (a closed loop, or the goodput of an overload); good10 the
	// goodput of the last overload, 10x: their ratio is the most
	// conservative share.
	highest, good10 := capacity, 0.0
	fmt.Fprintln(out, "| offered | sent/s | goodput/s (decided within 20 ms) | maximum before / after (4 or 16 callers) | of the maximum | p99 of decisions | p99 of all answers | p50 / p99 of sheds | answers | in flight max | goroutines before/max/after | RSS MiB before/max/after |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, mult := range []float64{3, 10} {
		// The maximum is measured again around each overload, and a
		// decision's CPU (for the cost of a shed) with it: this host's
		// CPUs ran up to 1.8 times slower from one minute to the next,
		// and CPU 0 a quarter slower while CPU 1 is busy
		// (docs/OPERATIONS.md, Overload), so a share of a maximum
		// measured a minute before would measure the host.
		pre, d := decisionLoop(clients, cpu, p.metrics)
		if d > 0 {
			perDecision = d
		}
		pre = max(pre, closedLoop(clients, 16, 2*time.Second))
		ctx, cancel := context.WithCancel(context.Background())
		var inFlight atomic.Int64
		samples := sampler(ctx, p, &inFlight)
		time.Sleep(300 * time.Millisecond)
		begin, c0, shed0, g0 := time.Now(), cpu.now(), metric(p.metrics, shedMetric), cpuSeconds(os.Getpid())
		calls, err := h2Loop(p.grpc, len(clients), mult*pre, &inFlight)
		if err != nil {
			cancel()
			return err
		}
		time.Sleep(3 * time.Second)
		end := time.Now()
		cs := calls()
		used, sheds := cpu.now()-c0, metric(p.metrics, shedMetric)-shed0
		generator := cpuSeconds(os.Getpid()) - g0
		time.Sleep(time.Second) // the after sample
		cancel()
		ss := samples()
		post := max(closedLoop(clients, 4, 2*time.Second), closedLoop(clients, 16, 2*time.Second))
		good10 = goodput(cs, end.Sub(begin).Seconds())
		highest = max(highest, pre, post, good10)
		fmt.Fprintf(out, "| %.0fx (%.0f/s) | %s\n", mult, mult*pre, overloadRow(cs, ss, begin, end, pre, post))
		costs = append(costs, fmt.Sprintf("%s (the load generator: %.1f CPU-s)", shedCost(mult, pre, cs, used, sheds, perDecision), generator))
	}
	fmt.Fprintf(out, "\nThe most decisions a second anywhere in the run: %.0f/s; the goodput at 10x is %.0f %% of it.\n", highest, 100*good10/highest)
	fmt.Fprintf(out, "\nCPU: %s\n", strings.Join(costs, "; "))
	return nil
}

// shedMetric counts the RLS calls the service shed.
const shedMetric = `fleetrate_shed_total{api="grpc"}`

// shedCost says what a shed cost at mult times the maximum: the CPU used
// in the run (used CPU-seconds) less the decisions' (at perDecision each,
// the closed loop's), over the sheds the service counted, and the goodput
// ceiling at 10 times capacity that cost implies on one CPU (see ceiling:
// meaningful with -server-cpu). The calls that missed their deadline may
// have been decided, too late, or not: their CPU is counted with the
// decisions for the lower figure of the range, with the sheds for the
// upper.
func shedCost(mult, capacity float64, cs []call, used, sheds, perDecision float64) string {
	ok, late := 0.0, 0.0
	for _, c := range cs {
		switch c.code {
		case codes.OK:
			ok++
		case codes.DeadlineExceeded:
			late++
		}
	}
	if perDecision == 0 {
		return fmt.Sprintf("%.0fx: the closed loop of 4 callers was shed: no decision's CPU to compare", mult)
	}
	if sheds <= 0 {
		return fmt.Sprintf("%.0fx: no shed (%.1f CPU-s, %.0f decisions)", mult, used, ok)
	}
	lo := max(used-(ok+late)*perDecision, 0) / sheds
	hi := max(used-ok*perDecision, 0) / sheds
	return fmt.Sprintf("%.0fx: %.1f CPU-s for %.0f decisions, %.0f late answers and %.0f sheds: a shed %.0f-%.0f µs, %.1f-%.1f %% of a decision; goodput ceiling at 10x %.0f-%.0f %%",
		mult, used, ok, late, sheds, 1e6*lo, 1e6*hi, 100*lo/perDecision, 100*hi/perDecision,
		100*ceiling(10, capacity, perDecision, hi), 100*ceiling(10, capacity, perDecision, lo))
}

// metric is the value of the sample named name (with its labels, as
// /metrics writes it) at url, or 0.
func metric(url, name string) float64 {
	if url == "" {
		return 0
	}
	// An overloaded service answers its metrics late, not never.
	return max(samples(url, 10*time.Second, name)[name], 0)
}

// decisionLoop runs a closed loop of 4 callers for 2 s and returns its
// decisions a second and a decision's CPU (service and Redis, read from
// cpu), or 0 for the CPU when the loop was shed after all: 4 callers are
// what the concurrency limit's floor always admits, and with sheds their
// CPU would count as the decisions'.
func decisionLoop(clients []rlspb.RateLimitServiceClient, cpu cpuMeter, metrics string) (rate, perDecision float64) {
	const d = 2 * time.Second
	c0, shed0 := cpu.now(), metric(metrics, shedMetric)
	rate = closedLoop(clients, 4, d)
	if shed := metric(metrics, shedMetric) - shed0; rate > 0 && shed == 0 {
		perDecision = (cpu.now() - c0) / (rate * d.Seconds())
	}
	return rate, perDecision
}

// closedLoop runs callers goroutines, each making one call after another
// (a millisecond after a shed), for d and returns the decisions a second.
func closedLoop(clients []rlspb.RateLimitServiceClient, callers int, d time.Duration) float64 {
	var n atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for g := range callers {
		wg.Go(func() {
			for i := g; time.Now().Before(stop); i += callers {
				switch c := one(clients[g%len(clients)], i, time.Second); c.code {
				case codes.OK:
					n.Add(1)
				case codes.ResourceExhausted:
					// A shed caller backs off rather than spin on the
					// service's CPU, which would lower the maximum.
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / d.Seconds()
}

// goodput is the decisions a second of cs (made over span seconds)
// answered OK within Envoy's deadline.
func goodput(cs []call, span float64) float64 {
	good := 0
	for _, c := range cs {
		if c.code == codes.OK && c.took <= envoyDeadline {
			good++
		}
	}
	return float64(good) / span
}

// overloadRow is an overload run's table row.
func overloadRow(cs []call, ss []sample, begin, end time.Time, pre, post float64) string {
	capacity := (pre + post) / 2
	span := end.Sub(begin).Seconds()
	var all, decided, shed []time.Duration
	answers := map[codes.Code]int{}
	for _, c := range cs {
		all = append(all, c.took)
		answers[c.code]++
		if c.code == codes.ResourceExhausted {
			shed = append(shed, c.took)
		}
		if c.code == codes.OK {
			decided = append(decided, c.took)
		}
	}
	slices.Sort(all)
	slices.Sort(decided)
	slices.Sort(shed)
	p99 := func(s []time.Duration) string {
		if len(s) == 0 {
			return "—"
		}
		return ms(pct(s, 0.99))
	}
	b, d, a := phases(ss, begin, end)
	good := goodput(cs, span)
	sheds := "—"
	if len(shed) > 0 {
		sheds = ms(pct(shed, 0.5)) + " / " + ms(pct(shed, 0.99))
	}
	return fmt.Sprintf("%.0f | %.0f | %.0f / %.0f | %.0f %% | %s | %s | %s | OK %d, RESOURCE_EXHAUSTED %d, DEADLINE_EXCEEDED %d, other %d | %s | %s | %s |",
		float64(len(cs))/span, good, pre, post, 100*good/capacity, p99(decided), p99(all), sheds,
		answers[codes.OK], answers[codes.ResourceExhausted], answers[codes.DeadlineExceeded],
		len(cs)-answers[codes.OK]-answers[codes.ResourceExhausted]-answers[codes.DeadlineExceeded],
		num(d.inFlight), triple(b.goroutines, d.goroutines, a.goroutines, "%.0f"), triple(b.rss, d.rss, a.rss, "%.0f"))
}

// redisPID is the process id of srv's redis-server.
func redisPID(srv *redistest.Server) (int, error) {
	info, err := srv.Do("info", "server")
	if err != nil {
		return 0, err
	}
	m := regexp.MustCompile(`process_id:(\d+)`).FindStringSubmatch(fmt.Sprint(info))
	if m == nil {
		return 0, fmt.Errorf("no process_id in INFO server")
	}
	return strconv.Atoi(m[1])
}

// pinRedis moves redis-server to -server-cpu, with the service: the
// service's capacity includes its Redis, and the load generator's CPU is
// then its own.
func pinRedis(pid int) error {
	if b, err := exec.Command("taskset", "-a", "-p", "-c", serverCPU, strconv.Itoa(pid)).CombinedOutput(); err != nil {
		return fmt.Errorf("taskset of redis-server: %v: %s", err, b)
	}
	return nil
}
