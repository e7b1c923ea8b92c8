package server

import (
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/fleetrate/fleetrate"
)

// Defaults of fleetrate serve's gRPC connection settings: those of
// envoyproxy/ratelimit (GRPC_MAX_CONNECTION_AGE, 24 h, and
// GRPC_MAX_CONNECTION_AGE_GRACE, 1 h) and grpc-go's keepalive (a ping
// after 2 h without activity, the connection closed when its answer takes
// over 20 s).
const (
	DefaultMaxConnectionAge      = 24 * time.Hour
	DefaultMaxConnectionAgeGrace = time.Hour
	DefaultKeepaliveTime         = 2 * time.Hour
	DefaultKeepaliveTimeout      = 20 * time.Second
)

// GRPCOptions configure the gRPC server's connections. A zero field is
// grpc-go's default, under which a connection never ages: fleetrate serve
// passes the Default values above, envoyproxy/ratelimit's.
type GRPCOptions struct {
	// MaxConnectionAge is how long a connection may live: then the server
	// sends GOAWAY, so that the client opens a new one, which its load
	// balancing may put on another replica (after a scale-up, Envoy's
	// long-lived connections otherwise never reach the new replicas).
	// gRPC adds a random jitter of +/-10 %. Zero: forever.
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace is how long the calls in flight on a
	// connection past its age get to finish before it is closed. Zero:
	// forever.
	MaxConnectionAgeGrace time.Duration
	// KeepaliveTime is how long a connection may be idle before the
	// server pings the client to see that it is alive. Zero: 2 h.
	KeepaliveTime time.Duration
	// KeepaliveTimeout is how long the server waits for the answer to
	// that ping before it closes the connection. Zero: 20 s.
	KeepaliveTimeout time.Duration
}

// validate refuses negative durations.
func (g GRPCOptions) validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"max connection age", g.MaxConnectionAge}, {"max connection age grace", g.MaxConnectionAgeGrace},
		{"keepalive time", g.KeepaliveTime}, {"keepalive timeout", g.KeepaliveTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("%w: server: gRPC %s must not be negative, got %v", fleetrate.ErrInvalid, d.name, d.v)
		}
	}
	return nil
}

// serverOption is the gRPC server option of g.
func (g GRPCOptions) serverOption() grpc.ServerOption {
	return grpc.KeepaliveParams(keepalive.ServerParameters{
		MaxConnectionAge:      g.MaxConnectionAge,
		MaxConnectionAgeGrace: g.MaxConnectionAgeGrace,
		Time:                  g.KeepaliveTime,
		Timeout:               g.KeepaliveTimeout,
	})
}
