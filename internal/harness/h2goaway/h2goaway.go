// Package h2goaway is a test's HTTP/2 client that waits for a server's
// GOAWAY frame: what a gRPC client sees when its connection has aged
// (MaxConnectionAge), read from the wire rather than from grpc-go.
package h2goaway

import (
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// Await speaks HTTP/2 on conn, answering SETTINGS and PING, until a
// GOAWAY frame comes, which it returns.
func Await(t testing.TB, conn net.Conn) *http2.GoAwayFrame {
	t.Helper()
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	// A bound on a hung test only.
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
			return f
		}
	}
}
