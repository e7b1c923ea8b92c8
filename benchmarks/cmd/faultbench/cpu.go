package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// clockTicks is the unit of /proc/PID/stat's CPU times (USER_HZ, 100 on
// Linux).
const clockTicks = 100

// cpuSeconds is the CPU time (user and system) pid has used, in seconds,
// from /proc/PID/stat; -1 when it cannot be read.
func cpuSeconds(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// The command name, in parentheses, may hold spaces: the fields
	// counted from 3 (state) begin after its last ')'.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return -1
	}
	u, err1 := strconv.ParseFloat(f[11], 64)
	k, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return (u + k) / clockTicks
}

// cpuMeter reads the CPU time of the service and of its Redis together:
// on -server-cpu they share one CPU, so a decision costs both.
type cpuMeter struct{ pids []int }

// now is the CPU seconds used so far by every process of m.
func (m cpuMeter) now() float64 {
	t := 0.0
	for _, p := range m.pids {
		t += max(cpuSeconds(p), 0)
	}
	return t
}

// ceiling is the most goodput, as a share of the maximum capacity
// (decisions a second), that a service whose decisions cost decision
// CPU-seconds and whose sheds cost shed can keep on one CPU (the service
// and its Redis on -server-cpu) when offered mult times the maximum: the
// sheds' CPU ((mult × capacity − g) × shed) comes out of the decisions'
// (g × decision), so g × decision + (mult × capacity − g) × shed ≤ 1.
func ceiling(mult, capacity, decision, shed float64) float64 {
	if decision <= shed || capacity <= 0 {
		return 0
	}
	return min(max((1-mult*capacity*shed)/((decision-shed)*capacity), 0), 1)
}
