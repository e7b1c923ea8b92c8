package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetrate/fleetrate/internal/harness/h2goaway"
)

// testCA is a certificate authority made by a test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	file string // its certificate, PEM
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fleetrate test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	file := serveWriteFile(t, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	return &testCA{cert: cert, key: key, pool: pool, file: file}
}

// issue signs a certificate of serial for 127.0.0.1 and the DNS names,
// for servers and clients, and returns it with its key as PEM.
func (ca *testCA) issue(t *testing.T, serial int64, names ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "fleetrate test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: names, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// clientPair is a client certificate of ca naming name.
func (ca *testCA) clientPair(t *testing.T, name string) tls.Certificate {
	t.Helper()
	c, k := ca.issue(t, 100, name)
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// replaceFile writes data to path by rename, as a Secret volume update
// swaps files.
func replaceFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path+".new", data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// edgeCall is an RLS request the test config answers OK, always: its
// descriptor matches no limit.
var edgeCall = &rlspb.RateLimitRequest{Domain: "edge",
	Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}

func rlsCall(ctx context.Context, conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, edgeCall)
	return err
}

// TestServeClientSAN runs the service as envoyproxy/ratelimit's mTLS
// deployments do (GRPC_SERVER_USE_TLS, GRPC_CLIENT_TLS_CACERT,
// GRPC_CLIENT_TLS_SAN): a client certificate from the same CA that does
// not name the SAN is refused, one that does is served.
func TestServeClientSAN(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	certPEM, keyPEM := ca.issue(t, 2, "ratelimit.mesh")
	env := map[string]string{
		"GRPC_SERVER_USE_TLS":    "true",
		"GRPC_SERVER_TLS_CERT":   serveWriteFile(t, "server.pem", string(certPEM)),
		"GRPC_SERVER_TLS_KEY":    serveWriteFile(t, "server-key.pem", string(keyPEM)),
		"GRPC_CLIENT_TLS_CACERT": ca.file,
		"GRPC_CLIENT_TLS_SAN":    "envoy.mesh",
	}
	_, grpcAddr, logs, _ := startServeEnv(t, envFrom(env), "--config", serveWriteFile(t, "fleetrate.yaml", serveTestConfig))
	call := func(certs ...tls.Certificate) error {
		conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.pool, Certificates: certs})))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return rlsCall(context.Background(), conn)
	}
	if err := call(ca.clientPair(t, "envoy.mesh")); err != nil {
		t.Errorf("client named envoy.mesh: %v, want served", err)
	}
	if err := call(ca.clientPair(t, "intruder.mesh")); err == nil {
		t.Error("client of the same CA named intruder.mesh: served, want refused")
	}
	if err := call(); err == nil {
		t.Error("client without a certificate: served, want refused")
	}
	if !strings.Contains(logs.String(), `refused by --tls-client-san \"envoy.mesh\"`) {
		t.Errorf("the refusal is not logged with its reason:\n%s", logs)
	}
}

// TestServeClientSANNeedsClientCA: a name to pin without client
// certificates to check stops the start.
func TestServeClientSANNeedsClientCA(t *testing.T) {
	t.Parallel()
	certFile, keyFile, _ := selfSigned(t)
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
	err := run(context.Background(), []string{"serve", "--config", path, "--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-client-san", "envoy.mesh"}, envFrom(nil), &strings.Builder{}, &strings.Builder{})
	if err == nil || !strings.Contains(err.Error(), "--tls-client-san needs --tls-client-ca-file") {
		t.Errorf("run: %v, want the SAN refused without a client CA", err)
	}
}

// TestServeConnectionAge: with envoyproxy/ratelimit's
// GRPC_MAX_CONNECTION_AGE a client gets GOAWAY once its connection is that
// old; by default (24 h, as its default) it does not within the test.
func TestServeConnectionAge(t *testing.T) {
	t.Parallel()
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
	env := map[string]string{"GRPC_MAX_CONNECTION_AGE": "300ms", "GRPC_MAX_CONNECTION_AGE_GRACE": "5s"}
	_, grpcAddr, _, _ := startServeEnv(t, envFrom(env), "--config", path)
	conn, err := net.Dial("tcp", grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if f := h2goaway.Await(t, conn); f.ErrCode != http2.ErrCodeNo {
		t.Errorf("GOAWAY %v, want NO_ERROR", f.ErrCode)
	}
	cmd := serveCommand(envFrom(nil))
	if err := cmd.ParseFlags([]string{"--config", path}); err != nil {
		t.Fatal(err)
	}
	st, err := resolveSettings(cmd.Flags(), envFrom(nil))
	if err != nil {
		t.Fatal(err)
	}
	if g := st.envoyCompat.grpc; g.MaxConnectionAge != 24*time.Hour || g.MaxConnectionAgeGrace != time.Hour || g.KeepaliveTime != 2*time.Hour || g.KeepaliveTimeout != 20*time.Second {
		t.Errorf("defaults %+v, want envoyproxy/ratelimit's 24h and 1h, gRPC's 2h and 20s", g)
	}
}

// TestServeUnixSocket serves gRPC on a Unix socket (envoyproxy/ratelimit's
// GRPC_UDS, --grpc-addr unix:PATH), over a socket file a killed process
// left behind.
func TestServeUnixSocket(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "rl.sock")
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	_, grpcAddr, _, stop := startServe(t, "--config", serveWriteFile(t, "fleetrate.yaml", serveTestConfig), "--grpc-addr", "unix:"+sock)
	if grpcAddr != sock {
		t.Errorf("serving gRPC on %q, want %q", grpcAddr, sock)
	}
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := rlsCall(context.Background(), conn); err != nil {
		t.Fatalf("RLS over the socket: %v", err)
	}
	// A second service on the same socket is refused: the first answers.
	err = run(context.Background(), []string{"serve", "--config", serveWriteFile(t, "fleetrate.yaml", serveTestConfig), "--http-addr", "off", "--grpc-addr", "unix:" + sock}, envFrom(nil), &strings.Builder{}, &strings.Builder{})
	if err == nil || !strings.Contains(err.Error(), "another process serves on it") {
		t.Errorf("second service on the socket: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket file after stop: %v, want removed", err)
	}
	// envoyproxy/ratelimit's GRPC_UDS, with its GRPC_PORT beside it: the
	// socket wins, as there.
	sock = filepath.Join(t.TempDir(), "uds.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	logs := &serveLog{}
	env := envFrom(map[string]string{"GRPC_UDS": sock, "GRPC_PORT": "1", "HOST": "127.0.0.1", "PORT": "0"})
	go func() {
		done <- run(ctx, []string{"serve", "--config", serveWriteFile(t, "fleetrate.yaml", serveTestConfig), "--log-format", "json", "--log-level", "info"}, env, io.Discard, logs)
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if g, ok := logs.field("fleetrate serving", "grpc"); ok {
			if g != sock {
				t.Errorf("GRPC_UDS: serving gRPC on %v, want %s", g, sock)
			}
			break
		}
		select {
		case err := <-done:
			t.Fatalf("GRPC_UDS: serve exited: %v\n%s", err, logs)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("GRPC_UDS: no startup line in 10 s:\n%s", logs)
		}
	}
	if err := rlsCall(context.Background(), conn2(t, sock)); err != nil {
		t.Errorf("RLS over GRPC_UDS: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("GRPC_UDS service: %v", err)
	}
}

// conn2 is a gRPC client of the Unix socket at sock, closed with the test.
func conn2(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestServeRotatesCertificateUnderLoad rotates the TLS certificate and key
// (by rename, as a Secret update does) while clients call over a
// connection opened before: new connections get the new serial, and no
// call fails.
func TestServeRotatesCertificateUnderLoad(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	c1, k1 := ca.issue(t, 1001, "ratelimit.mesh")
	certFile, keyFile := serveWriteFile(t, "tls.crt", string(c1)), serveWriteFile(t, "tls.key", string(k1))
	_, grpcAddr, logs, _ := startServe(t, "--config", serveWriteFile(t, "fleetrate.yaml", serveTestConfig),
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-http=false", "--reload-interval", "20ms")
	serial := func() int64 {
		c, err := tls.Dial("tcp", grpcAddr, &tls.Config{RootCAs: ca.pool, NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatalf("TLS dial: %v", err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	if s := serial(); s != 1001 {
		t.Fatalf("serial %d, want 1001", s)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := rlsCall(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	var (
		stop          atomic.Bool
		rotated       atomic.Bool
		calls, after  atomic.Int64
		failed        atomic.Value
		wg            sync.WaitGroup
		ctx           = context.Background()
		callers       = 4
		rotatedSerial = int64(1002)
	)
	for range callers {
		wg.Go(func() {
			for !stop.Load() {
				if err := rlsCall(ctx, conn); err != nil {
					failed.Store(err)
					return
				}
				calls.Add(1)
				if rotated.Load() {
					after.Add(1)
				}
			}
		})
	}
	// Rotate while the calls are under way.
	for deadline := time.Now().Add(30 * time.Second); calls.Load() < 100 && failed.Load() == nil && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	c2, k2 := ca.issue(t, rotatedSerial, "ratelimit.mesh")
	replaceFile(t, keyFile, k2) // the key first: for a moment the pair does not match
	replaceFile(t, certFile, c2)
	for deadline := time.Now().Add(30 * time.Second); serial() != rotatedSerial; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the rotated certificate was not served within 30 s:\n%s", logs)
		}
	}
	rotated.Store(true)
	for deadline := time.Now().Add(30 * time.Second); after.Load() < 100 && failed.Load() == nil && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatalf("a call failed during the rotation: %v", err)
	}
	if after.Load() < 100 {
		t.Errorf("%d calls after the rotation on the connection opened before, want at least 100", after.Load())
	}
	if !strings.Contains(logs.String(), `"serial":"1002"`) {
		t.Errorf("the reload is not logged with its serial:\n%s", logs)
	}
	t.Logf("%d calls, %d after the rotation, none failed", calls.Load(), after.Load())
}

// TestServeLimitHeaders runs the service with envoyproxy/ratelimit's
// LIMIT_RESPONSE_HEADERS_ENABLED and header names: a grant and a denial
// carry its three headers, beside the IETF fields the file turns on.
func TestServeLimitHeaders(t *testing.T) {
	t.Parallel()
	env := map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_REMAINING_HEADER": "X-Left"}
	// 2/minute: real time cannot refill a token between the calls.
	path := serveWriteFile(t, "fleetrate.yaml", "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 2}\nserver:\n  response_headers: true\n")
	_, grpcAddr, _, _ := startServeEnv(t, envFrom(env), "--config", path)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}}}}
	var got []string
	for range 3 { // two grants, then a denial
		r, err := rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		h := map[string]string{}
		for _, kv := range r.ResponseHeadersToAdd {
			h[kv.Key] = kv.Value
		}
		if h["RateLimit"] == "" || h["RateLimit-Policy"] == "" {
			t.Errorf("response %d: %v, want the IETF fields too (the file's response_headers)", len(got), h)
		}
		// Reset is the status's duration_until_reset, in whole seconds:
		// full again in 30 s, then 60 s; the denial would pass in 30 s,
		// each less the time since the first call, rounded up (a second
		// less should the calls be a second apart on a loaded machine).
		if d := strconv.FormatInt(r.Statuses[0].GetDurationUntilReset().GetSeconds(), 10); h["RateLimit-Reset"] != d {
			t.Errorf("response %d: RateLimit-Reset %q, duration_until_reset %s s: want them equal", len(got), h["RateLimit-Reset"], d)
		}
		got = append(got, r.OverallCode.String()+" "+h["RateLimit-Limit"]+" "+h["X-Left"])
		if reset, want := h["RateLimit-Reset"], []string{"30", "60", "30"}[len(got)-1]; reset != want && reset != strconv.Itoa(mustAtoi(t, want)-1) {
			t.Errorf("response %d: RateLimit-Reset %q, want %s", len(got), reset, want)
		}
	}
	if want := []string{"OK 2 1", "OK 2 0", "OVER_LIMIT 2 0"}; strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("code, limit, remaining: %q, want %q", got, want)
	}
}

// TestServeEnvoyCompatSettings: the file's server section gives the new
// settings, flags override it, and a bad header name is refused, named.
func TestServeEnvoyCompatSettings(t *testing.T) {
	t.Parallel()
	path := serveWriteFile(t, "fleetrate.yaml", "domain: d\nserver:\n  limit_headers: true\n  limit_header_reset: X-Reset\n  grpc_max_connection_age: 10m\n  grpc_keepalive_time: 1m\n")
	resolve := func(args ...string) (serveSettings, error) {
		cmd := serveCommand(envFrom(nil))
		if err := cmd.ParseFlags(append([]string{"--config", path}, args...)); err != nil {
			t.Fatal(err)
		}
		return resolveSettings(cmd.Flags(), envFrom(nil))
	}
	st, err := resolve("--grpc-max-connection-age", "1h")
	if err != nil {
		t.Fatal(err)
	}
	c := st.envoyCompat
	if !c.limitHeaders.Enabled || c.limitHeaders.Reset != "X-Reset" || c.limitHeaders.Limit != "RateLimit-Limit" || c.grpc.MaxConnectionAge != time.Hour || c.grpc.KeepaliveTime != time.Minute {
		t.Errorf("resolved %+v", c)
	}
	if _, err := resolve("--limit-header-limit", "Rate Limit"); err == nil || !strings.Contains(err.Error(), `--limit-header-limit must be an HTTP field name`) || !strings.Contains(err.Error(), `"Rate Limit"`) {
		t.Errorf("bad header name: %v", err)
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
