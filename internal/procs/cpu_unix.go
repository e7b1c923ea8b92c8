//go:build unix

package procs

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user and system) of every thread of this
// process so far.
func processCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
