// Package workerproc runs a test binary's workers as separate OS
// processes: the test re-executes its own binary with a spec in an
// environment variable, the worker reads it, works, and writes its result
// as JSON on stdout. Fleet tests use it so that their fleets are real
// processes, not goroutines.
package workerproc

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// Main runs work when the binary was started as a worker under env, writes
// its result and exits; otherwise it returns. Call it first in TestMain.
func Main[Spec, Out any](env string, work func(Spec) Out) {
	raw := os.Getenv(env)
	if raw == "" {
		return
	}
	var s Spec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fmt.Fprintf(os.Stderr, "worker %s: %v\n", env, err)
		os.Exit(2)
	}
	if err := json.NewEncoder(os.Stdout).Encode(work(s)); err != nil {
		os.Exit(2)
	}
	os.Exit(0)
}

// Run starts one worker process per spec and calls done, one call at a
// time, with each worker's number and result, or the error that cost it
// (with what it wrote on stderr). It returns once every worker has ended.
func Run[Spec, Out any](t testing.TB, env string, specs []Spec, done func(p int, out Out, err error)) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for p, s := range specs {
		raw, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), env+"="+string(raw))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			var out Out
			decErr := json.NewDecoder(bufio.NewReader(stdout)).Decode(&out)
			waitErr := cmd.Wait()
			var err error
			if decErr != nil || waitErr != nil {
				err = fmt.Errorf("worker %d: %v %v: %s", p, decErr, waitErr, stderr.String())
			}
			mu.Lock()
			defer mu.Unlock()
			done(p, out, err)
		})
	}
	wg.Wait()
}
