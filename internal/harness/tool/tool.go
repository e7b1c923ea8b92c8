// Package tool finds the external programs some tests need (chromium,
// promtool) and says how to install one that is missing.
//
// A missing program skips the test on a developer's machine, and fails it
// where the whole suite must run: when FLEETRATE_REQUIRE_TOOLS is set
// (./test.sh sets it after installing the tools) or CI is.
package tool

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// InstallAll is the one command that installs every program the tests
// need on Debian or Ubuntu; ./test.sh runs it when one is missing.
const InstallAll = "sudo sh -c 'apt-get update && apt-get install -y --no-install-recommends redis-server redis-sentinel chromium prometheus'"

// Required reports whether a missing program must fail the test rather
// than skip it.
func Required() bool {
	return os.Getenv("FLEETRATE_REQUIRE_TOOLS") != "" || os.Getenv("CI") != ""
}

// Find returns the path of the first of names found in PATH. When none is,
// it fails tb (Required) or skips it, with what the program is for and
// the command that installs it.
func Find(tb testing.TB, purpose string, names ...string) string {
	tb.Helper()
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "none of " + strings.Join(names, ", ") + " found in PATH (" + purpose + "); install it with: " + InstallAll
	if Required() {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
	return ""
}
