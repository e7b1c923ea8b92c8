package main

import (
	"context"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"
)

const (
	exampleLLMConfig = "../../examples/python/llm.yaml"
	exampleLLMPython = "../../examples/python/llm_worker.py"
)

// TestServeExamplePythonLLMWorker runs the Python workers that acquire,
// renew, settle and release permits against a real serve: the fleet never
// holds more than the bucket's in_flight (2) permits, each call's permit
// is renewed while it runs (the work outlasts a third of the 1 s lease),
// and every settle gives the unused estimate back.
func TestServeExamplePythonLLMWorker(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	httpAddr, _, _, stop := startServe(t, "--config", exampleLLMConfig)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, exampleLLMPython, "--url", "http://"+httpAddr,
		"--workers", "6", "--calls", "6", "--work", "0.5", "--ttl", "1", "--estimate", "1200").CombinedOutput()
	if err != nil {
		t.Fatalf("llm_worker.py: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`done: 6 calls in [0-9.]+s, max in flight (\d+), renewals (\d+), tokens settled back (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("unexpected output:\n%s", out)
	}
	inFlight, _ := strconv.Atoi(string(m[1]))
	renewals, _ := strconv.Atoi(string(m[2]))
	if inFlight < 1 || inFlight > 2 {
		t.Errorf("max in flight %d, want at most the bound of 2\n%s", inFlight, out)
	}
	if renewals < 6 {
		t.Errorf("%d renewals for 6 calls of 0.5 s on a 1 s lease, want at least one each\n%s", renewals, out)
	}
	if string(m[3]) != "4800" {
		t.Errorf("tokens settled back %s, want 6 × 800\n%s", m[3], out)
	}
}
