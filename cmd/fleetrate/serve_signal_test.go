package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// serveChildEnv makes TestServeChildProcess act as `fleetrate serve`.
const serveChildEnv = "FLEETRATE_TEST_SERVE_CHILD_ARGS"

// TestServeChildProcess is the service process of TestServeSIGTERM: it
// runs main's code path, with SIGTERM cancelling the context.
func TestServeChildProcess(t *testing.T) {
	args := os.Getenv(serveChildEnv)
	if args == "" {
		t.Skip("runs only as the child of TestServeSIGTERM")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, strings.Split(args, "\n"), os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "fleetrate:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// TestServeSIGTERM sends a real SIGTERM to a service process while
// requests are in flight (their bodies half sent): every one of them
// still gets its answer, and the process exits 0.
func TestServeSIGTERM(t *testing.T) {
	t.Parallel()
	child := startServeChild(t, nil)
	addr := child.waitLine("fleetrate serving")["http"].(string)

	// Requests whose bodies are half sent are in flight in the service.
	const n = 8
	body := `{"bucket":"booking_com/availability"}`
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/take HTTP/1.1\r\nHost: fleetrate\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:10])
		conns[i] = c
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(metricsOf(t, addr), fmt.Sprintf("fleetrate_requests_in_flight %d", n)) {
		if time.Now().After(deadline) {
			t.Fatal("the requests never got in flight")
		}
		time.Sleep(5 * time.Millisecond)
	}

	if err := child.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	child.waitLine("shutting down: finishing in-flight requests")

	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			if _, err := io.WriteString(c, body[10:]); err != nil {
				t.Errorf("request %d: finishing the body: %v", i, err)
				return
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Errorf("request %d: lost: %v", i, err)
				return
			}
			defer resp.Body.Close()
			var d struct{ Allowed bool }
			if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || resp.StatusCode != http.StatusOK || !d.Allowed {
				t.Errorf("request %d: status %d, %+v, %v", i, resp.StatusCode, d, err)
			}
		})
	}
	wg.Wait()
	child.waitLine("stopped")
	for range child.lines { // read stderr to its end before Wait
	}
	if err := child.cmd.Wait(); err != nil {
		t.Errorf("the service exited with %v, want 0", err)
	}
}

// serveChild is a `fleetrate serve` process (TestServeChildProcess) and
// its JSON log lines.
type serveChild struct {
	t     *testing.T
	ctx   context.Context
	cmd   *exec.Cmd
	lines chan map[string]any
	held  []map[string]any // lines read while waiting for another
}

// startServeChild starts `fleetrate serve` with serveTestConfig on
// loopback ports, logging JSON at info level, plus args, as a child
// process with this one's environment plus env, killed and reaped at the
// test's end.
func startServeChild(t *testing.T, env []string, args ...string) *serveChild {
	t.Helper()
	return startServeChildOn(t, "", env, args...)
}

// startServeChildOn is startServeChild with the child pinned to the CPUs
// cpus names (taskset -c), or unpinned when cpus is empty.
func startServeChildOn(t *testing.T, cpus string, env []string, args ...string) *serveChild {
	t.Helper()
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
	args = append([]string{"serve", "--config", path, "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--log-format", "json", "--log-level", "info"}, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	name, argv := os.Args[0], []string{"-test.run=^TestServeChildProcess$"}
	if cpus != "" {
		name, argv = "taskset", append([]string{"-c", cpus, name}, argv...)
	}
	cmd := exec.CommandContext(ctx, name, argv...)
	cmd.Env = append(append(os.Environ(), env...), serveChildEnv+"="+strings.Join(args, "\n"))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &serveChild{t: t, ctx: ctx, cmd: cmd, lines: make(chan map[string]any, 100)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				c.lines <- m
			}
		}
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil { // not waited for by the test
			cmd.Process.Kill()
			for range c.lines { // stderr to its end, then reap
			}
			cmd.Wait()
		}
	})
	return c
}

// waitLine returns the first log line not yet returned whose message is
// one of msgs, in the order the service wrote them; lines with other
// messages are kept for later calls.
func (c *serveChild) waitLine(msgs ...string) map[string]any {
	c.t.Helper()
	for i, m := range c.held {
		if msg, _ := m["msg"].(string); slices.Contains(msgs, msg) {
			c.held = slices.Delete(c.held, i, i+1)
			return m
		}
	}
	for {
		select {
		case m, ok := <-c.lines:
			if !ok {
				c.t.Fatalf("the service exited before logging %q", msgs)
			}
			if msg, _ := m["msg"].(string); slices.Contains(msgs, msg) {
				return m
			}
			c.held = append(c.held, m)
		case <-c.ctx.Done():
			c.t.Fatalf("no %q log line", msgs)
		}
	}
}

func metricsOf(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
