package main

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

// TestServeRedisTLSFiles runs the service as envoyproxy/ratelimit's
// deployments reach a Redis over TLS with their own CA and a client
// certificate (REDIS_TLS, REDIS_TLS_CACERT, REDIS_TLS_CLIENT_CERT,
// REDIS_TLS_CLIENT_KEY), on a real redis-server that requires client
// certificates: decisions are made; without the client certificate Redis
// refuses the connection and decisions are UNAVAILABLE.
func TestServeRedisTLSFiles(t *testing.T) {
	t.Parallel()
	rs := redistest.StartTLS(t, "--tls-auth-clients", "yes")
	certs := rs.Certs()
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
	decide := func(env map[string]string) error {
		_, grpcAddr, _, stop := startServeEnv(t, envFrom(env), "--config", path)
		defer stop()
		conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge",
			Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.9"}}}}})
		return err
	}
	env := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": rs.Addr(), "REDIS_TLS": "true", "REDIS_TIMEOUT": "5s",
		"REDIS_TLS_CACERT": certs.CAFile, "REDIS_TLS_CLIENT_CERT": certs.ClientCertFile, "REDIS_TLS_CLIENT_KEY": certs.ClientKeyFile}
	if err := decide(env); err != nil {
		t.Errorf("with the CA and the client certificate: %v, want a decision", err)
	}
	delete(env, "REDIS_TLS_CLIENT_CERT")
	delete(env, "REDIS_TLS_CLIENT_KEY")
	if err := decide(env); err == nil {
		t.Error("without the client certificate Redis requires: a decision, want UNAVAILABLE")
	}
	// Files for a Redis reached without TLS stop the start.
	env["REDIS_TLS"] = "false"
	err := run(context.Background(), []string{"serve", "--config", path}, envFrom(env), &strings.Builder{}, &strings.Builder{})
	if err == nil || !strings.Contains(err.Error(), "need a rediss:// --redis URL") {
		t.Errorf("CA file without REDIS_TLS: %v, want refused", err)
	}
}

// TestRedisTLSSkipHostname: with REDIS_TLS_SKIP_HOSTNAME_VERIFICATION the
// chain is still verified, but not the name dialled.
func TestRedisTLSSkipHostname(t *testing.T) {
	t.Parallel()
	rs := redistest.StartTLS(t)
	certs := rs.Certs()
	dial := func(files redisTLSFiles, trust bool) error {
		base := &tls.Config{ServerName: "not-in-the-certificate.example", MinVersion: tls.VersionTLS12}
		if !trust {
			files.caFile = ""
		}
		c, err := files.apply(base)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := tls.Dial("tcp", rs.Addr(), c)
		if err == nil {
			conn.Close()
		}
		return err
	}
	files := redisTLSFiles{caFile: certs.CAFile}
	if err := dial(files, true); err == nil || !strings.Contains(err.Error(), "not-in-the-certificate.example") {
		t.Errorf("a name the certificate lacks, checked: %v, want refused", err)
	}
	files.skipHostname = true
	if err := dial(files, true); err != nil {
		t.Errorf("a name the certificate lacks, not checked: %v, want connected", err)
	}
	if err := dial(files, false); err == nil {
		t.Error("hostname unchecked and the CA not trusted: connected, want the chain refused")
	}
}
