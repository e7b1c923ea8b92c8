package main

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// demoChildEnv is set in the environment of the worker processes the demo
// starts, so that a test binary standing in for fleetrate can recognise
// them.
const demoChildEnv = "FLEETRATE_DEMO_CHILD"

// newDemoWorkerCmd returns the hidden "demo worker" command: one process of
// a demo fleet started by "demo --processes N". It prints its report as
// JSON on stdout.
func newDemoWorkerCmd() *cobra.Command {
	var spec fleetSpec
	var start, until string
	cmd := &cobra.Command{
		Use:    "worker",
		Short:  "Run one process of a demo fleet (started by demo --processes)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if spec.Start, err = time.Parse(time.RFC3339Nano, start); err != nil {
				return fmt.Errorf("--start: %w", err)
			}
			if spec.Until, err = time.Parse(time.RFC3339Nano, until); err != nil {
				return fmt.Errorf("--until: %w", err)
			}
			if err := spec.validate(); err != nil {
				return err
			}
			report, err := runFleet(cmd.Context(), spec)
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(report)
		},
	}
	f := cmd.Flags()
	f.StringVar(&spec.Mode, "mode", "", "naive, shared or adaptive")
	f.StringVar(&spec.OTA, "ota", "", "the mock OTA's base URL")
	f.IntVar(&spec.Workers, "workers", 0, "workers in this process")
	f.IntVar(&spec.FirstWorker, "first", 0, "index of this process's first worker")
	f.StringVar(&start, "start", "", "when to start (RFC 3339)")
	f.StringVar(&until, "until", "", "when to stop (RFC 3339)")
	f.Float64Var(&spec.Share, "share", 0, "shared modes: fraction of each documented limit")
	f.Float64Var(&spec.Rate, "rate", 0, "naive mode: each worker's rate per second")
	f.StringVar(&spec.Redis, "redis", "", "shared modes: Redis URL")
	f.StringVar(&spec.Prefix, "prefix", "", "shared modes: store key prefix")
	return cmd
}

// validate checks a worker process's spec, naming the failing flag.
func (s fleetSpec) validate() error {
	switch {
	case !slices.Contains(demoModes, s.Mode):
		return fmt.Errorf("--mode must be one of %s, got %q", strings.Join(demoModes, ", "), s.Mode)
	case s.OTA == "":
		return fmt.Errorf("--ota must be set")
	case s.Workers < 1 || s.Workers > maxDemoWorkers:
		return fmt.Errorf("--workers must be between 1 and %d, got %d", maxDemoWorkers, s.Workers)
	case s.FirstWorker < 0:
		return fmt.Errorf("--first must be >= 0, got %d", s.FirstWorker)
	case !s.Until.After(s.Start) || s.Until.Sub(s.Start) > maxDemoDuration:
		return fmt.Errorf("--until must be after --start by at most %v, got %v", maxDemoDuration, s.Until.Sub(s.Start))
	case s.Mode == modeNaive && (math.IsNaN(s.Rate) || s.Rate <= 0 || s.Rate > maxDemoNaiveRate):
		return fmt.Errorf("--rate must be above 0 and at most %g, got %v", float64(maxDemoNaiveRate), s.Rate)
	case s.Mode != modeNaive && (math.IsNaN(s.Share) || s.Share <= 0 || s.Share > 1):
		return fmt.Errorf("--share must be above 0 and at most 1, got %v", s.Share)
	}
	return nil
}
