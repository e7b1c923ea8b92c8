// Package redistest starts real redis-server processes on free loopback
// ports for tests. There are no mocks: a machine without redis-server fails
// the test with the command that installs it.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate/internal/harness/logbuf"
)

// InstallHint is the command that installs redis-server on Debian/Ubuntu.
const InstallHint = "apt-get update && apt-get install -y redis-server"

// Server is one redis-server process owned by a test.
type Server struct {
	tb   testing.TB
	bin  string
	dir  string
	port int
	args []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	log    *logbuf.Buffer
	exited chan struct{}
	client *redis.Client
}

// Binary returns the path of redis-server, or fails tb with the install
// command when it is missing.
func Binary(tb testing.TB) string {
	tb.Helper()
	return lookBinary(tb, "redis-server")
}

func lookBinary(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		tb.Fatalf("%s not found in PATH; these tests need a real Redis. Install it with: %s", name, InstallHint)
	}
	return p
}

// FreePort returns a TCP port that was free on 127.0.0.1 a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	p, err := freePort()
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return p
}

// Start starts a redis-server on a free 127.0.0.1 port with persistence
// off, plus any extra config arguments (such as "--maxmemory", "1mb"), and
// stops it when the test ends.
func Start(tb testing.TB, args ...string) *Server {
	tb.Helper()
	Binary(tb)
	s, err := Launch(tb.TempDir(), args...)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	s.tb = tb
	tb.Cleanup(s.Stop)
	return s
}

// Launch starts a redis-server like Start, outside any one test (for a
// TestMain or a benchmark command). The caller must Stop it.
func Launch(dir string, args ...string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found in PATH; install it with: %s", InstallHint)
	}
	s := &Server{bin: bin, dir: dir, args: args}
	for range 5 {
		if s.port, err = freePort(); err != nil {
			return nil, err
		}
		if err = s.start(); err == nil {
			return s, nil
		}
	}
	return nil, err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartOnPort is like Start on a given port; the config arguments come
// first so callers can start Sentinels and Cluster nodes.
func StartOnPort(tb testing.TB, port int, args ...string) *Server {
	tb.Helper()
	s := &Server{tb: tb, bin: Binary(tb), dir: tb.TempDir(), port: port, args: args}
	if err := s.start(); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

func (s *Server) start() error {
	argv := append([]string{}, s.args...)
	argv = append(argv,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--loglevel", "warning",
	)
	// A config file as first argument must stay first.
	if len(s.args) > 0 && filepath.Ext(s.args[0]) == ".conf" {
		argv = append([]string{s.args[0]}, append(argv[len(s.args):], s.args[1:]...)...)
	}
	cmd := exec.Command(s.bin, argv...)
	// A test binary that dies (a panic, a timeout, a kill) cannot run its
	// cleanups: the kernel then kills the server too, so none outlives it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	log := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Dir = s.dir
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.log, s.exited = cmd, log, exited
	s.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("redis-server on port %d exited at start: %s", s.port, log.String())
		default:
		}
		c, err := net.DialTimeout("tcp", s.Addr(), 100*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	return fmt.Errorf("redis-server on port %d did not listen within 10s: %s", s.port, log.String())
}

// Addr returns host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port returns the TCP port.
func (s *Server) Port() int { return s.port }

// URL returns a redis:// URL for the server.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Dir returns the server's working directory.
func (s *Server) Dir() string { return s.dir }

// Client returns a go-redis client for the server, closed when the server
// stops.
func (s *Server) Client() *redis.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client == nil {
		s.client = redis.NewClient(&redis.Options{Addr: s.Addr()})
	}
	return s.client
}

// Kill sends SIGKILL and waits for the process to exit.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	<-exited
}

// Restart starts the server again on the same port after Kill. The data
// is gone, as after a crash without persistence.
func (s *Server) Restart() {
	var err error
	for range 50 {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	if s.tb != nil {
		s.tb.Fatalf("redistest: restart: %v", err)
	}
	panic("redistest: restart: " + err.Error())
}

// Pause freezes the process with SIGSTOP; it keeps its socket open but
// answers nothing until Resume.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused process with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig os.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Do runs a command on the server with a fresh connection and a timeout.
func (s *Server) Do(args ...any) (any, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Do(ctx, args...).Result()
}

// Stop kills the server, waits for it and closes the client. It is safe to
// call twice.
func (s *Server) Stop() {
	s.Kill()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client != nil {
		_ = s.client.Close()
		s.client = nil
	}
}

// Log returns what the server printed.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return ""
	}
	return s.log.String()
}
