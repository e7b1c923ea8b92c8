// Package benchsvc prepares the rate-limit services the benchmarks compare
// side by side: fleetrate serve, built from the module this one replaces
// it with, and envoyproxy/ratelimit, reading the same configuration.
package benchsvc

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BuildFleetrate builds the fleetrate command of the module this one
// replaces it with (its own module, with its own go.sum) into path.
func BuildFleetrate(path string) error {
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/fleetrate/fleetrate").Output()
	if err != nil {
		return fmt.Errorf("finding the fleetrate module: %w", err)
	}
	build := exec.Command("go", "build", "-o", path, "./cmd/fleetrate")
	build.Dir = strings.TrimSpace(string(root))
	if b, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building fleetrate: %v: %s", err, b)
	}
	return nil
}

// Config is the envoyproxy/ratelimit file every service of a comparison
// loads: one descriptor, k, whose limit is never reached, so that every
// call is a decision that books a token.
const Config = `domain: bench
descriptors:
  - key: k
    rate_limit:
      unit: second
      requests_per_unit: 1000000000
`

// WriteConfigs writes Config where fleetrate (dir/fleetrate.yaml) and
// envoyproxy/ratelimit (its runtime directory under dir) read it.
func WriteConfigs(dir string) error {
	rlDir := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(rlDir, 0o755); err != nil {
		return err
	}
	for _, p := range []string{filepath.Join(dir, "fleetrate.yaml"), filepath.Join(rlDir, "bench.yaml")} {
		if err := os.WriteFile(p, []byte(Config), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// FreePort returns a TCP port free on 127.0.0.1 a moment ago.
func FreePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
