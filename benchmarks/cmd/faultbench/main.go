// Command faultbench measures `fleetrate serve`, on its defaults and on
// each failure policy, side by side with envoyproxy/ratelimit, while their
// Redis fails under a steady RLS load: Redis killed (and restarted without
// its data), frozen (SIGSTOP, then SIGCONT) and busy (DEBUG SLEEP). For
// each run it reports the latency of the calls made during the fault, the
// share answered within Envoy's 20 ms, their answers, the calls in flight
// (seen by the client, and inside fleetrate), the service's goroutines and
// resident memory, and how long after the fault cleared the decisions
// resumed. With -overload it instead offers fleetrate (on Redis, on its
// defaults) 3 and 10 times the decisions it can make (measured just
// before, in a closed loop), each call with Envoy's 20 ms deadline, and
// reports the goodput (decisions answered within 20 ms) as a share of the
// maximum measured just before and just after, p99, how long a shed call
// waited for its answer, memory and goroutines before, during and after.
//
//	cd benchmarks && ./peers.sh && go run ./cmd/faultbench -ratelimit bin/ratelimit
//	go run ./cmd/faultbench -overload
//	go build -o /tmp/faultbench ./cmd/faultbench && taskset -c 1 /tmp/faultbench -overload -server-cpu 0 -descriptors 32
//
// envoyproxy/ratelimit is built from its source by peers.sh; without
// -ratelimit only fleetrate is measured.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fleetrate/fleetrate/benchmarks/internal/benchsvc"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "faultbench:", err)
		os.Exit(1)
	}
}

type flags struct {
	ratelimit, faults, policies string
	rate                        int
	before, fault, after        time.Duration
	overload                    bool
}

func run(args []string, out io.Writer) error {
	var f flags
	fs := flag.NewFlagSet("faultbench", flag.ContinueOnError)
	fs.StringVar(&f.ratelimit, "ratelimit", "", "envoyproxy/ratelimit binary (see peers.sh); empty: fleetrate only")
	fs.StringVar(&f.faults, "faults", "kill,stop,sleep", "faults to run: kill, stop (SIGSTOP), sleep (DEBUG SLEEP)")
	fs.StringVar(&f.policies, "policies", "fail_closed,fail_open,local_fallback", "fleetrate --failure-policy values to run (fail_closed is the default), each optionally followed by more of serve's flags (\"fail_open --latency-target 0\")")
	fs.IntVar(&f.rate, "rate", 500, "RLS calls a second offered during the fault runs")
	fs.DurationVar(&f.before, "before", 1500*time.Millisecond, "load before the fault")
	fs.DurationVar(&f.fault, "fault", 3*time.Second, "how long the fault lasts")
	fs.DurationVar(&f.after, "after", 2*time.Second, "load after the fault clears")
	fs.BoolVar(&f.overload, "overload", false, "run the overload measurement instead")
	fs.StringVar(&overloadBounds, "bounds", overloadBounds, "with -overload: the --max-in-flight values to run, comma-separated (default: the service's default), or serve's flags, such as \"--latency-target 5ms\"")
	fs.IntVar(&descriptors, "descriptors", 1, "descriptors (buckets) per RLS call: more make each decision dearer for the service than for the load generator")
	fs.StringVar(&serverCPU, "server-cpu", "", "run fleetrate on this CPU only (taskset -c; the service then chooses its processors for one CPU), so that a load generator pinned elsewhere can offer it more than it decides")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "faultbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := redistest.Launch(dir, "--enable-debug-command", "yes")
	if err != nil {
		return err
	}
	defer srv.Stop()
	bin := filepath.Join(dir, "fleetrate")
	if err := benchsvc.BuildFleetrate(bin); err != nil {
		return err
	}
	if err := benchsvc.WriteConfigs(dir); err != nil {
		return err
	}
	if f.overload {
		return overload(out, dir, bin, srv)
	}
	var services []service
	for _, p := range strings.Split(f.policies, ",") {
		services = append(services, fleetrateService(bin, dir, srv.URL(), append([]string{"--failure-policy"}, strings.Fields(p)...)...))
	}
	if f.ratelimit != "" {
		services = append(services, ratelimitService(f.ratelimit, dir, srv.Addr()))
	}
	fmt.Fprintf(out, "RLS load %d calls/s (client deadline 5 s); fault for %v after %v; %v after it clears.\n\n", f.rate, f.fault, f.before, f.after)
	fmt.Fprintln(out, "| fault | service | calls in fault | p50 | p99 | worst | within 20 ms | answers | client in flight max | service in flight max | goroutines before/max/after | RSS MiB before/max/after | recovery |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, fault := range strings.Split(f.faults, ",") {
		for _, s := range services {
			row, err := faultRun(f, s, fault, srv)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", s.name, fault, err)
			}
			fmt.Fprintf(out, "| %s | %s | %s\n", fault, s.name, row)
		}
	}
	return nil
}

// serverCPU is -server-cpu.
var serverCPU string

// descriptors is -descriptors: the descriptors (buckets) of each call.
var descriptors = 1

// service is one way to run an RLS service: its gRPC address, and where
// its goroutines (and fleetrate's calls in flight) are read.
type service struct {
	name  string
	start func() (*proc, error)
}

// proc is a running service.
type proc struct {
	cmd      *exec.Cmd
	grpc     string
	metrics  string // fleetrate's /metrics, or ""
	pprof    string // ratelimit's goroutine profile, or ""
	inFlight bool   // metrics has fleetrate_requests_in_flight
}

func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

func fleetrateService(bin, dir, redisURL string, extra ...string) service {
	name := "fleetrate serve " + strings.Join(extra, " ")
	if len(extra) == 2 && extra[1] == "fail_closed" {
		name = "fleetrate serve (defaults: fail_closed)"
	}
	return service{name, func() (*proc, error) {
		g, h := freeAddr(), freeAddr()
		args := append([]string{"serve", "--config", filepath.Join(dir, "fleetrate.yaml"), "--grpc-addr", g, "--http-addr", h,
			"--log-level", "error", "--redis", redisURL}, extra...)
		cmd := exec.Command(bin, args...)
		if serverCPU != "" {
			cmd = exec.Command("taskset", append([]string{"-c", serverCPU, bin}, args...)...)
		}
		cmd.Stderr = os.Stderr
		return &proc{cmd: cmd, grpc: g, metrics: "http://" + h + "/metrics", inFlight: true}, cmd.Start()
	}}
}

func ratelimitService(bin, dir, addr string) service {
	return service{"envoyproxy/ratelimit (defaults)", func() (*proc, error) {
		g, d := freeAddr(), freeAddr()
		_, gport, _ := net.SplitHostPort(g)
		_, dport, _ := net.SplitHostPort(d)
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(),
			"USE_STATSD=false", "DISABLE_STATS=true", "LOG_LEVEL=error", "BACKEND_TYPE=redis",
			"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+addr,
			"RUNTIME_ROOT="+filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
			"HOST=127.0.0.1", "PORT="+strconv.Itoa(benchsvc.FreePort()), "DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+dport,
			"GRPC_HOST=127.0.0.1", "GRPC_PORT="+gport)
		cmd.Stderr = os.Stderr
		return &proc{cmd: cmd, grpc: g, pprof: "http://" + d + "/debug/pprof/goroutine?debug=1"}, cmd.Start()
	}}
}

// call is one RLS call's outcome.
type call struct {
	start time.Time
	took  time.Duration
	code  codes.Code
	over  bool // OVER_LIMIT
}

// sample is the service's state at one instant.
type sample struct {
	at                   time.Time
	goroutines, inFlight float64
	rss                  float64 // MiB
	clientInFlight       int64
}

// faultRun runs one service through one fault under the steady load and
// returns its table row.
func faultRun(f flags, s service, fault string, srv *redistest.Server) (string, error) {
	p, err := s.start()
	if err != nil {
		return "", err
	}
	defer p.stop()
	conn, err := dial(p.grpc)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	rls := rlspb.NewRateLimitServiceClient(conn)
	if err := waitServing(rls); err != nil {
		return "", err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var inFlight atomic.Int64
	calls := openLoop(ctx, rls, f.rate, 5*time.Second, &inFlight)
	samples := sampler(ctx, p, &inFlight)
	time.Sleep(f.before)
	begin := time.Now()
	end, err := applyFault(fault, f.fault, srv)
	if err != nil {
		cancel()
		return "", err
	}
	time.Sleep(f.after)
	cancel()
	cs, ss := calls(), samples()
	return row(cs, ss, begin, end), nil
}

// applyFault makes Redis fail for d and returns when it cleared.
func applyFault(fault string, d time.Duration, srv *redistest.Server) (time.Time, error) {
	switch fault {
	case "kill":
		srv.Kill()
		time.Sleep(d)
		srv.Restart()
	case "stop":
		srv.Pause()
		time.Sleep(d)
		srv.Resume()
	case "sleep":
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: d + 5*time.Second})
		defer c.Close()
		if err := c.Do(context.Background(), "debug", "sleep", fmt.Sprintf("%.3f", d.Seconds())).Err(); err != nil {
			return time.Time{}, fmt.Errorf("DEBUG SLEEP: %w", err)
		}
	default:
		return time.Time{}, fmt.Errorf("unknown fault %q (want kill, stop or sleep)", fault)
	}
	return time.Now(), nil
}

// openLoop sends rate calls a second, each on its own goroutine with the
// given deadline, until ctx ends; the returned function waits for every
// call and returns them.
func openLoop(ctx context.Context, rls rlspb.RateLimitServiceClient, rate int, deadline time.Duration, inFlight *atomic.Int64) func() []call {
	var mu sync.Mutex
	var calls []call
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.Second / time.Duration(rate)
		next := time.Now()
		for i := 0; ctx.Err() == nil; i++ {
			if d := time.Until(next); d > 0 {
				time.Sleep(d)
			}
			next = next.Add(tick)
			wg.Go(func() {
				inFlight.Add(1)
				defer inFlight.Add(-1)
				c := one(rls, i, deadline)
				mu.Lock()
				calls = append(calls, c)
				mu.Unlock()
			})
		}
	})
	return func() []call { wg.Wait(); return calls }
}

// one makes call i with the given deadline.
func one(rls rlspb.RateLimitServiceClient, i int, deadline time.Duration) call {
	req := request(i)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	resp, err := rls.ShouldRateLimit(ctx, req)
	c := call{start: start, took: time.Since(start), code: status.Code(err)}
	c.over = err == nil && resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT
	return c
}

// sampler reads the service's state every 50 ms until ctx ends.
func sampler(ctx context.Context, p *proc, clientInFlight *atomic.Int64) func() []sample {
	var ss []sample
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			s := sample{at: time.Now(), goroutines: -1, inFlight: -1, rss: rss(p.cmd.Process.Pid), clientInFlight: clientInFlight.Load()}
			if p.metrics != "" {
				m := scrape(p.metrics)
				s.goroutines, s.inFlight = m["go_goroutines"], m["fleetrate_requests_in_flight"]
			}
			if p.pprof != "" {
				s.goroutines = pprofGoroutines(p.pprof)
			}
			ss = append(ss, s)
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return func() []sample { <-done; return ss }
}

// scrape reads the service's goroutines and decisions in flight (-1 for
// one it cannot read).
func scrape(url string) map[string]float64 {
	return samples(url, time.Second, "go_goroutines", "fleetrate_requests_in_flight")
}

// samples reads the samples named names (with their labels, as /metrics
// writes them) at url within timeout; -1 for one absent or unreadable.
func samples(url string, timeout time.Duration, names ...string) map[string]float64 {
	m := make(map[string]float64, len(names))
	for _, n := range names {
		m[n] = -1
	}
	c := http.Client{Timeout: timeout}
	resp, err := c.Get(url)
	if err != nil {
		return m
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(data), "\n") {
		name, v, ok := strings.Cut(l, " ")
		if _, want := m[name]; ok && want {
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				m[name] = f
			}
		}
	}
	return m
}

func pprofGoroutines(url string) float64 {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	n, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, "goroutine profile: total ")), 64)
	if err != nil {
		return -1
	}
	return n
}

// rss is a process's resident memory in MiB, from /proc.
func rss(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return -1
}

// row is a fault run's table row: the calls that began during the fault
// (from begin to end), the samples before, during and after, and the
// recovery: from end to the answer of the last failed call begun after
// it (0 when none failed).
func row(cs []call, ss []sample, begin, end time.Time) string {
	var lat []time.Duration
	answers := map[string]int{}
	within := 0
	var recovered time.Time
	for _, c := range cs {
		if !c.start.Before(begin) && c.start.Before(end) {
			lat = append(lat, c.took)
			if c.took <= 20*time.Millisecond {
				within++
			}
			k := c.code.String()
			if c.over {
				k = "OVER_LIMIT"
			}
			answers[k]++
		}
		if !c.start.Before(end) && c.code != codes.OK && c.start.Add(c.took).After(recovered) {
			recovered = c.start.Add(c.took)
		}
	}
	if len(lat) == 0 {
		return "no calls |"
	}
	slices.Sort(lat)
	rec := "0 (no failure after)"
	if !recovered.IsZero() {
		rec = ms(recovered.Sub(end))
	}
	var keys []string
	for k := range answers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var as []string
	for _, k := range keys {
		as = append(as, fmt.Sprintf("%s %d", k, answers[k]))
	}
	b, d, a := phases(ss, begin, end)
	return fmt.Sprintf("%d | %s | %s | %s | %.1f %% | %s | %d | %s | %s | %s | %s |",
		len(lat), ms(pct(lat, 0.5)), ms(pct(lat, 0.99)), ms(lat[len(lat)-1]), 100*float64(within)/float64(len(lat)),
		strings.Join(as, ", "), d.clientInFlight, num(d.inFlight), triple(b.goroutines, d.goroutines, a.goroutines, "%.0f"),
		triple(b.rss, d.rss, a.rss, "%.0f"), rec)
}

// phases returns the last sample before begin, the largest values during
// the fault, and the last sample.
func phases(ss []sample, begin, end time.Time) (before, during, after sample) {
	during = sample{goroutines: -1, inFlight: -1, rss: -1}
	for _, s := range ss {
		switch {
		case s.at.Before(begin):
			before = s
		case s.at.Before(end):
			during.goroutines = max(during.goroutines, s.goroutines)
			during.inFlight = max(during.inFlight, s.inFlight)
			during.rss = max(during.rss, s.rss)
			during.clientInFlight = max(during.clientInFlight, s.clientInFlight)
		}
	}
	if len(ss) > 0 {
		after = ss[len(ss)-1]
	}
	return before, during, after
}

func triple(a, b, c float64, f string) string {
	return num2(a, f) + " / " + num2(b, f) + " / " + num2(c, f)
}

func num(v float64) string { return num2(v, "%.0f") }

func num2(v float64, f string) string {
	if v < 0 {
		return "—"
	}
	return fmt.Sprintf(f, v)
}

func pct(s []time.Duration, p float64) time.Duration {
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }

func dial(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.ForceCodec(lean{})))
}

// waitServing waits until the service answers a call.
func waitServing(rls rlspb.RateLimitServiceClient) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		c := one(rls, 0, time.Second)
		if c.code == codes.OK {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the service did not answer within 20 s: %v", c.code)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freeAddr() string { return "127.0.0.1:" + strconv.Itoa(benchsvc.FreePort()) }

var errNoDecisions = errors.New("no decision was answered")
