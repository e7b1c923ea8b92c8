package redistest

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startAttempts is how many ports a helper tries before giving up: a port
// found free may be taken by another process before redis-server binds it.
const startAttempts = 5

// launchNode starts one redis-server whose arguments depend on the port it
// gets, retrying on another port when the first is lost to a race. It
// checks that the process answering on the port is the one it started (a
// port stolen by another server would otherwise look like a success), and
// stops the server when tb ends. tlsConf is nil for a plain TCP server.
// It may be called from any goroutine: it reports failures as errors that
// carry the server's log.
func launchNode(tb testing.TB, dir string, tlsConf *tls.Config, argsFor func(port int) ([]string, error)) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found in PATH; these tests need a real Redis. Install it with: %s", InstallHint)
	}
	var errs []string
	for range startAttempts {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		args, err := argsFor(port)
		if err != nil {
			return nil, err
		}
		s := &Server{tb: tb, bin: bin, dir: dir, port: port, args: args}
		if err = s.start(); err == nil {
			if err = s.checkOwner(tlsConf); err == nil {
				tb.Cleanup(s.Stop)
				return s, nil
			}
			s.Stop()
		}
		errs = append(errs, err.Error())
	}
	return nil, fmt.Errorf("redis-server failed to start %d times:\n%s", startAttempts, strings.Join(errs, "\n---\n"))
}

// checkOwner verifies that the server answering on s.port is the process
// s started.
func (s *Server) checkOwner(tlsConf *tls.Config) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: tlsConf, MaxRetries: -1, DisableIdentity: true})
	defer c.Close()
	var info string
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		info, err = c.Info(ctx, "server").Result()
		cancel()
		// A server still loading answers LOADING; wait for it.
		if err == nil || !strings.HasPrefix(err.Error(), "LOADING") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("redis-server on port %d does not answer: %w; its log:\n%s", s.port, err, s.Log())
	}
	s.mu.Lock()
	pid := s.cmd.Process.Pid
	s.mu.Unlock()
	if got := infoField(info, "process_id"); got != strconv.Itoa(pid) {
		return fmt.Errorf("port %d is answered by process %s, not by the redis-server started (pid %d); its log:\n%s", s.port, got, pid, s.Log())
	}
	return nil
}

// infoField returns the value of name in an INFO or CLUSTER INFO reply.
func infoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// writeConf writes a config file named name in dir and returns its path.
func writeConf(tb testing.TB, dir, name string, lines ...string) string {
	tb.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return p
}

// redisCLI runs redis-cli with a timeout and returns its combined output.
func redisCLI(timeout time.Duration, args ...string) (string, error) {
	bin, err := exec.LookPath("redis-cli")
	if err != nil {
		return "", fmt.Errorf("redis-cli not found in PATH; install it with: %s", InstallHint)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("redis-cli %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// waitFor polls cond every interval until it returns nil or timeout
// passes, and returns the last error.
func waitFor(timeout, interval time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(interval)
	}
}

// do runs one command on addr with a fresh connection.
func do(addr string, tlsConf *tls.Config, args ...any) (any, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: tlsConf, MaxRetries: -1, DisableIdentity: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Do(ctx, args...).Result()
}

// doString is do for commands with a string (or verbatim) reply.
func doString(addr string, tlsConf *tls.Config, args ...any) (string, error) {
	v, err := do(addr, tlsConf, args...)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%v: reply %T, not a string", args, v)
	}
	return s, nil
}
