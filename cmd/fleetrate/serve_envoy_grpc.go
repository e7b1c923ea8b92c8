package main

import (
	"fmt"
)

// grpcConn reads envoyproxy/ratelimit's gRPC connection settings
// (GRPC_UDS, GRPC_MAX_CONNECTION_AGE and GRPC_MAX_CONNECTION_AGE_GRACE,
// durations in Go's syntax as it reads them), its response header names,
// and the name its mTLS clients must have (GRPC_CLIENT_TLS_SAN); and it
// the TLS files of its Redis connection (REDIS_TLS_*); and it refuses the
// security settings fleetrate cannot honour, naming each.
func (e *envoyReader) grpcConn() {
	if p := e.getenv("GRPC_UDS"); p != "" {
		// As envoyproxy/ratelimit, the socket replaces GRPC_HOST:GRPC_PORT.
		e.vals["grpc-addr"] = "unix:" + p
	}
	e.copy("GRPC_MAX_CONNECTION_AGE", "grpc-max-connection-age")
	e.copy("GRPC_MAX_CONNECTION_AGE_GRACE", "grpc-max-connection-age-grace")
	e.copy("LIMIT_LIMIT_HEADER", "limit-header-limit")
	e.copy("LIMIT_REMAINING_HEADER", "limit-header-remaining")
	e.copy("LIMIT_RESET_HEADER", "limit-header-reset")
	useTLS, err := e.boolean("GRPC_SERVER_USE_TLS")
	if err != nil {
		e.errs = append(e.errs, err)
		return
	}
	if useTLS {
		if !e.set("GRPC_SERVER_TLS_CERT") || !e.set("GRPC_SERVER_TLS_KEY") {
			e.errs = append(e.errs, fmt.Errorf("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY: without them gRPC would be served in plain text"))
		}
		e.copy("GRPC_CLIENT_TLS_SAN", "tls-client-san")
	} else {
		for _, name := range []string{"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY"} {
			if e.set(name) {
				e.notes = append(e.notes, name+": ignored without GRPC_SERVER_USE_TLS=true, as envoyproxy/ratelimit ignores it: gRPC is served in plain text")
			}
		}
		for _, name := range []string{"GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN"} {
			if e.set(name) {
				// envoyproxy/ratelimit serves plain text then: every
				// client admitted, while the setting says otherwise.
				e.errs = append(e.errs, fmt.Errorf("%s is set but GRPC_SERVER_USE_TLS is not true: client certificates are checked only over TLS; set GRPC_SERVER_USE_TLS=true (with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY) or unset %s", name, name))
			}
		}
	}
	e.copy("REDIS_TLS_CACERT", "redis-tls-ca-file")
	e.copy("REDIS_TLS_CLIENT_CERT", "redis-tls-cert-file")
	e.copy("REDIS_TLS_CLIENT_KEY", "redis-tls-key-file")
	e.flagBool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "redis-tls-skip-hostname-verification")
}
