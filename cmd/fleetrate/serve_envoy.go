package main

import (
	"cmp"
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
	e := &envoyReader{getenv: getenv, vals: map[string]string{}}
	e.files()
	e.listeners()
	e.logs()
	e.decisions()
	e.store()
	e.grpcConn()
	e.observe()
	return e.vals, e.notes, errors.Join(e.errs...)
}

// envoyReader collects what envoyEnv makes of the variables, one group of
// them per method: the flag values, a note for each variable it ignores and
// an error for each it refuses.
type envoyReader struct {
	getenv func(string) string
	vals   map[string]string
	notes  []string
	errs   []error
}

func (e *envoyReader) set(name string) bool { return e.getenv(name) != "" }

// boolean reads a true-or-false variable; unset is false.
func (e *envoyReader) boolean(name string) (bool, error) {
	v := e.getenv(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s: want true or false, got %q", name, v)
	}
	return b, nil
}

// flagBool sets a boolean flag from the variable env when it is set.
func (e *envoyReader) flagBool(env, flag string) {
	if !e.set(env) {
		return
	}
	b, err := e.boolean(env)
	if err != nil {
		e.errs = append(e.errs, err)
		return
	}
	e.vals[flag] = strconv.FormatBool(b)
}

// copy sets flag to the variable env's value when it is set.
func (e *envoyReader) copy(env, flag string) {
	if v := e.getenv(env); v != "" {
		e.vals[flag] = v
	}
}

// files reads where the configuration files are
// (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY) and how they are
// read.
func (e *envoyReader) files() {
	if e.set("RUNTIME_ROOT") || e.set("RUNTIME_SUBDIRECTORY") {
		root := cmp.Or(e.getenv("RUNTIME_ROOT"), "/srv/runtime_data/current")
		app := cmp.Or(e.getenv("RUNTIME_APPDIRECTORY"), "config")
		e.vals["config"] = filepath.Join(root, e.getenv("RUNTIME_SUBDIRECTORY"), app)
	}
	e.flagBool("MERGE_DOMAIN_CONFIG", "merge-domains")
	e.flagBool("RUNTIME_IGNOREDOTFILES", "ignore-dot-files")
	if v := e.getenv("CONFIG_TYPE"); v != "" && !strings.EqualFold(v, "FILE") {
		e.errs = append(e.errs, fmt.Errorf("CONFIG_TYPE=%s: fleetrate reads configuration from files only (FILE)", v))
	}
}

// listeners reads the HTTP, gRPC (with its TLS) and Prometheus addresses.
func (e *envoyReader) listeners() {
	if e.set("HOST") || e.set("PORT") {
		e.vals["http-addr"] = hostPort(e.getenv("HOST"), e.getenv("PORT"), "8080")
	}
	if e.set("GRPC_HOST") || e.set("GRPC_PORT") {
		e.vals["grpc-addr"] = hostPort(e.getenv("GRPC_HOST"), e.getenv("GRPC_PORT"), "8081")
	}
	if use, _ := e.boolean("GRPC_SERVER_USE_TLS"); use {
		e.vals["tls-cert-file"], e.vals["tls-key-file"] = e.getenv("GRPC_SERVER_TLS_CERT"), e.getenv("GRPC_SERVER_TLS_KEY")
		e.copy("GRPC_CLIENT_TLS_CACERT", "tls-client-ca-file")
		// Its TLS covers gRPC only: its deployments probe /healthcheck
		// over plain HTTP.
		e.vals["tls-http"] = "false"
	}
	if use, err := e.boolean("USE_PROMETHEUS"); err != nil {
		e.errs = append(e.errs, err)
	} else if use {
		e.vals["metrics-addr"] = cmp.Or(e.getenv("PROMETHEUS_ADDR"), ":9090")
		e.copy("PROMETHEUS_PATH", "metrics-path")
	}
}

// envoyLogLevels maps envoyproxy/ratelimit's log levels (logrus's) onto
// fleetrate's.
var envoyLogLevels = map[string]string{
	"trace": "debug", "debug": "debug",
	"info": "info",
	"warn": "warn", "warning": "warn",
	"error": "error", "fatal": "error", "panic": "error",
}

// logs reads the log level and format.
func (e *envoyReader) logs() {
	if v := e.getenv("LOG_LEVEL"); v != "" {
		if l, ok := envoyLogLevels[strings.ToLower(v)]; ok {
			e.vals["log-level"] = l
		} else {
			e.errs = append(e.errs, fmt.Errorf("LOG_LEVEL: want debug, info, warn or error, got %q", v))
		}
	}
	if v := e.getenv("LOG_FORMAT"); v != "" {
		e.vals["log-format"] = strings.ToLower(v)
	}
}

// decisions reads the modes and response headers of a decision, and the
// prefix of its keys.
func (e *envoyReader) decisions() {
	e.flagBool("SHADOW_MODE", "shadow-mode")
	e.flagBool("QUOTA_MODE", "quota-mode")
	e.flagBool("RESPONSE_DYNAMIC_METADATA", "response-dynamic-metadata")
	e.flagBool("LIMIT_RESPONSE_HEADERS_ENABLED", "limit-headers")
	e.copy("CACHE_KEY_PREFIX", "prefix")
}

// envoyIgnored are the variables fleetrate has no equivalent for, each with
// the reason given in the note when one is on.
var envoyIgnored = []struct{ name, why string }{
	{"REDIS_PIPELINE_WINDOW", "fleetrate batches concurrent Redis calls itself (--redis-batch, on by default)"},
	{"REDIS_PIPELINE_LIMIT", "fleetrate batches concurrent Redis calls itself (--redis-batch, on by default)"},
	{"EXPIRATION_JITTER_MAX_SECONDS", "token buckets expire when full, not at window ends, so keys do not expire together"},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "fleetrate always behaves so: a denied request spends nothing"},
	{"USE_DOG_STATSD", "fleetrate exports Prometheus metrics on /metrics, not statsd"},
}

// store reads the store (Redis, or memory without REDIS_URL) and its
// settings, then notes the ignored variables that are on.
func (e *envoyReader) store() {
	if v := e.getenv("BACKEND_TYPE"); v != "" && !strings.EqualFold(v, "redis") {
		e.errs = append(e.errs, fmt.Errorf("BACKEND_TYPE=%s: fleetrate's stores are Redis and its own memory (without REDIS_URL); memcache is not supported", v))
	}
	if e.set("REDIS_URL") {
		if u, err := envoyRedisURL(e.getenv); err != nil {
			e.errs = append(e.errs, err)
		} else {
			e.vals["redis"] = u
		}
	}
	e.copy("LOCAL_CACHE_SIZE_IN_BYTES", "local-cache-bytes")
	e.copy("NEAR_LIMIT_RATIO", "near-limit-ratio")
	e.copy("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "health-checks-store")
	e.copy("REDIS_TIMEOUT", "store-timeout")
	for _, n := range envoyIgnored {
		if v := e.getenv(n.name); v != "" && !strings.EqualFold(v, "false") && v != "0" {
			e.notes = append(e.notes, n.name+": ignored; "+n.why)
		}
	}
}

func hostPort(host, port, defPort string) string {
	return net.JoinHostPort(host, cmp.Or(port, defPort))
}

// envoyRedisURL builds a fleetrate Redis URL from REDIS_SOCKET_TYPE (tcp or
// unix), REDIS_TYPE (single, sentinel, cluster), REDIS_URL (host:port, a
// socket path, "master,sentinel1,..." or "node1,node2,..."), REDIS_AUTH
// ("password" or "user:password"), REDIS_SENTINEL_AUTH, REDIS_TLS and
// REDIS_POOL_SIZE.
func envoyRedisURL(getenv func(string) string) (string, error) {
	u := &url.URL{Scheme: "redis"}
	if tls, _ := strconv.ParseBool(getenv("REDIS_TLS")); tls {
		u.Scheme = "rediss"
	}
	q := url.Values{}
	if v := getenv("REDIS_POOL_SIZE"); v != "" {
		if n, err := strconv.Atoi(v); err != nil || n <= 0 {
			return "", fmt.Errorf("REDIS_POOL_SIZE: want a positive number, got %q", v)
		}
		q.Set("pool_size", v)
	}
	raw := getenv("REDIS_URL")
	switch typ := strings.ToLower(getenv("REDIS_TYPE")); typ {
	case "", "single":
		socket := cmp.Or(strings.ToLower(getenv("REDIS_SOCKET_TYPE")), "unix") // envoyproxy/ratelimit's default
		switch socket {
		case "unix":
			u.Scheme, u.Path = "unix", raw
		case "tcp":
			u.Host = raw
		default:
			return "", fmt.Errorf("REDIS_SOCKET_TYPE: want tcp or unix, got %q", socket)
		}
		u.User = envoyUser(getenv("REDIS_AUTH"))
	case "sentinel":
		if err := envoySentinel(u, q, raw, getenv); err != nil {
			return "", err
		}
	case "cluster":
		nodes := strings.Split(raw, ",")
		u.Scheme += "+cluster"
		u.Host = nodes[0]
		for _, a := range nodes[1:] {
			q.Add("addr", a)
		}
		u.User = envoyUser(getenv("REDIS_AUTH"))
	default:
		return "", fmt.Errorf("REDIS_TYPE: want single, sentinel or cluster, got %q", typ)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// envoySentinel fills u and q for REDIS_TYPE=sentinel: raw is
// "master,sentinel1,sentinel2,...", REDIS_SENTINEL_AUTH goes in the URL's
// user and REDIS_AUTH, the master's, in the query.
func envoySentinel(u *url.URL, q url.Values, raw string, getenv func(string) string) error {
	parts := strings.Split(raw, ",")
	if len(parts) < 2 {
		return errors.New("REDIS_URL: with REDIS_TYPE=sentinel, want a master name and sentinels: <master>,<sentinel1>,<sentinel2>")
	}
	u.Scheme += "+sentinel"
	u.Host = parts[1]
	for _, a := range parts[2:] {
		q.Add("addr", a)
	}
	q.Set("master_name", parts[0])
	u.User = envoyUser(getenv("REDIS_SENTINEL_AUTH"))
	if auth := getenv("REDIS_AUTH"); auth != "" {
		name, pass := envoyAuth(auth)
		if name != "" {
			q.Set("username", name)
		}
		q.Set("password", pass)
	}
	return nil
}

// envoyAuth splits envoyproxy/ratelimit's "password" or "user:password".
func envoyAuth(auth string) (name, pass string) {
	if name, pass, ok := strings.Cut(auth, ":"); ok {
		return name, pass
	}
	return "", auth
}

// envoyUser is the URL user for auth, nil when auth is empty.
func envoyUser(auth string) *url.Userinfo {
	if auth == "" {
		return nil
	}
	return url.UserPassword(envoyAuth(auth))
}
