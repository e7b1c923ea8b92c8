package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/fleetrate/fleetrate/internal/harness/logbuf"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

const serveTestConfig = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 2}
buckets:
  - channel: booking_com
    endpoint: availability
    rate_limit: {unit: second, requests_per_unit: 20, burst: 40}
server:
  http_addr: "127.0.0.1:1"
  grpc_addr: "127.0.0.1:2"
  max_wait: 3s
  log_level: warn
  response_headers: true
  near_limit_ratio: 0.5
  memory_max_keys: 5000
`

func serveWriteFile(t *testing.T, name, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestServeSettingsPrecedence(t *testing.T) {
	t.Parallel()
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
	tokens := serveWriteFile(t, "tokens", "# rotate monthly\nfirst\n\n second \n ops\tadmin,decide\n")
	env := map[string]string{
		"FLEETRATE_CONFIG":          "ignored-because-the-flag-wins.yaml",
		"FLEETRATE_HTTP_ADDR":       "127.0.0.1:3",
		"FLEETRATE_GRPC_ADDR":       "127.0.0.1:4",
		"FLEETRATE_SHADOW_MODE":     "true",
		"FLEETRATE_AUTH_TOKEN_FILE": tokens,
		"FLEETRATE_AUTH_TOKEN":      "third, fourth:store+admin",
	}
	cmd := serveCommand(func(k string) string { return env[k] })
	if err := cmd.ParseFlags([]string{"--config", path, "--http-addr", "127.0.0.1:5", "--store-timeout", "250ms"}); err != nil {
		t.Fatal(err)
	}
	st, err := resolveSettings(cmd.Flags(), func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"config: flag", st.configPath, path},
		{"http-addr: flag over env and file", st.httpAddr, "127.0.0.1:5"},
		{"grpc-addr: env over file", st.grpcAddr, "127.0.0.1:4"},
		{"max-wait: file over default", st.maxWait, 3 * time.Second},
		{"log-level: file", st.logLevel, "warn"},
		{"response-headers: file", st.responseHeaders, true},
		{"shadow-mode: env", st.shadowMode, true},
		{"store-timeout: flag", st.storeTimeout, 250 * time.Millisecond},
		{"write-timeout: default", st.writeTimeout, 10 * time.Second},
		{"store-api: default", st.storeAPI, true},
		{"near-limit-ratio: file", st.nearLimitRatio, 0.5},
		{"memory-max-keys: file", st.memMaxKeys, int64(5000)},
		{"prefix: default", st.prefix, "fleetrate:"},
		{"tokens", fmt.Sprint(st.access.tokens), "[{first decide,store} {second decide,store} {ops decide,admin} {third decide,store} {fourth store,admin}]"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestServeSettingsErrors(t *testing.T) {
	t.Parallel()
	good := serveWriteFile(t, "good.yaml", serveTestConfig)
	bad := serveWriteFile(t, "bad.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"missing file", []string{"--config", filepath.Join(t.TempDir(), "nope.yaml")}, nil, "not found: give one with --config"},
		{"bad file", []string{"--config", bad}, nil, bad + `:4: descriptors[0].rate_limit.unit: unknown unit "fortnight"`},
		{"bad env duration", []string{"--config", good}, map[string]string{"FLEETRATE_MAX_WAIT": "soon"}, `--max-wait / FLEETRATE_MAX_WAIT: invalid value "soon"`},
		{"bad env bool", []string{"--config", good}, map[string]string{"FLEETRATE_STORE_API": "maybe"}, `FLEETRATE_STORE_API: invalid value "maybe"`},
		{"half TLS", []string{"--config", good, "--tls-cert-file", "x.pem"}, nil, "--tls-cert-file and --tls-key-file"},
		{"client CA without TLS", []string{"--config", good, "--tls-client-ca-file", "ca.pem"}, nil, "--tls-client-ca-file needs --tls-cert-file and --tls-key-file"},
		{"zero max wait", []string{"--config", good, "--max-wait", "0"}, nil, "--max-wait must be above 0, got 0 (the default is 5s)"},
		{"zero store timeout", []string{"--config", good}, map[string]string{"FLEETRATE_STORE_TIMEOUT": "0s"}, "--store-timeout must be above 0, got 0 (the default is 15ms)"},
		{"empty prefix", []string{"--config", good, "--prefix", ""}, nil, `prefix must not be empty (the default is "fleetrate:")`},
		{"log format", []string{"--config", good, "--log-format", "xml"}, nil, "log-format must be text or json"},
		{"nothing to serve", []string{"--config", good, "--http-addr", "off", "--grpc-addr", "off"}, nil, "nothing to serve"},
		{"missing token file", []string{"--config", good, "--auth-token-file", "/nonexistent/tokens"}, nil, "auth token file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string { return tt.env[k] }
			cmd := serveCommand(getenv)
			if err := cmd.ParseFlags(tt.args); err != nil {
				t.Fatal(err)
			}
			_, err := resolveSettings(cmd.Flags(), getenv)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestServeRedisURLs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url, kind, err string
	}{
		{"redis://user:pw@127.0.0.1:6379/2", "*redis.Client", ""},
		{"rediss://127.0.0.1:6380", "*redis.Client", ""},
		{"unix:///run/redis.sock", "*redis.Client", ""},
		{"redis+sentinel://s1:26379?master_name=mymaster&addr=s2:26379", "*redis.Client", ""},
		{"redis+cluster://n1:6379?addr=n2:6379&addr=n3:6379", "*redis.ClusterClient", ""},
		{"rediss+cluster://user:pw@n1:6379", "*redis.ClusterClient", ""},
		{"redis+sentinel://s1:26379", "", "needs ?master_name="},
		{"http://127.0.0.1:6379", "", "scheme must be"},
		{"redis+ring://a:1", "", "unknown mode"},
		{"redis://127.0.0.1:6379?bogus=1", "", "unexpected option"},
		{"redis://user:hunter2@127.0.0.1:6379?bogus=1", "", "xxxxx"},
	}
	for _, tt := range tests {
		c, name, err := newServeRedisClient(tt.url)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) || strings.Contains(err.Error(), "hunter2") {
				t.Errorf("%s: err = %v, want %q without the password", tt.url, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.url, err)
			continue
		}
		if got := typeName(c); got != tt.kind {
			t.Errorf("%s: client %s, want %s", tt.url, got, tt.kind)
		}
		if strings.Contains(name, "pw@") {
			t.Errorf("%s: logged name %q shows the password", tt.url, name)
		}
		c.Close()
	}
}

func typeName(v any) string { return fmt.Sprintf("%T", v) }

func metadataCtx(token string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
}

// serveLog collects the service's log lines, safely across goroutines.
type serveLog struct {
	logbuf.Buffer
}

// field returns the named field of the first JSON log line with msg.
func (l *serveLog) field(msg, name string) (any, bool) {
	sc := bufio.NewScanner(strings.NewReader(l.String()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == msg {
			v, ok := m[name]
			return v, ok
		}
	}
	return nil, false
}

// startServe runs "fleetrate serve" through run, as main does, and waits
// for its startup line. It returns the HTTP and gRPC addresses, the log
// and a stop function that cancels the context (as SIGTERM does) and
// returns run's error.
func startServe(t *testing.T, args ...string) (string, string, *serveLog, func() error) {
	t.Helper()
	return startServeEnv(t, os.Getenv, args...)
}

// startServeEnv is startServe with the environment read from getenv.
func startServeEnv(t *testing.T, getenv func(string) string, args ...string) (string, string, *serveLog, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &serveLog{}
	done := make(chan error, 1)
	// The store timeout is 1 s unless a test sets one: the default (15 ms,
	// Envoy's 20 ms less the way there) is for production, not for the race
	// detector on a loaded machine. serve_safety_test.go runs on defaults.
	// The concurrency limit is off for the same reason (a burst of
	// decisions queues longer than its 5 ms target under -race), unless a
	// test sets --latency-target (serve_overload_test.go).
	args = append([]string{"serve", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--log-format", "json", "--log-level", "info", "--store-timeout", "1s", "--latency-target", "0"}, args...)
	go func() { done <- run(ctx, args, getenv, io.Discard, logs) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if h, ok := logs.field("fleetrate serving", "http"); ok {
			g, _ := logs.field("fleetrate serving", "grpc")
			var once sync.Once
			var err error
			stop := func() error {
				once.Do(func() {
					cancel()
					select {
					case err = <-done:
					case <-time.After(20 * time.Second):
						err = errors.New("serve did not stop")
					}
				})
				return err
			}
			t.Cleanup(func() { stop() })
			return h.(string), g.(string), logs, stop
		}
		select {
		case err := <-done:
			cancel()
			t.Fatalf("serve exited early: %v\n%s", err, logs)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("no startup line in 10s:\n%s", logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func servePost(t *testing.T, client *http.Client, url, body string) (int, map[string]any) {
	t.Helper()
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp.StatusCode, m
}

// TestServeEndToEnd runs the command on the memory store, uses both
// protocols, reloads on SIGHUP, and stops cleanly on cancel.
func TestServeEndToEnd(t *testing.T) {
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
	httpAddr, grpcAddr, logs, stop := startServe(t, "--config", path, "--reload-interval", "0")
	if v, _ := logs.field("fleetrate serving", "store"); v != "memory" {
		t.Errorf("startup line store = %v, want memory", v)
	}
	if v, _ := logs.field("fleetrate serving", "buckets"); v != float64(1) {
		t.Errorf("startup line buckets = %v, want 1", v)
	}
	base := "http://" + httpAddr
	code, m := servePost(t, http.DefaultClient, base+"/v1/wait", `{"bucket":"booking_com/availability","n":40}`)
	if code != 200 || m["allowed"] != true {
		t.Fatalf("/v1/wait: %d %v", code, m)
	}
	code, m = servePost(t, http.DefaultClient, base+"/v1/wait", `{"bucket":"booking_com/availability","n":20}`)
	if w, _ := m["wait_ms"].(float64); code != 200 || m["allowed"] != true || w <= 500 || w > 1000 {
		t.Errorf("/v1/wait after the burst: %d %v, want a wait of about 1000ms", code, m)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlspb.NewRateLimitServiceClient(conn)
	req := &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "1.2.3.4"}}}}}
	resp, err := rls.ShouldRateLimit(context.Background(), req)
	if err != nil || resp.OverallCode != rlspb.RateLimitResponse_OK || len(resp.ResponseHeadersToAdd) != 2 {
		t.Fatalf("ShouldRateLimit: %v, %v (want OK with headers from the file's response_headers)", resp, err)
	}

	// SIGHUP reloads: the limit drops to 1/s for a new address.
	if err := os.WriteFile(path, []byte(strings.Replace(serveTestConfig, "requests_per_unit: 2}", "requests_per_unit: 1}", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err = rls.ShouldRateLimit(context.Background(), req)
		if err == nil && resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SIGHUP did not reload: %v %v\n%s", resp, err, logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatalf("run returned %v after cancel", err)
	}
	if !strings.Contains(logs.String(), `"msg":"stopped"`) {
		t.Errorf("no stop line:\n%s", logs)
	}
}

func TestServeOverRedis(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
	httpAddr, _, logs, stop := startServe(t, "--config", path, "--redis", rs.URL(), "--prefix", "svc:")
	if v, _ := logs.field("fleetrate serving", "store"); v != rs.URL() {
		t.Errorf("startup line store = %v, want %s", v, rs.URL())
	}
	base := "http://" + httpAddr
	if code, m := servePost(t, http.DefaultClient, base+"/v1/take", `{"bucket":"booking_com/availability","n":40}`); code != 200 || m["allowed"] != true {
		t.Fatalf("take over Redis: %d %v", code, m)
	}
	n, err := rs.Client().Exists(context.Background(), "svc:{booking_com}/availability").Result()
	if err != nil || n != 1 {
		t.Errorf("key svc:{booking_com}/availability in Redis: %d, %v", n, err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestServeTLS serves HTTPS and gRPC over TLS with a self-signed
// certificate, and refuses plain connections.
func TestServeTLS(t *testing.T) {
	t.Parallel()
	certFile, keyFile, pool := selfSigned(t)
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
	tokens := serveWriteFile(t, "tokens", "tls-token\n")
	httpAddr, grpcAddr, _, stop := startServe(t, "--config", path, "--tls-cert-file", certFile, "--tls-key-file", keyFile, "--auth-token-file", tokens)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := client.Get("https://" + httpAddr + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("https /healthz: %v %v", resp, err)
	}
	resp.Body.Close()
	if resp, err := http.Get("http://" + httpAddr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP was served on the TLS port")
		}
	}
	req, _ := http.NewRequest(http.MethodPost, "https://"+httpAddr+"/v1/take", strings.NewReader(`{"bucket":"booking_com"}`))
	req.Header.Set("Authorization", "Bearer tls-token")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest { // booking_com alone is not configured
		t.Errorf("https take with token: %d, want 400 (unknown bucket) past auth", resp.StatusCode)
	}
	shouldRateLimitOverTLS(t, metadataCtx("tls-token"), grpcAddr, pool)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "fleetrate test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile = serveWriteFile(t, "cert.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	keyFile = serveWriteFile(t, "key.pem", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})))
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestServeStoreOptions: behind Sentinel the service's buckets start empty
// on a new master; nowhere else.
func TestServeStoreOptions(t *testing.T) {
	for url, want := range map[string]bool{
		"redis+sentinel://s1:26379?master_name=m":  true,
		"rediss+sentinel://s1:26379?master_name=m": true,
		"redis://127.0.0.1:6379":                   false,
		"redis+cluster://n1:6379":                  false,
		"unix:///run/redis.sock":                   false,
	} {
		o := serveStoreOptions(url, true, time.Second)
		if o.EmptyAfterFailover != want || o.Timeout != time.Second || !o.Batch || o.Unbatched {
			t.Errorf("%s: %+v, want EmptyAfterFailover %v, timeout 1s, batched", url, o, want)
		}
	}
}

// TestServeTLSForGRPCOnly: with --tls-http=false (what
// envoyproxy/ratelimit's GRPC_SERVER_USE_TLS maps to) gRPC is served over
// TLS and HTTP stays plain, so the deployments' /healthcheck probes over
// plain HTTP keep working.
func TestServeTLSForGRPCOnly(t *testing.T) {
	t.Parallel()
	certFile, keyFile, pool := selfSigned(t)
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
	httpAddr, grpcAddr, _, stop := startServe(t, "--config", path, "--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-http=false")
	resp, err := http.Get("http://" + httpAddr + "/healthcheck")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("plain /healthcheck: %v %v", resp, err)
	}
	resp.Body.Close()
	shouldRateLimitOverTLS(t, context.Background(), grpcAddr, pool)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestServeLogsFailedHandshakes: 60 connections that fail the TLS
// handshake on each port (a client speaking plain text to a TLS port)
// write a few structured lines, rate-limited, on both ports: gRPC's
// failures used to go unlogged, HTTP's wrote one unstructured line each.
func TestServeLogsFailedHandshakes(t *testing.T) {
	t.Parallel()
	certFile, keyFile, _ := selfSigned(t)
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
	httpAddr, grpcAddr, logs, stop := startServe(t, "--config", path, "--tls-cert-file", certFile, "--tls-key-file", keyFile)
	const conns = 60
	for _, addr := range []string{httpAddr, grpcAddr} {
		// Probers first: connections closed before any handshake (a load
		// balancer's TCP check) are not logged at all.
		for range 3 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
		}
		for range conns {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
			_, _ = io.Copy(io.Discard, c) // until the server closes it
			c.Close()
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	lines := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			t.Errorf("unstructured log line: %s", sc.Text())
			continue
		}
		if msg, _ := m["msg"].(string); strings.Contains(msg, "TLS handshake error") {
			if strings.HasSuffix(msg, ": EOF") {
				t.Errorf("a prober's closed connection was logged: %s", sc.Text())
			}
			src, _ := m["source"].(string)
			lines[src]++
			if m["level"] != "WARN" {
				t.Errorf("handshake line at level %v, want WARN: %s", m["level"], sc.Text())
			}
		}
	}
	t.Logf("handshake lines by source: %v", lines)
	for _, src := range []string{"http", "grpc"} {
		// The connections take well under a second each on an idle
		// machine; however slow, each second writes one line at most.
		if n := lines[src]; n < 1 || n > conns/2 {
			t.Errorf("%d handshake lines from %s for %d failed handshakes, want at least 1 and far fewer than %d", n, src, conns, conns)
		}
	}
}

// TestServeRefusesRedisCredentials: a Redis that answers but refuses the
// URL's password or database fails the start, naming what to fix, where a
// Redis that does not answer yet lets the service start.
func TestServeRefusesRedisCredentials(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t, "--requirepass", "goodpw")
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
	for name, url := range map[string]string{
		"no password":    "redis://" + rs.Addr() + "/0",
		"wrong password": "redis://:badpw@" + rs.Addr() + "/0",
		"no such db":     "redis://:goodpw@" + rs.Addr() + "/99",
	} {
		args := []string{"serve", "--config", path, "--redis", url, "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"}
		// Bounded: should Redis's answer ever be late, serve would start
		// and run until this context ends, not hang the package.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := run(ctx, args, func(string) string { return "" }, io.Discard, io.Discard)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "refused the connection") || !strings.Contains(err.Error(), "password and database") {
			t.Errorf("%s: %v, want a refusal naming the URL's password and database", name, err)
		}
		if err != nil && strings.Contains(err.Error(), "badpw") {
			t.Errorf("%s: the error shows the password: %v", name, err)
		}
	}
}

// TestServeWarnsWhenOpen: a service without tokens on an address other
// hosts can reach warns at start, once per such port; on loopback, or
// with tokens, it does not.
func TestServeWarnsWhenOpen(t *testing.T) {
	t.Parallel()
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
	tokens := serveWriteFile(t, "tokens", "secret\n")
	cert, key, _ := selfSigned(t)
	mtls := []string{"--tls-cert-file", cert, "--tls-key-file", key, "--tls-client-ca-file", cert}
	const warning = `"msg":"access: no tokens: `
	for _, tc := range []struct {
		name  string
		args  []string
		warns int
	}{
		{"open, no tokens", []string{"--http-addr", "0.0.0.0:0", "--grpc-addr", "off"}, 1},
		{"both open, no tokens", []string{"--http-addr", "0.0.0.0:0", "--grpc-addr", "0.0.0.0:0"}, 2},
		{"both open, client certificates", append([]string{"--http-addr", "0.0.0.0:0", "--grpc-addr", "0.0.0.0:0"}, mtls...), 0},
		{"both open, client certificates on gRPC only", append([]string{"--http-addr", "0.0.0.0:0", "--grpc-addr", "0.0.0.0:0", "--tls-http=false"}, mtls...), 1},
		{"loopback, no tokens", nil, 0},
		{"open, tokens", []string{"--http-addr", "0.0.0.0:0", "--grpc-addr", "off", "--auth-token-file", tokens}, 0},
	} {
		_, _, logs, stop := startServe(t, append([]string{"--config", path}, tc.args...)...)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(logs.String(), warning); n != tc.warns {
			t.Errorf("%s: %d warnings, want %d:\n%s", tc.name, n, tc.warns, logs)
		}
	}
}

// shouldRateLimitOverTLS asks the RLS service at addr, over TLS trusting
// pool, for one hit of the edge domain, and fails the test unless it is
// answered OK.
func shouldRateLimitOverTLS(t *testing.T, ctx context.Context, addr string, pool *x509.CertPool) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r, err := rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "edge",
		Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
	if err != nil || r.OverallCode != rlspb.RateLimitResponse_OK {
		t.Errorf("gRPC over TLS: %v %v", r, err)
	}
}
