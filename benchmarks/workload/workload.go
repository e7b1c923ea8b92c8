// Package workload is the load that both benchmark front ends (`go test
// -bench` and fleetbench) put on every limiter they compare: one limit
// that grants nearly every call, so that they measure decisions, with a
// rate low enough that every bucket stays in use (not yet refilled)
// between two visits, as real traffic keeps it; and a fixed keyspace.
package workload

import (
	"strconv"

	"github.com/fleetrate/fleetrate"
)

const (
	// Rate and Burst are the limit of every bucket (per second).
	Rate  = 100
	Burst = 1 << 27
	// Keys is the size of the keyspace.
	Keys = 10_000
)

// Limit is Rate and Burst as a fleetrate limit.
var Limit = fleetrate.PerSecond(Rate, Burst)

// KeyNames are the names of the keyspace, "bench:0" to "bench:9999".
var KeyNames = func() []string {
	k := make([]string, Keys)
	for i := range k {
		k[i] = "bench:" + strconv.Itoa(i)
	}
	return k
}()
