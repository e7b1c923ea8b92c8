package main

import (
	"log/slog"
	"os"
	"runtime/debug"
)

// oneCPUProcs is the processor count of a service whose host (or CPU
// affinity, or cgroup limit) gives it one CPU. With one processor, the
// goroutines that read the calls off the connections wait behind the
// decisions in flight and the store's senders; with two, the operating
// system shares the CPU between two threads and a connection's reader
// runs while the other thread decides. Offered 10 times what it decides
// on one CPU, the service answered its shed calls in about half the
// time and kept more of its maximum (docs/OPERATIONS.md, Processors).
// Setting it ends Go's automatic
// updates of the count: a CPU limit raised later is followed after a
// restart.
const oneCPUProcs = 2

// redisGCPercent is the garbage collector's target (GOGC) of a service on
// Redis, unless the GOGC environment variable sets one: its live heap is
// small (the configuration, the connections) and nearly all it allocates
// is the garbage of calls, so collecting at 5 times the live heap rather
// than twice costs about 40 MiB at 10 times its maximum on one CPU, and
// gives the collector's CPU to decisions (docs/OPERATIONS.md, Overload).
// The in-memory store's buckets are live heap: it keeps Go's default.
const redisGCPercent = 400

// setRedisGC sets redisGCPercent unless GOGC is set in the environment,
// and logs which.
func setRedisGC(log *slog.Logger) {
	if v := os.Getenv("GOGC"); v != "" {
		log.Info("garbage collector: GOGC from the environment", "gogc", v)
		return
	}
	debug.SetGCPercent(redisGCPercent)
	log.Info("garbage collector: GOGC for a service on Redis", "gogc", redisGCPercent)
}
