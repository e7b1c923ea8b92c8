package server

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/fleetrate/fleetrate"
)

// Scope is a set of things a caller may do. A token carries scopes; a
// caller without a token gets the scopes of Access (see AccessOptions).
type Scope uint8

// The scopes. Each is independent: admin does not imply decide.
const (
	// ScopeDecide is the decision path: RLS (gRPC and POST /json),
	// /v1/take, /v1/wait, and giving back (/v1/refund, /v1/cancel) what
	// this caller was granted, presented as the signed grant the service
	// issued.
	ScopeDecide Scope = 1 << iota
	// ScopeStore is the raw store API (/v1/store/...) of remotestore
	// workers, on keys under the prefix that the configuration does not
	// pin (see Server.pinned).
	ScopeStore
	// ScopeAdmin is what changes a bucket beyond a take: /v1/reset,
	// /v1/drain, give-backs without a grant, the raw store API's drain and
	// reset of a configured bucket, plus /v1/config and the status pages.
	ScopeAdmin
	// ScopeAll is every scope.
	ScopeAll = ScopeDecide | ScopeStore | ScopeAdmin
)

// DefaultTokenScopes are the scopes of a token listed without any: a
// worker's (decide and store), not an operator's. Admin must be listed.
const DefaultTokenScopes = ScopeDecide | ScopeStore

var scopeNames = []struct {
	name  string
	scope Scope
}{{"decide", ScopeDecide}, {"store", ScopeStore}, {"admin", ScopeAdmin}}

// String lists the scopes, comma-separated, e.g. "decide,store"; "none"
// for no scope.
func (s Scope) String() string {
	var names []string
	for _, n := range scopeNames {
		if s&n.scope != 0 {
			names = append(names, n.name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ",")
}

// ParseScopes reads a list of scopes separated by commas or plus signs,
// e.g. "decide,store" or "decide+admin"; "all" is every scope. An empty
// list, an empty item or an unknown name is an error that names it.
func ParseScopes(list string) (Scope, error) {
	if strings.TrimSpace(list) == "" {
		return 0, fmt.Errorf("%w: empty list of scopes (want decide, store, admin or all)", fleetrate.ErrInvalid)
	}
	var s Scope
	for _, item := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == '+' }) {
		item = strings.TrimSpace(item)
		found := item == "all"
		if found {
			s |= ScopeAll
		}
		for _, n := range scopeNames {
			if item == n.name {
				s, found = s|n.scope, true
			}
		}
		if !found {
			return 0, fmt.Errorf("%w: unknown scope %q (want decide, store, admin or all)", fleetrate.ErrInvalid, item)
		}
	}
	if s == 0 {
		return 0, fmt.Errorf("%w: empty list of scopes in %q (want decide, store, admin or all)", fleetrate.ErrInvalid, list)
	}
	return s, nil
}

// Token is a bearer token and the scopes it carries.
type Token struct {
	// Secret is the token itself: not empty, without spaces.
	Secret string
	// Scopes say what a caller presenting it may do.
	Scopes Scope
}

// ParseTokenFile reads a token file: one token a line, optionally
// followed by spaces and its scopes ("w0rker-s3cret decide,store",
// "0ps-s3cret admin,decide"); a token without scopes gets def. Blank lines
// and lines starting with # are skipped. Errors name the line, never the
// token.
func ParseTokenFile(data []byte, def Scope) ([]Token, error) {
	var toks []Token
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 64<<10)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		fields := strings.Fields(text)
		tok := Token{Secret: fields[0], Scopes: def}
		if scopes := strings.Join(fields[1:], ""); scopes != "" {
			s, err := ParseScopes(scopes)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			tok.Scopes = s
		}
		toks = append(toks, tok)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", fleetrate.ErrInvalid, err)
	}
	return toks, nil
}

// ParseTokenList reads FLEETRATE_AUTH_TOKEN's form: tokens separated by
// commas, each optionally followed by a colon and its scopes separated by
// plus signs ("w0rker,0ps:admin+decide"); a token without scopes gets
// def. Errors name the item's place, never the token.
func ParseTokenList(list string, def Scope) ([]Token, error) {
	var toks []Token
	for i, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		tok := Token{Secret: item, Scopes: def}
		if at := strings.LastIndexByte(item, ':'); at >= 0 {
			s, err := ParseScopes(item[at+1:])
			if err != nil {
				return nil, fmt.Errorf("token %d: %w", i+1, err)
			}
			tok = Token{Secret: item[:at], Scopes: s}
		}
		if tok.Secret == "" {
			return nil, fmt.Errorf("%w: token %d: empty before its scopes", fleetrate.ErrInvalid, i+1)
		}
		if strings.ContainsAny(tok.Secret, " \t\r\n") {
			return nil, fmt.Errorf("%w: token %d: holds a space", fleetrate.ErrInvalid, i+1)
		}
		toks = append(toks, tok)
	}
	return toks, nil
}

// AccessOptions say who may do what (see Scope and docs/OPERATIONS.md,
// "Security model"). The zero value is the safe default: without tokens,
// the decision path is open to every client, as envoyproxy/ratelimit's,
// and the rest (store, admin) to loopback clients only.
type AccessOptions struct {
	// Tokens are bearer tokens with their scopes, in addition to
	// Options.AuthTokens (which get DefaultScopes). With any token, every
	// API but /healthz, /readyz, /healthcheck and /metrics needs one that
	// carries the endpoint's scope.
	Tokens []Token
	// DefaultScopes are the scopes of Options.AuthTokens. Default
	// DefaultTokenScopes (decide and store).
	DefaultScopes Scope
	// UnauthenticatedAdminFromNetwork, without tokens, gives every client
	// that reaches the HTTP address the store and admin scopes, not only
	// loopback clients. It is refused with tokens (which decide instead).
	UnauthenticatedAdminFromNetwork bool
	// GrantKey signs the grants that refunds and cancels present (at least
	// 32 bytes). Replicas that share a store must share it, so that a
	// grant one issued is honoured by another. Default: 32 random bytes
	// drawn at New, so that grants die with the process.
	GrantKey []byte
	// GrantTTL is how long a grant can be given back after it was issued.
	// Default DefaultGrantTTL.
	GrantTTL time.Duration
}

// DefaultGrantTTL is the default of AccessOptions.GrantTTL.
const DefaultGrantTTL = 10 * time.Minute

// MinGrantKeyBytes is the shortest AccessOptions.GrantKey.
const MinGrantKeyBytes = 32

// validate checks the access options and the legacy tokens.
func (a AccessOptions) validate(legacy []string) error {
	for i, t := range legacy {
		if t == "" || strings.ContainsAny(t, " \t\r\n") {
			return fmt.Errorf("%w: server: auth token %d must be non-empty and without spaces", fleetrate.ErrInvalid, i+1)
		}
	}
	for i, t := range a.Tokens {
		if t.Secret == "" || strings.ContainsAny(t.Secret, " \t\r\n") {
			return fmt.Errorf("%w: server: token %d must be non-empty and without spaces", fleetrate.ErrInvalid, i+1)
		}
		if t.Scopes == 0 || t.Scopes&^ScopeAll != 0 {
			return fmt.Errorf("%w: server: token %d: scopes %#x: want a non-empty set of decide, store and admin", fleetrate.ErrInvalid, i+1, uint8(t.Scopes))
		}
	}
	if a.DefaultScopes&^ScopeAll != 0 {
		return fmt.Errorf("%w: server: default scopes %#x: want decide, store and admin", fleetrate.ErrInvalid, uint8(a.DefaultScopes))
	}
	if a.UnauthenticatedAdminFromNetwork && len(a.Tokens)+len(legacy) > 0 {
		return fmt.Errorf("%w: server: unauthenticated admin from the network has no meaning with tokens: give the admin scope to a token instead", fleetrate.ErrInvalid)
	}
	if n := len(a.GrantKey); n > 0 && n < MinGrantKeyBytes {
		return fmt.Errorf("%w: server: grant key of %d bytes, at least %d", fleetrate.ErrInvalid, n, MinGrantKeyBytes)
	}
	if a.GrantTTL < 0 || a.GrantTTL > fleetrate.MaxFillTime/2 {
		return fmt.Errorf("%w: server: grant TTL must be between 0 and %v, got %v", fleetrate.ErrInvalid, fleetrate.MaxFillTime/2, a.GrantTTL)
	}
	return nil
}

// tokenSet is the tokens in force, each with its scopes and an identity
// that grants are bound to.
type tokenSet []tokenEntry

type tokenEntry struct {
	secret []byte
	scopes Scope
	id     string // a hash of the secret: grants name it, logs do not
}

func newTokenSet(a AccessOptions, legacy []string) tokenSet {
	def := a.DefaultScopes
	if def == 0 {
		def = DefaultTokenScopes
	}
	all := make([]Token, 0, len(legacy)+len(a.Tokens))
	for _, t := range legacy {
		all = append(all, Token{Secret: t, Scopes: def})
	}
	all = append(all, a.Tokens...)
	set := make(tokenSet, len(all))
	for i, t := range all {
		h := sha256.Sum256([]byte(t.Secret))
		set[i] = tokenEntry{secret: []byte(t.Secret), scopes: t.Scopes, id: hex.EncodeToString(h[:8])}
	}
	return set
}

// lookup finds the token of an Authorization value ("Bearer <token>"),
// comparing it with every token in constant time.
func (ts tokenSet) lookup(header string) (tokenEntry, bool) {
	scheme, tok, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return tokenEntry{}, false
	}
	b := []byte(strings.TrimSpace(tok))
	found, at := 0, 0
	for i, t := range ts {
		eq := subtle.ConstantTimeCompare(b, t.secret)
		at = subtle.ConstantTimeSelect(eq, i, at)
		found |= eq
	}
	if found == 0 {
		return tokenEntry{}, false
	}
	return ts[at], true
}
