package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetrate/fleetrate"
)

func envFrom(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// TestEnvoyEnv covers envoyproxy/ratelimit's environment variables that
// its manifests set (the README's settings): each maps onto the fleetrate
// setting docs/OPERATIONS.md names.
func TestEnvoyEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		want map[string]string
	}{
		{"runtime layout", map[string]string{"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true", "MERGE_DOMAIN_CONFIG": "true"},
			map[string]string{"config": "/data/ratelimit/config", "ignore-dot-files": "true", "merge-domains": "true"}},
		{"runtime app directory", map[string]string{"RUNTIME_ROOT": "/data", "RUNTIME_APPDIRECTORY": "limits"},
			map[string]string{"config": "/data/limits"}},
		{"ports", map[string]string{"PORT": "8080", "GRPC_PORT": "8081", "GRPC_HOST": "127.0.0.1"},
			map[string]string{"http-addr": ":8080", "grpc-addr": "127.0.0.1:8081"}},
		{"logs", map[string]string{"LOG_LEVEL": "WARN", "LOG_FORMAT": "json"},
			map[string]string{"log-level": "warn", "log-format": "json"}},
		{"modes and headers", map[string]string{"SHADOW_MODE": "true", "QUOTA_MODE": "true", "RESPONSE_DYNAMIC_METADATA": "true", "LIMIT_RESPONSE_HEADERS_ENABLED": "true"},
			map[string]string{"shadow-mode": "true", "quota-mode": "true", "response-dynamic-metadata": "true", "limit-headers": "true"}},
		{"header names", map[string]string{"LIMIT_LIMIT_HEADER": "A-Limit", "LIMIT_REMAINING_HEADER": "A-Remaining", "LIMIT_RESET_HEADER": "A-Reset"},
			map[string]string{"limit-header-limit": "A-Limit", "limit-header-remaining": "A-Remaining", "limit-header-reset": "A-Reset"}},
		{"grpc socket and ageing", map[string]string{"GRPC_UDS": "/run/rl.sock", "GRPC_PORT": "8081", "GRPC_MAX_CONNECTION_AGE": "30m", "GRPC_MAX_CONNECTION_AGE_GRACE": "10s"},
			map[string]string{"grpc-addr": "unix:/run/rl.sock", "grpc-max-connection-age": "30m", "grpc-max-connection-age-grace": "10s"}},
		{"redis tls files", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6380", "REDIS_TLS": "true", "REDIS_TLS_CACERT": "ca.pem", "REDIS_TLS_CLIENT_CERT": "c.pem", "REDIS_TLS_CLIENT_KEY": "k.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"},
			map[string]string{"redis": "rediss://r:6380", "redis-tls-ca-file": "ca.pem", "redis-tls-cert-file": "c.pem", "redis-tls-key-file": "k.pem", "redis-tls-skip-hostname-verification": "true"}},
		{"grpc mtls with a pinned name", map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c.pem", "GRPC_SERVER_TLS_KEY": "k.pem", "GRPC_CLIENT_TLS_CACERT": "ca.pem", "GRPC_CLIENT_TLS_SAN": "envoy.mesh"},
			map[string]string{"tls-cert-file": "c.pem", "tls-key-file": "k.pem", "tls-client-ca-file": "ca.pem", "tls-client-san": "envoy.mesh", "tls-http": "false"}},
		{"prometheus", map[string]string{"USE_PROMETHEUS": "true"}, map[string]string{"metrics-addr": ":9090"}},
		{"redis tcp", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis.svc:6379", "REDIS_AUTH": "s3cret", "REDIS_POOL_SIZE": "20", "REDIS_TIMEOUT": "2s"},
			map[string]string{"redis": "redis://:s3cret@redis.svc:6379?pool_size=20", "store-timeout": "2s"}},
		{"redis tls with user", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6380", "REDIS_TLS": "true", "REDIS_AUTH": "app:pw"},
			map[string]string{"redis": "rediss://app:pw@r:6380"}},
		{"redis unix", map[string]string{"REDIS_URL": "/var/run/nutcracker/ratelimit.sock"},
			map[string]string{"redis": "unix:///var/run/nutcracker/ratelimit.sock"}},
		{"redis sentinel", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379,s2:26379", "REDIS_AUTH": "pw"},
			map[string]string{"redis": "redis+sentinel://s1:26379?addr=s2%3A26379&master_name=mymaster&password=pw"}},
		{"redis cluster", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "cluster", "REDIS_URL": "n1:6379,n2:6379"},
			map[string]string{"redis": "redis+cluster://n1:6379?addr=n2%3A6379"}},
		{"log level alias", map[string]string{"LOG_LEVEL": "Fatal"}, map[string]string{"log-level": "error"}},
		{"prometheus address and path", map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":9102", "PROMETHEUS_PATH": "/m"},
			map[string]string{"metrics-addr": ":9102", "metrics-path": "/m"}},
		{"grpc tls", map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c.pem", "GRPC_SERVER_TLS_KEY": "k.pem", "GRPC_CLIENT_TLS_CACERT": "ca.pem"},
			map[string]string{"tls-cert-file": "c.pem", "tls-key-file": "k.pem", "tls-client-ca-file": "ca.pem", "tls-http": "false"}},
		{"redis sentinel with both auths", map[string]string{"REDIS_TYPE": "sentinel", "REDIS_URL": "m,s1:26379", "REDIS_SENTINEL_AUTH": "sp", "REDIS_AUTH": "app:pw"},
			map[string]string{"redis": "redis+sentinel://:sp@s1:26379?master_name=m&password=pw&username=app"}},
		{"redis cluster over tls with auth", map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": "n1:6379", "REDIS_TLS": "true", "REDIS_AUTH": "pw"},
			map[string]string{"redis": "rediss+cluster://:pw@n1:6379"}},
		{"cache prefix", map[string]string{"CACHE_KEY_PREFIX": "rl:"}, map[string]string{"prefix": "rl:"}},
		{"local cache and near limit", map[string]string{"LOCAL_CACHE_SIZE_IN_BYTES": "1048576", "NEAR_LIMIT_RATIO": "0.9"},
			map[string]string{"local-cache-bytes": "1048576", "near-limit-ratio": "0.9"}},
		{"health reports redis", map[string]string{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true"},
			map[string]string{"health-checks-store": "true"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, _, err := envoyEnv(envFrom(tt.env))
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// TestEnvoyEnvRefusedAndIgnored checks that a setting fleetrate cannot
// honour stops the start with a reason, and that one with no equivalent is
// reported with its reason.
func TestEnvoyEnvRefusedAndIgnored(t *testing.T) {
	t.Parallel()
	for _, env := range []map[string]string{
		{"BACKEND_TYPE": "memcache"},
		{"CONFIG_TYPE": "GRPC_XDS"},
		{"REDIS_URL": "x", "REDIS_TYPE": "sentinel"},
		{"REDIS_URL": "x", "REDIS_SOCKET_TYPE": "udp"},
		{"LOG_LEVEL": "loud"},
	} {
		if _, _, err := envoyEnv(envFrom(env)); err == nil {
			t.Errorf("%v: no error", env)
		}
	}
	// The security settings fleetrate cannot honour stop the start, each
	// named.
	for name, env := range map[string]map[string]string{
		"GRPC_CLIENT_TLS_CACERT": {"GRPC_CLIENT_TLS_CACERT": "ca.pem"},
		"GRPC_CLIENT_TLS_SAN":    {"GRPC_SERVER_USE_TLS": "false", "GRPC_CLIENT_TLS_SAN": "envoy"},
		"GRPC_SERVER_TLS_KEY":    {"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c.pem"},
		"GRPC_SERVER_USE_TLS":    {"GRPC_SERVER_USE_TLS": "yes please"},
	} {
		if _, _, err := envoyEnv(envFrom(env)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%v: %v, want an error naming %s", env, err, name)
		}
	}
	if _, notes, err := envoyEnv(envFrom(map[string]string{"GRPC_SERVER_TLS_CERT": "c.pem", "USE_STATSD": "false"})); err != nil || len(notes) != 1 || !strings.Contains(notes[0], "plain text") {
		t.Errorf("a certificate without GRPC_SERVER_USE_TLS: %q, %v; want a note that gRPC is plain text", notes, err)
	}
	_, notes, err := envoyEnv(envFrom(map[string]string{"USE_STATSD": "true", "LIMIT_LIMIT_HEADER": "X-Limit", "USE_DOG_STATSD": "false", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "false"}))
	if err != nil || len(notes) != 1 || !strings.Contains(strings.Join(notes, "\n"), "USE_STATSD (set): ignored; fleetrate sends no statsd") {
		t.Errorf("notes %q, %v; want USE_STATSD only, with the reason", notes, err)
	}
}

// TestServeEnvoyDeployment starts the service as envoyproxy/ratelimit's
// manifests do: no flags, its variables, a ConfigMap-like directory with
// two files giving one domain.
func TestServeEnvoyDeployment(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	cfgDir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(filepath.Join(cfgDir, "..2030_01_01"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{
		"a.yaml":              "domain: rl\ndescriptors:\n  - key: k1\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"b.yaml":              "domain: rl\ndescriptors:\n  - key: k2\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
		"..2030_01_01/a.yaml": "domain: rl\n",
	} {
		if err := os.WriteFile(filepath.Join(cfgDir, name), []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env := map[string]string{
		"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true",
		"MERGE_DOMAIN_CONFIG": "true", "USE_STATSD": "false", "LOG_LEVEL": "debug",
		"HOST": "127.0.0.1", "PORT": "0", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0",
	}
	cmd := serveCommand(envFrom(env))
	if err := cmd.ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	st, err := resolveSettings(cmd.Flags(), envFrom(env))
	if err != nil {
		t.Fatal(err)
	}
	if domains, rules, _ := st.cfg.Summary(); len(domains) != 1 || rules != 2 || st.httpAddr != "127.0.0.1:0" || st.logLevel != "debug" {
		t.Errorf("resolved: domains %v, rules %d, http %q, log level %q; want [rl], 2, 127.0.0.1:0, debug", domains, rules, st.httpAddr, st.logLevel)
	}
	// Without the merge, the second file is rejected with both names.
	env["MERGE_DOMAIN_CONFIG"] = "false"
	if _, err := resolveSettings(cmd.Flags(), envFrom(env)); err == nil || !strings.Contains(err.Error(), "b.yaml:1: domain: duplicate domain \"rl\"") {
		t.Errorf("without MERGE_DOMAIN_CONFIG: %v", err)
	}
}

func TestErrorLineHasOnePrefix(t *testing.T) {
	t.Parallel()
	if got := errorLine(fmt.Errorf("%w: config: x", fleetrate.ErrInvalid)); got != "fleetrate: invalid: config: x" {
		t.Errorf("errorLine = %q", got)
	}
	if got := errorLine(fmt.Errorf("boom")); got != "fleetrate: boom" {
		t.Errorf("errorLine = %q", got)
	}
}
