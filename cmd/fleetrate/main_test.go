package main

import (
	"os"
	"testing"
)

// TestMain turns the processor governor off for the services the tests
// run inside this process: there is one GOMAXPROCS per process, and the
// tests around them would share it. TestServeAdaptiveProcs runs one in a
// process of its own, with the flag, which wins over this variable.
func TestMain(m *testing.M) {
	os.Setenv(envName("adaptive-procs"), "false")
	os.Exit(m.Run())
}
