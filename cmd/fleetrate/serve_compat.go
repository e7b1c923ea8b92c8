package main

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/spf13/pflag"
	"golang.org/x/net/http/httpguts"

	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/server"
)

// envoyCompatSettings are the settings that carry envoyproxy/ratelimit's
// behaviours over: its response headers, the name its mTLS clients must
// have, the ageing and keepalive of gRPC connections, and the TLS files
// of its Redis connection.
type envoyCompatSettings struct {
	limitHeaders server.LimitHeaders
	tlsClientSAN string
	grpc         server.GRPCOptions
	redisTLS     redisTLSFiles
}

// addEnvoyCompatFlags adds the flags of envoyCompatSettings.
func addEnvoyCompatFlags(f *pflag.FlagSet) {
	f.Bool("limit-headers", false, "add envoyproxy/ratelimit's RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset headers to RLS responses (its LIMIT_RESPONSE_HEADERS_ENABLED); independent of --response-headers")
	f.String("limit-header-limit", server.DefaultLimitHeader, "name of the --limit-headers header giving the limit (LIMIT_LIMIT_HEADER)")
	f.String("limit-header-remaining", server.DefaultRemainingHeader, "name of the --limit-headers header giving the requests left (LIMIT_REMAINING_HEADER)")
	f.String("limit-header-reset", server.DefaultResetHeader, "name of the --limit-headers header giving the seconds until reset (LIMIT_RESET_HEADER)")
	f.String("tls-client-san", "", "with --tls-client-ca-file, refuse a client certificate that does not name this DNS name or IP address among its subject alternative names (GRPC_CLIENT_TLS_SAN)")
	f.Duration("grpc-max-connection-age", server.DefaultMaxConnectionAge, "send GOAWAY on a gRPC connection this old (+/-10 % jitter), so that clients reconnect and spread over new replicas; 0 never (GRPC_MAX_CONNECTION_AGE)")
	f.Duration("grpc-max-connection-age-grace", server.DefaultMaxConnectionAgeGrace, "how long calls in flight on an aged gRPC connection get before it is closed; 0 forever (GRPC_MAX_CONNECTION_AGE_GRACE)")
	f.Duration("grpc-keepalive-time", server.DefaultKeepaliveTime, "ping a gRPC client after this long without activity")
	f.Duration("grpc-keepalive-timeout", server.DefaultKeepaliveTimeout, "close a gRPC connection whose keepalive ping is not answered within this")
	addRedisTLSFlags(f)
}

// envoyCompat resolves envoyCompatSettings, with s the file's server
// section.
func (r *resolver) envoyCompat(s config.Settings) envoyCompatSettings {
	return envoyCompatSettings{
		limitHeaders: server.LimitHeaders{
			Enabled:   r.boolean("limit-headers", s.LimitHeaders),
			Limit:     r.str("limit-header-limit", s.LimitHeaderLimit),
			Remaining: r.str("limit-header-remaining", s.LimitHeaderRemaining),
			Reset:     r.str("limit-header-reset", s.LimitHeaderReset),
		},
		tlsClientSAN: r.str("tls-client-san", s.TLSClientSAN),
		grpc: server.GRPCOptions{
			MaxConnectionAge:      r.dur("grpc-max-connection-age", s.GRPCMaxConnAge),
			MaxConnectionAgeGrace: r.dur("grpc-max-connection-age-grace", s.GRPCMaxConnAgeGrace),
			KeepaliveTime:         r.dur("grpc-keepalive-time", s.GRPCKeepaliveTime),
			KeepaliveTimeout:      r.dur("grpc-keepalive-timeout", s.GRPCKeepaliveTimeout),
		},
		redisTLS: r.redisTLS(s),
	}
}

// check reports a setting that cannot work: a header name that is no HTTP
// field name, a client name to pin without client certificates to check
// (clientCA), which would leave every client admitted while the operator
// believes only one name is, or Redis TLS files without a TLS redisURL.
func (c envoyCompatSettings) check(clientCA, redisURL string) error {
	for _, h := range []struct{ flag, name string }{
		{"limit-header-limit", c.limitHeaders.Limit},
		{"limit-header-remaining", c.limitHeaders.Remaining},
		{"limit-header-reset", c.limitHeaders.Reset},
	} {
		if !httpguts.ValidHeaderFieldName(h.name) {
			return fmt.Errorf("--%s must be an HTTP field name (letters, digits and !#$%%&'*+-.^_`|~), got %q", h.flag, h.name)
		}
	}
	if c.tlsClientSAN != "" && clientCA == "" {
		return errors.New("--tls-client-san needs --tls-client-ca-file (and --tls-cert-file, --tls-key-file): a client's name is checked only in its verified certificate")
	}
	if c.redisTLS.set() && !strings.HasPrefix(redisURL, "rediss") {
		// Unused files would leave the operator believing Redis is
		// reached over TLS.
		return fmt.Errorf("--redis-tls-* (REDIS_TLS_*) need a rediss:// --redis URL (REDIS_TLS=true), got %q", redactedURL(redisURL))
	}
	return nil
}

// redactedURL is a URL with its password masked, for an error.
func redactedURL(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Redacted()
	}
	return "(unparsable)"
}
