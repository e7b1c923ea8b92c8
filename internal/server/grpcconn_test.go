package server

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/fleetrate/fleetrate"
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
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	// A bound on a hung test only: the GOAWAY comes after 0.2 s +/- 10 %.
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no GOAWAY before the connection ended: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if err := fr.WriteSettingsAck(); err != nil {
					t.Fatal(err)
				}
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				if err := fr.WritePing(true, f.Data); err != nil {
					t.Fatal(err)
				}
			}
		case *http2.GoAwayFrame:
			if f.ErrCode != http2.ErrCodeNo {
				t.Errorf("GOAWAY %v, want NO_ERROR (a graceful one)", f.ErrCode)
			}
			// The gRPC client's connection ages too: it keeps working.
			for range 3 {
				if r := ts.should(t, "edge", 1, desc("ten", "x")); r.OverallCode != ok {
					t.Fatalf("after GOAWAY: %v", r)
				}
			}
			return
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
