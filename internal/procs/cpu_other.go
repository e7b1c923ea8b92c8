//go:build !unix

package procs

import (
	"errors"
	"time"
)

// processCPU is not measured outside Unix: Start returns this error at
// once and leaves Go's default.
func processCPU() (time.Duration, error) {
	return 0, errors.New("not measured on this system")
}
