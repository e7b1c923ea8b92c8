// Command servebench measures `fleetrate serve` against envoyproxy/ratelimit
// over gRPC (Envoy RLS v3, ShouldRateLimit) and, with -gubernator, against
// gubernator (its own V1.GetRateLimits): decisions per CPU-second of the
// service process, at several numbers of concurrent callers, in
// interleaved rounds (each round runs every service at every concurrency,
// one after the other), so that a slow spell of the shared machine hits
// them all.
//
//	cd benchmarks && ./peers.sh && go run ./cmd/servebench -ratelimit bin/ratelimit -gubernator bin/gubernator
//
// envoyproxy/ratelimit is built from its source and gubernator v2.13.0 from
// the module proxy by peers.sh. Both RLS services load the same
// envoyproxy/ratelimit configuration file (one descriptor, a limit never
// reached) and share one redis-server this command starts on a free
// loopback port; fleetrate also runs with its in-memory store, and
// gubernator (one node) keeps its buckets in memory, with the same limit.
// The service's CPU time is read from /proc/<pid>/stat before and after
// each measurement.
//
// With -baseline, a fleetrate binary built from another commit runs as two
// more services (over the same Redis, and in memory) in the same rounds,
// so that a change is measured against what it replaces on the same
// machine at the same moments, with its ratios to the peers:
//
//	git archive <commit> | tar -x -C /tmp/base && (cd /tmp/base && go build -o /tmp/fleetrate-base ./cmd/fleetrate)
//	go run ./cmd/servebench -ratelimit bin/ratelimit -gubernator bin/gubernator -baseline /tmp/fleetrate-base
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
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

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/fleetrate/fleetrate/benchmarks/internal/benchsvc"
	"github.com/fleetrate/fleetrate/benchmarks/workload"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "servebench:", err)
		os.Exit(1)
	}
}

// service is one way to run a rate-limit service on a gRPC port, and the
// call that asks it for one decision on key i.
type service struct {
	name  string
	start func(port int) (*exec.Cmd, error)
	call  func(conn *grpc.ClientConn) func(ctx context.Context, i int) error
}

type result struct {
	decisions float64 // per second
	perCPU    float64 // decisions per CPU-second of the service
	// perRedisCPU is decisions per CPU-second of redis-server, 0 for a
	// service that does not use it. Redis runs its scripts on one thread,
	// so this is the most decisions per second one redis-server takes
	// from the service (docs/OPERATIONS.md, "One Redis for per-second
	// limits").
	perRedisCPU float64
	errors      int64
}

// flags are servebench's command line.
type flags struct {
	ratelimit, gubernator, baseline, only string
	duration                              time.Duration
	rounds                                int
	callers                               []int
}

func parseFlags(args []string) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("servebench", flag.ContinueOnError)
	fs.StringVar(&f.ratelimit, "ratelimit", "", "envoyproxy/ratelimit binary built from source (required)")
	fs.StringVar(&f.gubernator, "gubernator", "", "gubernator v2.13.0 binary (see peers.sh); empty: not measured")
	fs.StringVar(&f.baseline, "baseline", "", "a fleetrate binary built from another commit, measured as two more services (Redis, in memory) in the same rounds; empty: none")
	fs.DurationVar(&f.duration, "duration", 3*time.Second, "how long each measurement runs")
	fs.IntVar(&f.rounds, "rounds", 3, "interleaved rounds; the table reports each round")
	callers := fs.String("callers", "1,16,64", "concurrent callers")
	fs.StringVar(&f.only, "only", "", "run only the services whose name contains this (the others' columns stay empty)")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if f.ratelimit == "" {
		return f, errors.New("-ratelimit: give the envoyproxy/ratelimit binary (see benchmarks/peers.sh)")
	}
	for _, s := range strings.Split(*callers, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || c < 1 {
			return f, fmt.Errorf("-callers: %q is not a positive integer", s)
		}
		f.callers = append(f.callers, c)
	}
	return f, nil
}

func run(args []string, out io.Writer) error {
	f, err := parseFlags(args)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "servebench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := redistest.Launch(dir)
	if err != nil {
		return err
	}
	defer srv.Stop()
	fleetrate := filepath.Join(dir, "fleetrate")
	if err := benchsvc.BuildFleetrate(fleetrate); err != nil {
		return err
	}
	if err := benchsvc.WriteConfigs(dir); err != nil {
		return err
	}
	services := slices.DeleteFunc(allServices(f, dir, fleetrate, srv), func(s service) bool { return !strings.Contains(s.name, f.only) })
	// results[service][callers] holds one result per round.
	results := map[string]map[int][]result{}
	for _, s := range services {
		results[s.name] = map[int][]result{}
	}
	for range f.rounds {
		for _, c := range f.callers {
			for _, s := range services {
				r, err := measureService(s, c, f.duration, func() (time.Duration, error) { return redisCPU(srv) })
				if err != nil {
					return fmt.Errorf("%s, %d callers: %w", s.name, c, err)
				}
				fmt.Fprintf(os.Stderr, "%-38s callers=%-3d %9.0f decisions/s %9.0f per CPU-s %9.0f per Redis CPU-s errors %d\n", s.name, c, r.decisions, r.perCPU, r.perRedisCPU, r.errors)
				results[s.name][c] = append(results[s.name][c], r)
			}
		}
	}
	printTable(out, services, f.callers, results, f.rounds, f.duration)
	return nil
}

// Names of the services whose ratios the table reports.
const (
	nameRedis      = "fleetrate serve, Redis"
	nameMemory     = "fleetrate serve, in memory"
	nameRatelimit  = "envoyproxy/ratelimit, Redis"
	nameGubernator = "gubernator v2.13.0, in memory"
	nameBaseRedis  = "fleetrate serve (baseline), Redis"
	nameBaseMemory = "fleetrate serve (baseline), in memory"
)

// allServices lists the services f asks for: fleetrate (built at
// fleetrate) over srv and in memory, envoyproxy/ratelimit, and gubernator
// and the baseline fleetrate when given.
func allServices(f flags, dir, fleetrate string, srv *redistest.Server) []service {
	fleet := func(bin string, store ...string) func(int) (*exec.Cmd, error) {
		return func(port int) (*exec.Cmd, error) {
			args := append([]string{"serve", "--config", filepath.Join(dir, "fleetrate.yaml"), "--grpc-addr", "127.0.0.1:" + strconv.Itoa(port), "--http-addr", "off", "--log-level", "warn"}, store...)
			return startCmd(exec.Command(bin, args...))
		}
	}
	services := []service{
		{nameRedis, fleet(fleetrate, "--redis", srv.URL()), rlsCall},
		{nameRatelimit, ratelimitStart(f.ratelimit, dir, srv.Addr()), rlsCall},
		{nameMemory, fleet(fleetrate), rlsCall},
	}
	if f.gubernator != "" {
		services = append(services, service{nameGubernator, gubernatorStart(f.gubernator), gubernatorCall})
	}
	if f.baseline != "" {
		services = append(services, service{nameBaseRedis, fleet(f.baseline, "--redis", srv.URL()), rlsCall},
			service{nameBaseMemory, fleet(f.baseline), rlsCall})
	}
	return services
}

// ratelimitStart runs envoyproxy/ratelimit on Redis at addr, its stats
// disabled, with the configuration under dir/runtime.
func ratelimitStart(bin, dir, addr string) func(int) (*exec.Cmd, error) {
	return func(port int) (*exec.Cmd, error) {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(),
			"USE_STATSD=false", "DISABLE_STATS=true", "LOG_LEVEL=warn", "BACKEND_TYPE=redis",
			"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+addr,
			"RUNTIME_ROOT="+filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
			"HOST=127.0.0.1", "PORT="+strconv.Itoa(benchsvc.FreePort()), "DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(benchsvc.FreePort()),
			"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(port))
		return startCmd(cmd)
	}
}

// gubernatorStart runs gubernator as one node with its buckets in memory.
func gubernatorStart(bin string) func(int) (*exec.Cmd, error) {
	return func(port int) (*exec.Cmd, error) {
		ml := "127.0.0.1:" + strconv.Itoa(benchsvc.FreePort())
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(),
			"GUBER_GRPC_ADDRESS=127.0.0.1:"+strconv.Itoa(port), "GUBER_ADVERTISE_ADDRESS=127.0.0.1:"+strconv.Itoa(port),
			"GUBER_HTTP_ADDRESS=127.0.0.1:"+strconv.Itoa(benchsvc.FreePort()),
			"GUBER_MEMBERLIST_ADDRESS="+ml, "GUBER_MEMBERLIST_BIND_ADDRESS="+ml, "GUBER_MEMBERLIST_KNOWN_NODES="+ml,
			"GUBER_LOG_LEVEL=error", "OTEL_TRACES_EXPORTER=none")
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard // it logs every memberlist event
		return cmd, cmd.Start()
	}
}

// ratios are the table's ratio columns: a ÷ b, per CPU-second.
var ratios = []struct{ title, a, b string }{
	{"fleetrate ÷ ratelimit, Redis", nameRedis, nameRatelimit},
	{"fleetrate in memory ÷ ratelimit", nameMemory, nameRatelimit},
	{"fleetrate in memory ÷ gubernator", nameMemory, nameGubernator},
	{"baseline ÷ ratelimit, Redis", nameBaseRedis, nameRatelimit},
	{"baseline in memory ÷ ratelimit", nameBaseMemory, nameRatelimit},
	{"baseline in memory ÷ gubernator", nameBaseMemory, nameGubernator},
	{"fleetrate ÷ baseline, Redis", nameRedis, nameBaseRedis},
	{"fleetrate ÷ baseline, in memory", nameMemory, nameBaseMemory},
}

// printTable writes one row per number of callers and round, and a row of
// the medians of each column over the rounds (the median of the ratios,
// not the ratio of the medians).
func printTable(out io.Writer, services []service, callers []int, results map[string]map[int][]result, rounds int, d time.Duration) {
	has := func(name string) bool { _, ok := results[name]; return ok }
	cols := slices.DeleteFunc(slices.Clone(ratios), func(r struct{ title, a, b string }) bool { return !has(r.a) || !has(r.b) })
	fmt.Fprintf(out, "Decisions per CPU-second of the service process (decisions/s in brackets), %d interleaved rounds of %v, over %d keys:\n\n", rounds, d, workload.Keys)
	fmt.Fprintf(out, "| callers | round |")
	for _, s := range services {
		fmt.Fprintf(out, " %s |", s.name)
	}
	for _, r := range cols {
		fmt.Fprintf(out, " %s |", r.title)
	}
	fmt.Fprintf(out, "\n|---|---|%s\n", strings.Repeat("---|", len(services)+len(cols)))
	for _, c := range callers {
		perCol := make([][]float64, len(cols))
		for i := range rounds {
			fmt.Fprintf(out, "| %d | %d |", c, i+1)
			for _, s := range services {
				r := results[s.name][c][i]
				fmt.Fprintf(out, " %.0f (%.0f/s) |", r.perCPU, r.decisions)
			}
			for j, r := range cols {
				a, b := results[r.a][c][i].perCPU, results[r.b][c][i].perCPU
				fmt.Fprintf(out, " %s |", ratio(a, b))
				if a > 0 && b > 0 {
					perCol[j] = append(perCol[j], a/b)
				}
			}
			fmt.Fprintln(out)
		}
		fmt.Fprintf(out, "| %d | median |%s", c, strings.Repeat(" |", len(services)))
		for _, v := range perCol {
			fmt.Fprintf(out, " %s |", median(v))
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintln(out)
}

func median(v []float64) string {
	if len(v) == 0 {
		return "—"
	}
	slices.Sort(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + m) / 2
	}
	return fmt.Sprintf("%.2f", m)
}

func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// measureService starts s, waits until it answers, warms it up, then runs
// callers goroutines calling ShouldRateLimit for d and reads the service's
// CPU time around them. It is long because the steps share the process
// and its counters, read in this order.
func measureService(s service, callers int, d time.Duration, redisCPU func() (time.Duration, error)) (result, error) {
	port := benchsvc.FreePort()
	cmd, err := s.start(port)
	if err != nil {
		return result{}, err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	conn, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(port), grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Fixed windows, Envoy's defaults (256 MiB), as Envoy calls a
		// rate-limit service: a grpc-go client with its default windows
		// estimates the bandwidth-delay product and sends a PING after
		// the responses it reads, which every service (all grpc-go) then
		// reads and answers, a read and a write per decision that Envoy
		// never causes. Fixed windows turn that estimation off; the same
		// client calls every service.
		grpc.WithStaticStreamWindowSize(envoyWindow), grpc.WithStaticConnWindowSize(envoyWindow))
	if err != nil {
		return result{}, err
	}
	defer conn.Close()
	call := s.call(conn)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := call(ctx, 0)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return result{}, fmt.Errorf("not answering: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	load(callers, 500*time.Millisecond, call) // warm-up
	before, err := cpuTime(cmd.Process.Pid)
	if err != nil {
		return result{}, err
	}
	redisBefore, err := redisCPU()
	if err != nil {
		return result{}, err
	}
	ok, errs, took := load(callers, d, call)
	after, err := cpuTime(cmd.Process.Pid)
	if err != nil {
		return result{}, err
	}
	redisAfter, err := redisCPU()
	if err != nil {
		return result{}, err
	}
	cpu := (after - before).Seconds()
	if cpu <= 0 {
		return result{}, fmt.Errorf("no CPU time measured")
	}
	r := result{decisions: float64(ok) / took.Seconds(), perCPU: float64(ok) / cpu, errors: errs}
	// Under a tenth of a second, Redis only answered the probes of
	// /readyz and health checks: the service does not use it.
	if rc := (redisAfter - redisBefore).Seconds(); rc >= 0.1 {
		r.perRedisCPU = float64(ok) / rc
	}
	return r, nil
}

// envoyWindow is Envoy's default HTTP/2 stream and connection window
// (its Http2ProtocolOptions initial_stream_window_size and
// initial_connection_window_size).
const envoyWindow = 256 << 20

// load runs callers goroutines calling call until d has passed and returns
// the successful calls, the failed ones and the time taken.
func load(callers int, d time.Duration, call func(context.Context, int) error) (ok, errs int64, took time.Duration) {
	var okN, errN atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for range callers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := call(ctx, int(next.Add(1)))
				cancel()
				if err != nil {
					errN.Add(1)
				} else {
					okN.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return okN.Load(), errN.Load(), time.Since(start)
}

// cpuTime reads the user and system CPU time of process pid.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The fields after the command name (in parentheses, which may hold
	// spaces): utime and stime are the 14th and 15th of the whole line.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(u+st) * time.Second / clockTicks, nil
}

// redisCPU reads redis-server's CPU time (user and system, all its
// threads) from INFO cpu.
func redisCPU(srv *redistest.Server) (time.Duration, error) {
	info, err := srv.Client().Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO cpu: %s: %w", line, err)
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second)), nil
}

// clockTicks is the kernel's USER_HZ, 100 on Linux.
const clockTicks = 100

func startCmd(cmd *exec.Cmd) (*exec.Cmd, error) {
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd, cmd.Start()
}

// rlsCall asks an Envoy RLS v3 service for one hit on descriptor k=key i.
func rlsCall(conn *grpc.ClientConn) func(ctx context.Context, i int) error {
	client := rlspb.NewRateLimitServiceClient(conn)
	return func(ctx context.Context, i int) error {
		req := &rlspb.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: workload.KeyNames[i%workload.Keys]}},
		}}}
		resp, err := client.ShouldRateLimit(ctx, req)
		if err != nil {
			return err
		}
		if resp.OverallCode != rlspb.RateLimitResponse_OK {
			return fmt.Errorf("overall code %v", resp.OverallCode)
		}
		return nil
	}
}

// gubernatorCall asks gubernator's V1.GetRateLimits for one hit on key i,
// a token bucket of the same limit as the RLS config. The messages are
// encoded by hand from gubernator.proto (v2.13.0), so that its module,
// with its dependencies, stays out of this one.
func gubernatorCall(conn *grpc.ClientConn) func(ctx context.Context, i int) error {
	return func(ctx context.Context, i int) error {
		var r []byte
		r = protowire.AppendTag(r, 1, protowire.BytesType) // name
		r = protowire.AppendString(r, "bench")
		r = protowire.AppendTag(r, 2, protowire.BytesType) // unique_key
		r = protowire.AppendString(r, workload.KeyNames[i%workload.Keys])
		r = protowire.AppendTag(r, 3, protowire.VarintType) // hits
		r = protowire.AppendVarint(r, 1)
		r = protowire.AppendTag(r, 4, protowire.VarintType) // limit
		r = protowire.AppendVarint(r, 1_000_000_000)
		r = protowire.AppendTag(r, 5, protowire.VarintType) // duration, ms
		r = protowire.AppendVarint(r, 1000)
		var req []byte
		req = protowire.AppendTag(req, 1, protowire.BytesType) // requests
		req = protowire.AppendBytes(req, r)
		var resp []byte
		if err := conn.Invoke(ctx, "/pb.gubernator.V1/GetRateLimits", &req, &resp, grpc.ForceCodecV2(rawCodec{})); err != nil {
			return err
		}
		return gubernatorUnder(resp)
	}
}

// gubernatorUnder checks a GetRateLimitsResp of one response: status
// UNDER_LIMIT (0) and no error.
func gubernatorUnder(b []byte) error {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || num != 1 || typ != protowire.BytesType {
		return fmt.Errorf("gubernator: unexpected response %x", b)
	}
	rr, m := protowire.ConsumeBytes(b[n:])
	if m < 0 {
		return fmt.Errorf("gubernator: truncated response")
	}
	for len(rr) > 0 {
		num, typ, n := protowire.ConsumeTag(rr)
		if n < 0 {
			return fmt.Errorf("gubernator: bad response")
		}
		rr = rr[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, k := protowire.ConsumeVarint(rr)
			if k < 0 || v != 0 {
				return fmt.Errorf("gubernator: status %d", v)
			}
			rr = rr[k:]
		case num == 5 && typ == protowire.BytesType:
			e, k := protowire.ConsumeBytes(rr)
			if k < 0 || len(e) > 0 {
				return fmt.Errorf("gubernator: error %q", e)
			}
			rr = rr[k:]
		default:
			k := protowire.ConsumeFieldValue(num, typ, rr)
			if k < 0 {
				return fmt.Errorf("gubernator: bad response")
			}
			rr = rr[k:]
		}
	}
	return nil
}

// rawCodec sends and receives messages already encoded (*[]byte).
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }
