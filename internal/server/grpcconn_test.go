package server

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/h2goaway"
)

// TestGRPCConnectionAge: a connection older than MaxConnectionAge gets
// GOAWAY (read by a raw HTTP/2 client, which sees the frame itself where
// gRPC's client would reconnect silently), and gRPC clients keep being
// answered across it.
func TestGRPCConnectionAge(t *testing.T) {
	t.Parallel()
	ts := start(t, limitHeadersConfig, func(o *Options) {
		o.GRPC = GRPCOptions{MaxConnectionAge: 200 * time.Millisecond, MaxConnectionAgeGrace: 10 * time.Second}
	})
	conn, err := net.Dial("tcp", ts.grpcAdr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The GOAWAY comes after 0.2 s +/- 10 %.
	f := h2goaway.Await(t, conn)
	if f.ErrCode != http2.ErrCodeNo {
		t.Errorf("GOAWAY %v, want NO_ERROR (a graceful one)", f.ErrCode)
	}
	// The gRPC client's connection ages too: it keeps working.
	for range 3 {
		if r := ts.should(t, "edge", 1, desc("ten", "x")); r.OverallCode != ok {
			t.Fatalf("after GOAWAY: %v", r)
		}
	}
}

// TestGRPCOptionsNegative: a negative duration is refused, naming it.
func TestGRPCOptionsNegative(t *testing.T) {
	t.Parallel()
	cfg := start(t, "domain: d\n").Config()
	_, err := New(Options{Store: failingStore{}, Config: cfg, GRPC: GRPCOptions{MaxConnectionAgeGrace: -time.Second}})
	if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "max connection age grace") {
		t.Errorf("New: %v, want ErrInvalid naming the grace", err)
	}
}
