package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/benchmarks/workload"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
)

// scriptCall is one script call as redis-benchmark sends it: EVALSHA, the
// script's SHA1, one key (with __rand_int__ for the spread keyspace) and
// the arguments.
type scriptCall struct {
	name string
	args []string
}

// shaRecorder is a go-redis hook that records the SHA1 and arguments of
// the first EVALSHA it sees, so that a peer's script can be run by
// redis-benchmark exactly as the peer sends it, without copying it.
type shaRecorder struct{ args []any }

func (*shaRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *shaRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.EqualFold(cmd.Name(), "evalsha") && r.args == nil {
			r.args = append([]any(nil), cmd.Args()...)
		}
		return next(ctx, cmd)
	}
}

func (*shaRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// scriptCalls returns the take of one token by fleetrate's take script
// (one bucket, one limit, as a Limiter sends it) and by redis_rate's
// AllowN script (captured from its own call), both on the workload's limit.
func scriptCalls(srv *redistest.Server) ([]scriptCall, error) {
	c := newClient(srv, 1)
	defer c.Close()
	// fleetrate: call it once so that Redis has it cached by its SHA
	// (the unguarded script: see ceiling).
	l, err := fleetLimiter(c, redisstore.Options{KeepAfterFailover: true})
	if err != nil {
		return nil, err
	}
	if _, err := l.Allow(context.Background(), "warm"); err != nil {
		return nil, err
	}
	fr := []string{"EVALSHA", redisstore.TakeScriptSHA(), "1", "fr:bench:__rand_int__"}
	for _, a := range redisstore.TakeScriptArgs(1, []fleetrate.Limit{workload.Limit}) {
		fr = append(fr, fmt.Sprint(a))
	}
	// redis_rate: record its EVALSHA (redis.Script.Run loads it on NOSCRIPT).
	rec := &shaRecorder{}
	c.AddHook(rec)
	rl := redis_rate.NewLimiter(c)
	lim := redis_rate.Limit{Rate: workload.Rate, Burst: workload.Burst, Period: time.Second}
	if _, err := rl.Allow(context.Background(), "warm", lim); err != nil {
		return nil, err
	}
	if len(rec.args) < 4 {
		return nil, fmt.Errorf("redis_rate: no EVALSHA recorded")
	}
	rr := []string{"EVALSHA", fmt.Sprint(rec.args[1]), "1", "rr:bench:__rand_int__"}
	for _, a := range rec.args[4:] {
		rr = append(rr, fmt.Sprint(a))
	}
	return []scriptCall{{"fleetrate take.lua", fr}, {"redis_rate v10 AllowN", rr}}, nil
}

// scriptTable runs each take script with redis-benchmark (50 clients,
// pipelining 32, 10,000 keys), the scripts taking turns in each of
// cfg.count rounds, and prints each round's figures and their ratio.
func scriptTable(srv *redistest.Server, cfg config, out io.Writer) error {
	calls, err := scriptCalls(srv)
	if err != nil {
		return err
	}
	n := 1_000_000
	if cfg.quick {
		n = 50_000
	}
	fmt.Fprintf(out, "## Redis: the take script on redis-benchmark\n\n")
	fmt.Fprintf(out, "`redis-benchmark -c 50 -P 32 -r %d -n %d EVALSHA <sha> 1 <prefix>__rand_int__ <args>`: one take of one token from a bucket of one limit; redis_rate's call is the one it sends itself (recorded by a go-redis hook). The two take turns in each round.\n\n", workload.Keys, n)
	pid, err := serverPID(srv)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Redis CPU per call is the redis-server process's user + system time (/proc) over the calls: unlike throughput, it barely moves when other processes take the cores.\n\n")
	fmt.Fprintf(out, "| round | %s/s | %s/s | ratio | Redis CPU µs per call, fleetrate / redis_rate |\n|---|---|---|---|---|\n", calls[0].name, calls[1].name)
	var ratios, cpuRatios []float64
	for rep := range cfg.count {
		var got, cpu [2]float64
		for i, sc := range calls {
			before, err := procCPU(pid)
			if err != nil {
				return err
			}
			v, err := redisBenchmark(srv, n, sc.args)
			if err != nil {
				return fmt.Errorf("%s: %w", sc.name, err)
			}
			after, err := procCPU(pid)
			if err != nil {
				return err
			}
			got[i], cpu[i] = v, (after-before).Seconds()*1e6/float64(n)
			fmt.Fprintf(os.Stderr, "script %-24s %9.0f/s %.2f µs of Redis CPU per call\n", sc.name, v, cpu[i])
		}
		ratios, cpuRatios = append(ratios, got[0]/got[1]), append(cpuRatios, cpu[0]/cpu[1])
		fmt.Fprintf(out, "| %d | %.0f | %.0f | %.2f | %.2f / %.2f |\n", rep+1, got[0], got[1], got[0]/got[1], cpu[0], cpu[1])
	}
	self := func(x float64) float64 { return x }
	fmt.Fprintf(out, "\nMedian throughput ratio %.2f (fleetrate ÷ redis_rate); median Redis CPU per call ratio %.2f.\n\n", median(ratios, self), median(cpuRatios, self))
	return nil
}

// serverPID asks the redis-server for its process id.
func serverPID(srv *redistest.Server) (int, error) {
	v, err := srv.Do("info", "server")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(fmt.Sprint(v), "\n") {
		if id, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(id)
		}
	}
	return 0, fmt.Errorf("INFO server: no process_id")
}

// procCPU reads the user and system CPU time of process pid from
// /proc/<pid>/stat (in clock ticks of 10 ms).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return time.Duration(u+st) * 10 * time.Millisecond, nil
}

// redisBenchmark runs one redis-benchmark of n requests of cmd over the
// workload's keyspace and returns its requests per second.
func redisBenchmark(srv *redistest.Server, n int, cmd []string) (float64, error) {
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(srv.Port()), "-c", "50", "-P", "32", "-q",
		"-n", strconv.Itoa(n), "-r", strconv.Itoa(workload.Keys)}
	args = append(args, cmd...)
	outb, err := exec.Command("redis-benchmark", args...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark: %v: %s", err, outb)
	}
	return parseRPS(outb)
}

// parseRPS reads the throughput from redis-benchmark's quiet output, which
// ends with "<name>: <n> requests per second, ...".
func parseRPS(outb []byte) (float64, error) {
	for _, line := range bytes.Split(outb, []byte("\r")) {
		s := string(bytes.TrimSpace(line))
		if i := strings.Index(s, " requests per second"); i > 0 {
			f := strings.Fields(s[:i])
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				return v, nil
			}
		}
	}
	return 0, fmt.Errorf("redis-benchmark: no throughput in %q", outb)
}
