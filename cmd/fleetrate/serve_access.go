package main

import (
	"bytes"
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/fleetrate/fleetrate/internal/server"
)

// accessSettings are who may do what (see docs/OPERATIONS.md, "Security
// model").
type accessSettings struct {
	tokenFile     string
	defaultScopes server.Scope
	openAdmin     bool
	grantKeyFile  string
	grantTTL      time.Duration
	tokens        []server.Token
	grantKey      []byte
}

// accessFlags adds the access flags (but --auth-token-file, older) to f.
func accessFlags(f *pflag.FlagSet) {
	f.String("auth-default-scopes", server.DefaultTokenScopes.String(), "scopes of a token listed without any (decide, store, admin or all, comma-separated)")
	f.Bool("allow-unauthenticated-admin-from-network", false, "without tokens, serve reset, drain, give-backs without a grant, /v1/config, the status page and the raw store API to every client that reaches --http-addr, not only to loopback clients")
	f.String("grant-key-file", "", "file holding the key (at least 32 bytes) that signs refund and cancel grants; replicas over one store must share it; empty draws one at start")
	f.Duration("grant-ttl", server.DefaultGrantTTL, "how long after a take its grant can be given back (refund or cancel)")
}

// resolveAccess resolves the access settings, reading the token and grant
// key files.
func (r *resolver) resolveAccess(tokenFile string, getenv func(string) string) (accessSettings, error) {
	a := accessSettings{tokenFile: tokenFile}
	scopes := r.str("auth-default-scopes", nil)
	var err error
	if a.defaultScopes, err = server.ParseScopes(scopes); err != nil {
		return a, fmt.Errorf("--auth-default-scopes: %w", err)
	}
	a.openAdmin = r.boolean("allow-unauthenticated-admin-from-network", nil)
	a.grantKeyFile = r.str("grant-key-file", nil)
	a.grantTTL = r.dur("grant-ttl", nil)
	if a.tokens, err = authTokens(tokenFile, a.defaultScopes, getenv); err != nil {
		return a, err
	}
	if a.openAdmin && len(a.tokens) > 0 {
		return a, fmt.Errorf("--allow-unauthenticated-admin-from-network has no meaning with tokens: give a token the admin scope instead")
	}
	if a.grantKeyFile != "" {
		key, err := os.ReadFile(a.grantKeyFile)
		if err != nil {
			return a, fmt.Errorf("grant key file: %w", err)
		}
		if a.grantKey = bytes.TrimSpace(key); len(a.grantKey) < server.MinGrantKeyBytes {
			return a, fmt.Errorf("grant key file %s: %d bytes, at least %d (try: head -c 32 /dev/urandom | base64 > %s)", a.grantKeyFile, len(a.grantKey), server.MinGrantKeyBytes, a.grantKeyFile)
		}
	}
	return a, nil
}

// options are the server's access options.
func (a accessSettings) options() server.AccessOptions {
	return server.AccessOptions{
		Tokens:                          a.tokens,
		DefaultScopes:                   a.defaultScopes,
		UnauthenticatedAdminFromNetwork: a.openAdmin,
		GrantKey:                        a.grantKey,
		GrantTTL:                        a.grantTTL,
	}
}

// authTokens are the bearer tokens of the file at path (none when path is
// empty) followed by those of FLEETRATE_AUTH_TOKEN, comma-separated; a
// token without scopes gets def.
func authTokens(path string, def server.Scope, getenv func(string) string) ([]server.Token, error) {
	var toks []server.Token
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("auth token file: %w", err)
		}
		if toks, err = server.ParseTokenFile(data, def); err != nil {
			return nil, fmt.Errorf("auth token file %s: %w", path, err)
		}
		if len(toks) == 0 {
			return nil, fmt.Errorf("auth token file %s holds no token", path)
		}
	}
	env, err := server.ParseTokenList(getenv(envPrefix+"AUTH_TOKEN"), def)
	if err != nil {
		return nil, fmt.Errorf("%sAUTH_TOKEN: %w", envPrefix, err)
	}
	return append(toks, env...), nil
}
