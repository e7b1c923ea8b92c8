// Package benchsvc prepares the rate-limit services the benchmarks compare
// side by side: fleetrate serve, built from the module this one replaces
// it with, and envoyproxy/ratelimit, reading the same configuration.
package benchsvc

import (
	"fmt"
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

// WriteConfigs writes config where fleetrate (dir/fleetrate.yaml) and
// envoyproxy/ratelimit (its runtime directory under dir, file name) read
// it.
func WriteConfigs(dir, name, config string) error {
	rlDir := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(rlDir, 0o755); err != nil {
		return err
	}
	for _, p := range []string{filepath.Join(dir, "fleetrate.yaml"), filepath.Join(rlDir, name)} {
		if err := os.WriteFile(p, []byte(config), 0o644); err != nil {
			return err
		}
	}
	return nil
}
