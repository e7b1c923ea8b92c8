package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/server"
	"github.com/spf13/pflag"
)

// envName is the environment variable of a flag: FLEETRATE_HTTP_ADDR.
func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// resolver picks each setting from the flag, the environment, the file
// and the default, in that order.
type resolver struct {
	fs     *pflag.FlagSet
	getenv func(string) string
	envoy  map[string]string // from envoyproxy/ratelimit's variables
	errs   []error
}

// source returns the raw value of a setting given by flag or environment.
func (r *resolver) source(name string) (string, bool) {
	if fl := r.fs.Lookup(name); fl != nil && fl.Changed {
		return fl.Value.String(), true
	}
	if v := r.getenv(envName(name)); v != "" {
		return v, true
	}
	if v, ok := r.envoy[name]; ok {
		return v, true
	}
	return "", false
}

func (r *resolver) fail(name, v string, err error) {
	r.errs = append(r.errs, fmt.Errorf("--%s / %s: invalid value %q: %v", name, envName(name), v, err))
}

// configLoad reads the config file or directory's load options.
func (r *resolver) configLoad() config.LoadOptions {
	return config.LoadOptions{MergeDomains: r.boolean("merge-domains", nil), IgnoreDotFiles: r.boolean("ignore-dot-files", nil)}
}

func (r *resolver) str(name string, file *string) string {
	if v, ok := r.source(name); ok {
		return v
	}
	if file != nil {
		return *file
	}
	v, _ := r.fs.GetString(name)
	return v
}

func (r *resolver) dur(name string, file *time.Duration) time.Duration {
	if v, ok := r.source(name); ok {
		d, err := time.ParseDuration(v)
		if err == nil && d < 0 {
			err = errors.New("must not be negative")
		}
		if err != nil {
			r.fail(name, v, err)
		}
		return d
	}
	if file != nil {
		return *file
	}
	d, _ := r.fs.GetDuration(name)
	return d
}

func (r *resolver) boolean(name string, file *bool) bool {
	if v, ok := r.source(name); ok {
		var b bool
		switch strings.ToLower(v) {
		case "true", "1", "yes", "on":
			b = true
		case "false", "0", "no", "off":
		default:
			r.fail(name, v, errors.New("want true or false"))
		}
		return b
	}
	if file != nil {
		return *file
	}
	b, _ := r.fs.GetBool(name)
	return b
}

func (r *resolver) int64(name string, file *int64) int64 {
	if v, ok := r.source(name); ok {
		var n int64
		if _, err := fmt.Sscan(v, &n); err != nil || n <= 0 {
			r.fail(name, v, errors.New("want a positive whole number"))
		}
		return n
	}
	if file != nil {
		return *file
	}
	n, _ := r.fs.GetInt64(name)
	return n
}

// size is int64 for a size that may be 0 (off).
func (r *resolver) size(name string, file *int64) int64 {
	if v, ok := r.source(name); ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			r.fail(name, v, errors.New("want a whole number of bytes, 0 or more"))
		}
		return n
	}
	if file != nil {
		return *file
	}
	n, _ := r.fs.GetInt64(name)
	return n
}

// ratio reads a fraction in (0, 1].
func (r *resolver) ratio(name string, file *float64) float64 {
	if v, ok := r.source(name); ok {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0 && f <= 1) {
			r.fail(name, v, errors.New("want a number above 0 and at most 1"))
		}
		return f
	}
	if file != nil {
		return *file
	}
	f, _ := r.fs.GetFloat64(name)
	return f
}

// resolveSettings loads the config file and resolves every setting, with
// flags over environment over file over defaults.
func resolveSettings(fs *pflag.FlagSet, getenv func(string) string) (serveSettings, error) {
	envoy, notes, err := envoyEnv(getenv)
	if err != nil {
		return serveSettings{}, err
	}
	r := &resolver{fs: fs, getenv: getenv, envoy: envoy}
	st := serveSettings{configPath: r.str("config", nil), configLoad: r.configLoad(), envoyNotes: notes}
	cfg, err := config.LoadPath(st.configPath, st.configLoad)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return st, fmt.Errorf("config file %s not found: give one with --config (try --config examples/fleetrate.yaml)", st.configPath)
		}
		return st, err
	}
	st.cfg = cfg
	r.settings(&st, cfg.Settings)
	if err := errors.Join(r.errs...); err != nil {
		return st, err
	}
	if err := st.check(); err != nil {
		return st, err
	}
	st.access, err = r.resolveAccess(st.authTokenFile, getenv)
	return st, err
}

// settings resolves each setting of st but the config file's, with s the
// file's server section.
func (r *resolver) settings(st *serveSettings, s config.Settings) {
	st.httpAddr = r.str("http-addr", s.HTTPAddr)
	st.grpcAddr = r.str("grpc-addr", s.GRPCAddr)
	st.redis = r.str("redis", s.Redis)
	st.prefix = r.str("prefix", s.Prefix)
	st.maxWait = r.dur("max-wait", s.MaxWait)
	st.readTimeout = r.dur("read-timeout", s.ReadTimeout)
	st.writeTimeout = r.dur("write-timeout", s.WriteTimeout)
	st.idleTimeout = r.dur("idle-timeout", s.IdleTimeout)
	st.shutdownTimeout = r.dur("shutdown-timeout", s.ShutdownTimeout)
	st.drainDelay = r.dur("drain-delay", s.DrainDelay)
	st.healthStore = r.boolean("health-checks-store", s.HealthChecksStore)
	st.storeTimeout = r.dur("store-timeout", s.StoreTimeout)
	st.reloadInterval = r.dur("reload-interval", s.ReloadInterval)
	st.maxRequestBytes = r.int64("max-request-bytes", s.MaxRequestBytes)
	st.authTokenFile = r.str("auth-token-file", s.AuthTokenFile)
	st.tlsCertFile = r.str("tls-cert-file", s.TLSCertFile)
	st.tlsKeyFile = r.str("tls-key-file", s.TLSKeyFile)
	st.tlsClientCAFile = r.str("tls-client-ca-file", s.TLSClientCAFile)
	st.tlsHTTP = r.boolean("tls-http", s.TLSHTTP)
	st.logFormat = r.str("log-format", s.LogFormat)
	st.logLevel = r.str("log-level", s.LogLevel)
	st.responseHeaders = r.boolean("response-headers", s.ResponseHeaders)
	st.shadowMode = r.boolean("shadow-mode", s.ShadowMode)
	st.quotaMode = r.boolean("quota-mode", s.QuotaMode)
	st.fixedWindow = r.boolean("fixed-window", s.FixedWindow)
	st.dynamicMetadata = r.boolean("response-dynamic-metadata", s.ResponseDynamicMetadata)
	st.storeAPI = r.boolean("store-api", s.StoreAPI)
	st.redisBatch = r.boolean("redis-batch", s.RedisBatch)
	st.adaptiveProcs = r.boolean("adaptive-procs", s.AdaptiveProcs)
	st.memMaxKeys = r.int64("memory-max-keys", s.MemoryMaxKeys)
	st.memMaxBytes = r.int64("memory-max-bytes", s.MemoryMaxBytes)
	st.localCacheBytes = r.size("local-cache-bytes", s.LocalCacheBytes)
	st.nearLimitRatio = r.ratio("near-limit-ratio", s.NearLimitRatio)
	st.maxMetricDescs = r.int64("max-metric-descriptors", s.MaxMetricDescriptors)
	st.metricsAddr = r.str("metrics-addr", s.MetricsAddr)
	st.metricsPath = r.str("metrics-path", s.MetricsPath)
	st.observe = r.observe()
	st.safety = r.safety(s)
	st.envoyCompat = r.envoyCompat(s)
}

// check reports the first setting, or pair of settings, that cannot work.
func (st *serveSettings) check() error {
	if st.maxWait > fleetrate.MaxWaitCap {
		return fmt.Errorf("--max-wait must be at most %v, got %v", fleetrate.MaxWaitCap, st.maxWait)
	}
	// The service reads a zero as its default: refuse one given here
	// rather than replace it silently.
	if st.maxWait == 0 {
		return fmt.Errorf("--max-wait must be above 0, got 0 (the default is %v)", server.DefaultMaxWait)
	}
	if st.prefix == "" {
		return fmt.Errorf("--prefix must not be empty (the default is %q): every key of a shared Redis would be the service's", server.DefaultPrefix)
	}
	if st.storeTimeout == 0 {
		return fmt.Errorf("--store-timeout must be above 0, got 0 (the default is %v)", server.DefaultStoreTimeout)
	}
	if st.httpAddr == "off" && st.grpcAddr == "off" {
		return errors.New("--http-addr and --grpc-addr are both off: nothing to serve")
	}
	if (st.tlsCertFile == "") != (st.tlsKeyFile == "") {
		return errors.New("give both --tls-cert-file and --tls-key-file, or neither")
	}
	if st.tlsClientCAFile != "" && st.tlsCertFile == "" {
		// Client certificates are verified in the TLS handshake: without
		// a server certificate there is none, and serving plain text
		// would leave clients unauthenticated while the operator
		// believes they are.
		return errors.New("--tls-client-ca-file needs --tls-cert-file and --tls-key-file: client certificates are verified only over TLS")
	}
	if err := st.envoyCompat.check(st.tlsClientCAFile, st.redis); err != nil {
		return err
	}
	switch st.logFormat {
	case "text", "json":
	default:
		return fmt.Errorf("--log-format must be text or json, got %q", st.logFormat)
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(st.logLevel)); err != nil {
		return fmt.Errorf("--log-level must be debug, info, warn or error, got %q", st.logLevel)
	}
	return st.observe.check(st.redis)
}
