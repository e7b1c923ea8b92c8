package redisstore

// This file makes Options.EmptyAfterFailover the default where the store
// can tell that it is safe and needed: on a client of one master (a
// standalone server, or a Sentinel failover client), whose master may
// change under it. Without it, a Sentinel failover let a fleet at 200/s
// burst 40 take 2.2 bursts over its bound (docs/OPERATIONS.md, Sentinel),
// and a restarted Redis without persistence grants every bucket full.

import (
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
)

// failoverDefault returns opts with EmptyAfterFailover set when c has a
// single master whose change the store can see (a *redis.Client, plain or
// Sentinel's) and KeepAfterFailover does not turn it off. Every restart
// of a master changes its replication ID (Redis 7 draws a new one even
// when it reloads its data, whose buckets are then as old as its last
// save), so a restart empties buckets too. A Cluster or a Ring has a
// master per key and is left as it is, as is a Client of another type,
// which the store cannot see through.
func failoverDefault(c Client, opts Options) (Options, error) {
	if opts.KeepAfterFailover {
		if opts.EmptyAfterFailover {
			return opts, fmt.Errorf("%w: redisstore: EmptyAfterFailover and KeepAfterFailover are both set; set at most one", fleetrate.ErrInvalid)
		}
		return opts, nil
	}
	if _, ok := c.(*redis.Client); ok {
		opts.EmptyAfterFailover = true
	}
	return opts, nil
}
