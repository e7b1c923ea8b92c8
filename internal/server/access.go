package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/fleetrate/fleetrate/internal/server/wire"
)

// Reasons of fleetrate_refused_total: why the service refused a caller.
const (
	reasonNoToken    = "no_token"
	reasonWrongToken = "wrong_token"
	reasonScope      = "scope"
	reasonNotLocal   = "not_loopback"
	reasonNoGrant    = "grant_required"
	reasonForged     = "forged_grant"
	reasonExpired    = "expired_grant"
	reasonReplayed   = "replayed_grant"
	reasonMismatch   = "grant_mismatch"
	reasonPinned     = "pinned_limits"
	reasonReserved   = "reserved_key"
)

// Codes of refusals in wire.Error.Code, besides wire.CodeUnauthorized.
const (
	codeForbidden     = "forbidden"
	codeGrantRequired = "grant_required"
	codeGrantRefused  = "grant_refused"
	codePinned        = "pinned_limits"
)

// access is the server's access control: the tokens, the grant signer and
// the refusals' metric.
type access struct {
	opts    AccessOptions
	tokens  tokenSet
	grants  *grants
	refused *prometheus.CounterVec
	log     *slog.Logger
}

func newAccess(opts Options) (*access, error) {
	g, err := newGrants(opts.Access.GrantKey, opts.Access.GrantTTL)
	if err != nil {
		return nil, err
	}
	a := &access{opts: opts.Access, tokens: newTokenSet(opts.Access, opts.AuthTokens), grants: g, log: opts.Logger}
	a.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Name:      "refused_total",
		Help:      "Requests refused for their caller: no or a wrong token, a scope the token lacks, a non-loopback client without a token, a forged, expired, replayed or missing grant, limits other than a configured bucket's, or a reserved key.",
	}, []string{"endpoint", "reason"})
	opts.Registry.MustRegister(a.refused)
	return a, nil
}

// caller is who sent a request, as the service sees it.
type caller struct {
	scopes   Scope
	id       string // the token's identity, "" without tokens
	endpoint string // the metric's label: a fixed path or method
	remote   string
}

type callerKey struct{}

func withCaller(ctx context.Context, c caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

func callerOf(ctx context.Context) caller {
	c, _ := ctx.Value(callerKey{}).(caller)
	return c
}

// identify returns the caller of an Authorization value from remote, or
// the reason it is refused: with tokens, a known token's scopes; without,
// decide for everyone and everything for a loopback client (or for every
// client with UnauthenticatedAdminFromNetwork).
func (a *access) identify(header, remote string) (caller, string) {
	c := caller{remote: remote}
	if len(a.tokens) > 0 {
		t, ok := a.tokens.lookup(header)
		switch {
		case ok:
			c.scopes, c.id = t.scopes, t.id
			return c, ""
		case header == "":
			return c, reasonNoToken
		}
		return c, reasonWrongToken
	}
	c.scopes = ScopeDecide
	if a.opts.UnauthenticatedAdminFromNetwork || loopbackPeer(remote) {
		c.scopes = ScopeAll
	}
	return c, ""
}

// loopbackPeer reports whether a RemoteAddr is this host's loopback (an
// address that is not host:port, such as a Unix socket's, counts: the
// file's permissions guard it).
func loopbackPeer(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return true
	}
	ip := net.ParseIP(host)
	return ip == nil || ip.IsLoopback()
}

// admit identifies an HTTP request's caller and checks that it holds
// need; it returns the request's context with the caller, or writes the
// refusal (401 for a missing or wrong token, 403 for a scope) and returns
// false.
func (a *access) admit(w http.ResponseWriter, r *http.Request, endpoint string, need Scope) (context.Context, bool) {
	c, reason := a.identify(r.Header.Get("Authorization"), r.RemoteAddr)
	c.endpoint = endpoint
	if reason != "" {
		w.Header().Add("WWW-Authenticate", `Bearer realm="fleetrate"`)
		writeError(w, a.refuse(c, reason, http.StatusUnauthorized, wire.CodeUnauthorized, "missing or wrong bearer token in the Authorization header"))
		return nil, false
	}
	if err := a.need(c, need); err != nil {
		writeError(w, err)
		return nil, false
	}
	return withCaller(r.Context(), c), true
}

// need refuses (403) a caller without every scope of want.
func (a *access) need(c caller, want Scope) *httpError {
	if c.scopes&want == want {
		return nil
	}
	if len(a.tokens) == 0 {
		return a.refuse(c, reasonNotLocal, http.StatusForbidden, codeForbidden, fmt.Sprintf(
			"%s needs the %s scope, which without tokens only loopback clients have: give tokens with that scope (--auth-token-file), or start with --allow-unauthenticated-admin-from-network",
			c.endpoint, want&^c.scopes))
	}
	return a.refuse(c, reasonScope, http.StatusForbidden, codeForbidden, fmt.Sprintf(
		"%s needs the %s scope; this token has %s", c.endpoint, want&^c.scopes, c.scopes))
}

// refuse counts and logs one refusal, and returns it as an error.
func (a *access) refuse(c caller, reason string, status int, code, msg string) *httpError {
	a.refused.WithLabelValues(c.endpoint, reason).Inc()
	a.log.Warn("refused", "endpoint", c.endpoint, "reason", reason, "remote", c.remote, "scopes", c.scopes.String(), "error", msg)
	return &httpError{status: status, code: code, msg: msg}
}

// logStart says, once at start, who may do what on these listeners.
// A listener whose clients must show a certificate the service trusts
// (mtlsHTTP, mtlsGRPC) is not warned about.
func (a *access) logStart(httpLn, grpcLn net.Listener, mtlsHTTP, mtlsGRPC bool) {
	if len(a.tokens) > 0 {
		n := map[Scope]int{}
		for _, t := range a.tokens {
			for _, s := range scopeNames {
				if t.scopes&s.scope != 0 {
					n[s.scope]++
				}
			}
		}
		a.log.Info("access: bearer tokens required", "tokens", len(a.tokens),
			"with_decide", n[ScopeDecide], "with_store", n[ScopeStore], "with_admin", n[ScopeAdmin])
		return
	}
	if a.opts.UnauthenticatedAdminFromNetwork {
		a.log.Warn("access: no tokens and --allow-unauthenticated-admin-from-network: any client that reaches the HTTP address can reset, drain, give back without a grant and use the raw store API")
		return
	}
	if httpLn != nil && !loopback(httpLn.Addr()) && !mtlsHTTP {
		a.log.Warn("access: no tokens: the decision path (RLS, /json, /v1/take, /v1/wait, give-backs with a grant) is open to every client;"+
			" reset, drain, give-backs without a grant, /v1/config, the status page and the raw store API are served to loopback clients only."+
			" To open them, give tokens with the store or admin scope (--auth-token-file), or start with --allow-unauthenticated-admin-from-network",
			"addr", httpLn.Addr().String())
	}
	if grpcLn != nil && !loopback(grpcLn.Addr()) && !mtlsGRPC {
		a.log.Warn("access: no tokens: gRPC RLS is open to every client that reaches it, as envoyproxy/ratelimit's; set --auth-token-file, or listen on 127.0.0.1",
			"addr", grpcLn.Addr().String())
	}
}

// admitGRPC identifies a gRPC call's caller from its authorization
// metadata and checks that it holds the decide scope.
func (a *access) admitGRPC(ctx context.Context, method string) error {
	remote := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		remote = p.Addr.String()
	}
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get("authorization")
	header := ""
	if len(values) > 0 {
		header = values[0]
	}
	for _, v := range values {
		if _, ok := a.tokens.lookup(v); ok {
			header = v
		}
	}
	c, reason := a.identify(header, remote)
	c.endpoint = method
	if reason != "" {
		a.refuse(c, reason, http.StatusUnauthorized, wire.CodeUnauthorized, "missing or wrong bearer token")
		return status.Error(codes.Unauthenticated, "missing or wrong bearer token in the authorization metadata")
	}
	if err := a.need(c, ScopeDecide); err != nil {
		return status.Error(codes.PermissionDenied, err.msg)
	}
	return nil
}
