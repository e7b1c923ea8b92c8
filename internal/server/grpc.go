package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/fleetrate/fleetrate/internal/ratelog"
)

// rlsService implements envoy.service.ratelimit.v3.RateLimitService.
type rlsService struct {
	rlspb.UnimplementedRateLimitServiceServer
	s *Server
}

// ShouldRateLimit implements the Envoy rate limit service. A bad request
// is INVALID_ARGUMENT; a store failure is UNAVAILABLE, never OVER_LIMIT.
func (r rlsService) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	resp, err := r.s.shouldRateLimit(ctx, req)
	if r.s.tracing != nil {
		r.s.annotateRLS(ctx, req, resp)
	}
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

func grpcError(err error) error {
	switch {
	case isInvalid(err):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}

// healthServices are the service names the gRPC health service reports
// on, besides "" (the whole server): the RLS service's full name, and
// "ratelimit", the name envoyproxy/ratelimit registers, which its
// deployments' probes ask for.
var healthServices = []string{"", "envoy.service.ratelimit.v3.RateLimitService", "ratelimit"}

func (s *Server) newGRPC() *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(int(s.opts.MaxRequestBytes)),
		// One interceptor rather than a chain of two: a chain adds a
		// closure call and frames to every call's stack.
		grpc.UnaryInterceptor(s.grpcUnary),
		grpc.StreamInterceptor(s.grpcStream),
		// Streams run on a pool of long-lived goroutines, whose stacks
		// have grown once, rather than on a new goroutine each, whose
		// stack grows (is copied) on every call: a quarter of the CPU of
		// an in-memory decision (docs/BENCHMARKS.md). A stream that finds
		// every worker busy gets a new goroutine, so the pool is as large
		// as the calls a busy Envoy fleet keeps in flight: with 8 workers,
		// 64 callers still spent 8-12 % of the CPU growing the stacks of
		// new goroutines in gRPC's receive path. Workers take streams in
		// turn, so a lone caller's calls go round the whole pool, on
		// colder stacks: one measurement put its cost at about a tenth
		// more CPU per decision than with 8 workers, a second found none
		// (8 workers: 0.93 and 0.97 times the decisions per CPU-second of
		// 64 at 1 caller, 0.70 and 0.91 at 64 callers, on Redis and in
		// memory; servebench -baseline, docs/BENCHMARKS.md).
		grpc.NumStreamWorkers(streamWorkers),
		// Fixed flow-control windows, as large as a request may be, turn
		// off gRPC's bandwidth-delay estimation: with it, the server
		// answers a lone caller's every request with a PING (and a
		// WINDOW_UPDATE) and reads the caller's PING ack, a write, a read
		// and a wake-up of its reader per decision, to size windows for
		// bulk transfers an RLS call never makes.
		grpc.StaticStreamWindowSize(streamWindow(s.opts.MaxRequestBytes)),
		grpc.StaticConnWindowSize(connWindow),
		// Clients may ping every keepaliveMinTime, with or without calls
		// in flight: grpc-go's default (5 minutes, only during calls)
		// closed with GOAWAY too_many_pings the connections of a client
		// whose keepalive pinged every 10 s, as many clients configure.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
		// Shed before the request is read and decoded (shed.go).
		grpc.InTapHandle(s.shed.tap),
		s.opts.GRPC.serverOption(),
	}
	if s.opts.TLS != nil {
		opts = append(opts, grpc.Creds(loggedHandshakes{credentials.NewTLS(s.opts.TLS), &ratelog.Writer{Log: s.log, Source: "grpc"}}))
	}
	g := grpc.NewServer(opts...)
	rlspb.RegisterRateLimitServiceServer(g, shedRLS{rlsService{s: s}, s.shed})
	s.health = health.NewServer()
	for _, name := range healthServices {
		s.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(g, s.health)
	// Server reflection, so that grpcurl and grpcui find the services
	// without the Envoy protos at hand (docs/API.md's example). It names
	// the services and their messages, nothing of the configuration.
	reflection.Register(g)
	return g
}

// loggedHandshakes logs the TLS handshakes that fail, which gRPC itself
// reports only to its own logger (silent by default), so a client without
// the certificate the server requires read "broken pipe" and the server
// said nothing. The lines are rate-limited: any peer can fail handshakes
// at its connection rate.
type loggedHandshakes struct {
	credentials.TransportCredentials
	log *ratelog.Writer
}

// ServerHandshake does the handshake, logging its failure.
func (c loggedHandshakes) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	// io.EOF is a TCP prober (a load balancer's, a tcpSocket probe): gRPC
	// does not log it either. ErrConnDispatched is no failure.
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, credentials.ErrConnDispatched) {
		fmt.Fprintf(c.log, "grpc: TLS handshake error from %s: %v", conn.RemoteAddr(), err)
	}
	return out, info, err
}

// Clone keeps the logging.
func (c loggedHandshakes) Clone() credentials.TransportCredentials {
	return loggedHandshakes{c.TransportCredentials.Clone(), c.log}
}

// grpcStream ends every stream when shutdown begins: its context ends,
// and a receive returns io.EOF, as if the client had closed it. A stream
// never ends by itself, so a health Watch (a plain RPC a client keeps
// open) or a reflection stream (grpcui keeps one for its session) held
// every graceful stop for the whole ShutdownTimeout (30 s, then the
// connections were closed) where one without took 0.04 s. A Watch reads
// NOT_SERVING first: the health status is set before stopping closes.
func (s *Server) grpcStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	go func() {
		select {
		case <-s.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	return handler(srv, endsAtStop{ServerStream: ss, ctx: ctx, stopping: s.stopping})
}

// endsAtStop is a server stream whose context and receive end once
// stopping closes. A receive that stopping interrupts is left to fail
// when the stream closes; its message is never read.
type endsAtStop struct {
	grpc.ServerStream
	ctx      context.Context
	stopping <-chan struct{}
}

// Context is the stream's context, which also ends at shutdown.
func (e endsAtStop) Context() context.Context { return e.ctx }

// RecvMsg receives the next message, or io.EOF once shutdown begins.
func (e endsAtStop) RecvMsg(m any) error {
	select {
	case <-e.stopping:
		return io.EOF
	default:
	}
	done := make(chan error, 1)
	go func() { done <- e.ServerStream.RecvMsg(m) }()
	select {
	case err := <-done:
		return err
	case <-e.stopping:
		return io.EOF
	}
}

// keepaliveMinTime is the shortest interval at which the gRPC server lets
// a client send keepalive pings.
const keepaliveMinTime = 5 * time.Second

// streamWorkers is the size of the gRPC server's pool of stream workers.
const streamWorkers = 64

// Bounds of the gRPC server's flow-control windows: gRPC's own initial
// window, and the largest its bandwidth-delay estimation would reach.
const (
	minWindow  = 64 << 10
	connWindow = 16 << 20
)

// streamWindow is the flow-control window of a gRPC stream: room for the
// largest request (its message and gRPC's 5-byte prefix) without waiting
// for a WINDOW_UPDATE, within minWindow and connWindow.
func streamWindow(maxRequestBytes int64) int32 {
	return int32(min(max(maxRequestBytes+5, minWindow), connWindow))
}

// setHealth reports the gRPC health status.
func (s *Server) setHealth(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range healthServices {
		s.health.SetServingStatus(name, st)
	}
}

// grpcUnary is the server's one interceptor: it counts the call in
// flight, turns a panic into INTERNAL, and refuses a call without a known
// bearer token (but health checks) as UNAUTHENTICATED.
func (s *Server) grpcUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (resp any, err error) {
	s.metrics.inflight.Inc()
	defer s.metrics.inflight.Dec()
	if s.tracing != nil && info.FullMethod != healthpb.Health_Check_FullMethodName {
		var end func(error)
		ctx, end = s.tracing.startGRPC(ctx, info.FullMethod)
		defer func() { end(err) }() // after the recover below: sees its INTERNAL
	}
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("panic serving gRPC", "method", info.FullMethod, "panic", v, "stack", string(debug.Stack()))
			resp, err = nil, status.Error(codes.Internal, "internal error")
		}
	}()
	if err := s.grpcAuthorized(ctx, info); err != nil {
		return nil, err
	}
	return next(ctx, req)
}

// grpcAuthorized refuses a call (but a health check) whose caller lacks
// the decide scope: UNAUTHENTICATED without a known bearer token when
// tokens are configured, PERMISSION_DENIED for a token without decide.
func (s *Server) grpcAuthorized(ctx context.Context, info *grpc.UnaryServerInfo) error {
	if info.FullMethod == healthpb.Health_Check_FullMethodName {
		return nil
	}
	return s.access.admitGRPC(ctx, info.FullMethod)
}
