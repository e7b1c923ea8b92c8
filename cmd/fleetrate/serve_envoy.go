package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
)

// envoyEnv translates envoyproxy/ratelimit's environment variables into
// the values of fleetrate's serve flags, so that its deployments
// (Kubernetes manifests, Helm values) run unchanged with fleetrate's image.
// They rank below the flags and FLEETRATE_* variables, and above the
// file's server section. Variables with no equivalent are returned in
// notes, each with the reason, for the log; a setting fleetrate cannot
// honour safely is an error. docs/OPERATIONS.md has the table.
func envoyEnv(getenv func(string) string) (vals map[string]string, notes []string, err error) {
	vals = map[string]string{}
	set := func(name string) bool { return getenv(name) != "" }
	boolean := func(name string) (bool, error) {
		v := getenv(name)
		if v == "" {
			return false, nil
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, fmt.Errorf("%s: want true or false, got %q", name, v)
		}
		return b, nil
	}
	var errs []error
	flagBool := func(env, flag string) {
		if !set(env) {
			return
		}
		b, err := boolean(env)
		if err != nil {
			errs = append(errs, err)
			return
		}
		vals[flag] = strconv.FormatBool(b)
	}

	// Configuration files: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
	if set("RUNTIME_ROOT") || set("RUNTIME_SUBDIRECTORY") {
		root := getenv("RUNTIME_ROOT")
		if root == "" {
			root = "/srv/runtime_data/current"
		}
		app := getenv("RUNTIME_APPDIRECTORY")
		if app == "" {
			app = "config"
		}
		vals["config"] = filepath.Join(root, getenv("RUNTIME_SUBDIRECTORY"), app)
	}
	flagBool("MERGE_DOMAIN_CONFIG", "merge-domains")
	flagBool("RUNTIME_IGNOREDOTFILES", "ignore-dot-files")
	if v := getenv("CONFIG_TYPE"); v != "" && !strings.EqualFold(v, "FILE") {
		errs = append(errs, fmt.Errorf("CONFIG_TYPE=%s: fleetrate reads configuration from files only (FILE)", v))
	}

	// Listeners.
	if set("HOST") || set("PORT") {
		vals["http-addr"] = hostPort(getenv("HOST"), getenv("PORT"), "8080")
	}
	if set("GRPC_HOST") || set("GRPC_PORT") {
		vals["grpc-addr"] = hostPort(getenv("GRPC_HOST"), getenv("GRPC_PORT"), "8081")
	}
	if use, _ := boolean("GRPC_SERVER_USE_TLS"); use {
		vals["tls-cert-file"], vals["tls-key-file"] = getenv("GRPC_SERVER_TLS_CERT"), getenv("GRPC_SERVER_TLS_KEY")
		if v := getenv("GRPC_CLIENT_TLS_CACERT"); v != "" {
			vals["tls-client-ca-file"] = v
		}
	}
	if use, err := boolean("USE_PROMETHEUS"); err != nil {
		errs = append(errs, err)
	} else if use {
		addr := getenv("PROMETHEUS_ADDR")
		if addr == "" {
			addr = ":9090"
		}
		vals["metrics-addr"] = addr
		if p := getenv("PROMETHEUS_PATH"); p != "" {
			vals["metrics-path"] = p
		}
	}

	// Logs.
	if v := getenv("LOG_LEVEL"); v != "" {
		switch l := strings.ToLower(v); l {
		case "trace", "debug":
			vals["log-level"] = "debug"
		case "info":
			vals["log-level"] = "info"
		case "warn", "warning":
			vals["log-level"] = "warn"
		case "error", "fatal", "panic":
			vals["log-level"] = "error"
		default:
			errs = append(errs, fmt.Errorf("LOG_LEVEL: want debug, info, warn or error, got %q", v))
		}
	}
	if v := getenv("LOG_FORMAT"); v != "" {
		vals["log-format"] = strings.ToLower(v)
	}

	// Decisions.
	flagBool("SHADOW_MODE", "shadow-mode")
	flagBool("QUOTA_MODE", "quota-mode")
	flagBool("RESPONSE_DYNAMIC_METADATA", "response-dynamic-metadata")
	flagBool("LIMIT_RESPONSE_HEADERS_ENABLED", "response-headers")
	for _, name := range []string{"LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER"} {
		if set(name) {
			notes = append(notes, name+": ignored; fleetrate sends the current IETF draft's RateLimit-Policy and RateLimit fields, whose names are fixed")
		}
	}
	if v := getenv("CACHE_KEY_PREFIX"); v != "" {
		vals["prefix"] = v
	}

	// The store.
	if v := getenv("BACKEND_TYPE"); v != "" && !strings.EqualFold(v, "redis") {
		errs = append(errs, fmt.Errorf("BACKEND_TYPE=%s: fleetrate's stores are Redis and its own memory (without REDIS_URL); memcache is not supported", v))
	}
	if set("REDIS_URL") {
		u, err := envoyRedisURL(getenv)
		if err != nil {
			errs = append(errs, err)
		} else {
			vals["redis"] = u
		}
	}
	if v := getenv("LOCAL_CACHE_SIZE_IN_BYTES"); v != "" {
		vals["local-cache-bytes"] = v
	}
	if v := getenv("NEAR_LIMIT_RATIO"); v != "" {
		vals["near-limit-ratio"] = v
	}
	if v := getenv("REDIS_TIMEOUT"); v != "" {
		vals["store-timeout"] = v
	}
	if per, _ := boolean("REDIS_PERSECOND"); per {
		notes = append(notes, "REDIS_PERSECOND: ignored; per-second limits use the same store as the others (REDIS_URL)")
	}
	for _, n := range []struct{ name, why string }{
		{"REDIS_PIPELINE_WINDOW", "fleetrate batches concurrent Redis calls itself (--redis-batch, on by default)"},
		{"REDIS_PIPELINE_LIMIT", "fleetrate batches concurrent Redis calls itself (--redis-batch, on by default)"},
		{"REDIS_TLS_CLIENT_CERT", "Redis client certificates are not supported; REDIS_TLS uses the system's CAs"},
		{"REDIS_TLS_CACERT", "Redis client certificates are not supported; REDIS_TLS uses the system's CAs"},
		{"EXPIRATION_JITTER_MAX_SECONDS", "token buckets expire when full, not at window ends, so keys do not expire together"},
		{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "fleetrate always behaves so: a denied request spends nothing"},
		{"USE_STATSD", "fleetrate exports Prometheus metrics on /metrics, not statsd"},
		{"USE_DOG_STATSD", "fleetrate exports Prometheus metrics on /metrics, not statsd"},
		{"TRACING_ENABLED", "tracing is not supported"},
		{"GRPC_UDS", "a gRPC Unix socket is not supported; use GRPC_PORT"},
	} {
		if v := getenv(n.name); v != "" && !strings.EqualFold(v, "false") && v != "0" {
			notes = append(notes, n.name+": ignored; "+n.why)
		}
	}
	return vals, notes, errors.Join(errs...)
}

func hostPort(host, port, defPort string) string {
	if port == "" {
		port = defPort
	}
	return net.JoinHostPort(host, port)
}

// envoyRedisURL builds a fleetrate Redis URL from REDIS_SOCKET_TYPE (tcp or
// unix), REDIS_TYPE (single, sentinel, cluster), REDIS_URL (host:port, a
// socket path, "master,sentinel1,..." or "node1,node2,..."), REDIS_AUTH
// ("password" or "user:password"), REDIS_SENTINEL_AUTH, REDIS_TLS and
// REDIS_POOL_SIZE.
func envoyRedisURL(getenv func(string) string) (string, error) {
	raw := getenv("REDIS_URL")
	tls, _ := strconv.ParseBool(getenv("REDIS_TLS"))
	scheme := "redis"
	if tls {
		scheme = "rediss"
	}
	q := url.Values{}
	if v := getenv("REDIS_POOL_SIZE"); v != "" {
		if n, err := strconv.Atoi(v); err != nil || n <= 0 {
			return "", fmt.Errorf("REDIS_POOL_SIZE: want a positive number, got %q", v)
		}
		q.Set("pool_size", v)
	}
	user := func(auth string) *url.Userinfo {
		if auth == "" {
			return nil
		}
		if name, pass, ok := strings.Cut(auth, ":"); ok {
			return url.UserPassword(name, pass)
		}
		return url.UserPassword("", auth)
	}
	u := &url.URL{Scheme: scheme}
	socket := strings.ToLower(getenv("REDIS_SOCKET_TYPE"))
	if socket == "" {
		socket = "unix" // envoyproxy/ratelimit's default
	}
	parts := strings.Split(raw, ",")
	switch typ := strings.ToLower(getenv("REDIS_TYPE")); typ {
	case "", "single":
		switch socket {
		case "unix":
			u.Scheme, u.Path = "unix", raw
		case "tcp":
			u.Host = raw
		default:
			return "", fmt.Errorf("REDIS_SOCKET_TYPE: want tcp or unix, got %q", socket)
		}
		u.User = user(getenv("REDIS_AUTH"))
	case "sentinel":
		if len(parts) < 2 {
			return "", errors.New("REDIS_URL: with REDIS_TYPE=sentinel, want a master name and sentinels: <master>,<sentinel1>,<sentinel2>")
		}
		u.Scheme += "+sentinel"
		u.Host = parts[1]
		for _, a := range parts[2:] {
			q.Add("addr", a)
		}
		q.Set("master_name", parts[0])
		u.User = user(getenv("REDIS_SENTINEL_AUTH"))
		if auth := getenv("REDIS_AUTH"); auth != "" {
			name, pass, ok := strings.Cut(auth, ":")
			if !ok {
				name, pass = "", auth
			}
			if name != "" {
				q.Set("username", name)
			}
			q.Set("password", pass)
		}
	case "cluster":
		u.Scheme += "+cluster"
		u.Host = parts[0]
		for _, a := range parts[1:] {
			q.Add("addr", a)
		}
		u.User = user(getenv("REDIS_AUTH"))
	default:
		return "", fmt.Errorf("REDIS_TYPE: want single, sentinel or cluster, got %q", typ)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}
