package httplimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/fleetrate/fleetrate"
)

// KeyFunc returns the key that identifies the client of a request: every
// request with the same key draws from the same bucket of a policy. A key
// function that cannot identify the client returns an error wrapping
// ErrNoKey; the middleware then answers through Config.KeyError.
//
// Keys may hold any bytes: the middleware escapes them (and hashes long
// ones) before they become store keys, so no key can reach another
// policy's buckets or a Redis {hash tag}. Within one policy, distinct
// clients must get distinct keys; the built-in functions prefix their
// keys with their kind ("apikey:", "ip:", "user:", "route:") so that
// combining them with FirstOf never mixes two kinds of client.
type KeyFunc func(*http.Request) (string, error)

// ErrNoKey means a key function found nothing to identify the client by,
// such as a missing API key header.
var ErrNoKey = errors.New("httplimit: no key for request")

// APIKeyHashLen is the number of hex digits of SHA-256 kept in API key
// bucket names: 128 bits, so that distinct keys never share a bucket.
const APIKeyHashLen = 32

// errEmptyHeaderName is what APIKey("") answers every request: a key
// function the server misconfigured (see defaultKeyError).
var errEmptyHeaderName = misconfigured{fmt.Errorf("%w: httplimit: APIKey: the header name must not be empty", fleetrate.ErrInvalid)}

// misconfigured marks an error of a key function httplimit made that the
// server misconfigured: the middleware answers it 500, not 400.
type misconfigured struct{ error }

func (m misconfigured) Unwrap() error { return m.error }

// APIKey keys requests by the API key in the named header, such as
// "X-API-Key". The key is hashed with SHA-256 before it goes anywhere, so
// the raw secret is never stored, logged or sent to Redis, and no
// character of it can reach into another key or a hash tag. For the
// Authorization header, a leading "Bearer " is dropped first. A missing
// or empty header, or the header given twice, is an error wrapping
// ErrNoKey. An empty header name fails every request with an error
// wrapping fleetrate.ErrInvalid, which the default KeyError answers 500.
func APIKey(header string) KeyFunc {
	if strings.TrimSpace(header) == "" {
		// A KeyFunc cannot fail its construction: it fails every request
		// with an error the middleware answers 500, a server's mistake.
		return func(*http.Request) (string, error) {
			return "", errEmptyHeaderName
		}
	}
	header = http.CanonicalHeaderKey(header)
	return func(r *http.Request) (string, error) {
		vals := r.Header.Values(header)
		switch {
		case len(vals) == 0:
			return "", fmt.Errorf("%w: missing %s header", ErrNoKey, header)
		case len(vals) > 1:
			return "", fmt.Errorf("%w: %s header given %d times", ErrNoKey, header, len(vals))
		}
		v := strings.TrimSpace(vals[0])
		if header == "Authorization" {
			if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
				v = strings.TrimSpace(v[7:])
			}
		}
		if v == "" {
			return "", fmt.Errorf("%w: empty %s header", ErrNoKey, header)
		}
		return "apikey:" + HashKey(v), nil
	}
}

// HashKey returns the first APIKeyHashLen hex digits of the SHA-256 of a
// secret. Use it to key buckets by secrets in a custom KeyFunc, and to
// find a client's bucket in the store from its key.
func HashKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])[:APIKeyHashLen]
}

// Principal keys requests by an authenticated principal that an earlier
// middleware stored in the request's context; get extracts it, for
// example:
//
//	httplimit.Principal(func(ctx context.Context) (string, bool) {
//		u, ok := ctx.Value(userKey{}).(*User)
//		if !ok {
//			return "", false
//		}
//		return u.ID, true
//	})
//
// A request without a principal (get returns false or "") is an error
// wrapping ErrNoKey.
func Principal(get func(context.Context) (string, bool)) KeyFunc {
	return func(r *http.Request) (string, error) {
		if get == nil {
			return "", fmt.Errorf("%w: Principal was given a nil function", ErrNoKey)
		}
		id, ok := get(r.Context())
		if !ok || id == "" {
			return "", fmt.Errorf("%w: no authenticated principal in the request context", ErrNoKey)
		}
		return "user:" + id, nil
	}
}

// Route keys requests by the pattern of the route that matched them, as
// set in Request.Pattern by http.ServeMux (Go 1.22+), for example
// "POST /v1/messages": all clients of a route share one bucket, which
// protects the backend behind it. Mount the middleware on the route, not
// around the mux, so that the pattern is known. With chi or gorilla, use a
// custom KeyFunc returning chi.RouteContext(ctx).RoutePattern() or
// mux.CurrentRoute(r).GetPathTemplate(). An empty pattern is an error
// wrapping ErrNoKey.
func Route() KeyFunc {
	return func(r *http.Request) (string, error) {
		if r.Pattern == "" {
			return "", fmt.Errorf("%w: the request has no route pattern (mount the middleware on a ServeMux route)", ErrNoKey)
		}
		return "route:" + r.Pattern, nil
	}
}

// FirstOf returns a KeyFunc that tries fs in order and returns the first
// key found: FirstOf(APIKey("X-API-Key"), ClientIP(...)) limits clients
// with a key by key and the others by address. Errors wrapping ErrNoKey
// move on to the next function; any other error is returned at once.
func FirstOf(fs ...KeyFunc) KeyFunc {
	return func(r *http.Request) (string, error) {
		var errs []error
		for _, f := range fs {
			if f == nil {
				continue
			}
			k, err := f(r)
			if err == nil {
				return k, nil
			}
			if !errors.Is(err, ErrNoKey) {
				return "", err
			}
			errs = append(errs, err)
		}
		if len(errs) == 0 {
			return "", fmt.Errorf("%w: FirstOf has no key functions", ErrNoKey)
		}
		return "", errors.Join(errs...)
	}
}

// Forwarding headers that ClientIP can read.
const (
	// HeaderXForwardedFor is the de facto X-Forwarded-For header: a
	// comma-separated list of addresses, the client first.
	HeaderXForwardedFor = "X-Forwarded-For"
	// HeaderForwarded is the standard Forwarded header of RFC 7239.
	HeaderForwarded = "Forwarded"
	// HeaderCFConnectingIP is Cloudflare's single-address client IP header.
	HeaderCFConnectingIP = "Cf-Connecting-Ip"
	// HeaderTrueClientIP is the single-address client IP header of Akamai
	// and of Cloudflare Enterprise.
	HeaderTrueClientIP = "True-Client-Ip"
	// HeaderXRealIP is the single-address header nginx's realip and many
	// proxies set.
	HeaderXRealIP = "X-Real-Ip"
)

// IPConfig configures ClientIP. The zero value keys every request by the
// address of its TCP peer and trusts no forwarding header.
type IPConfig struct {
	// TrustedProxies are the networks of the reverse proxies and load
	// balancers in front of the service. A forwarding header is read only
	// when the TCP peer is in one of them, and only the hops those proxies
	// appended are believed: the address used is the rightmost one that is
	// not itself a trusted proxy. The default is none, so forwarding
	// headers are ignored.
	TrustedProxies []netip.Prefix
	// Header is the forwarding header your proxies set: HeaderXForwardedFor
	// (the default) or HeaderForwarded, lists of hops; or a single-address
	// header set by a CDN or proxy in front of the service:
	// HeaderCFConnectingIP, HeaderTrueClientIP or HeaderXRealIP. Read only
	// one: a proxy that sets one passes a client's forged copy of another
	// through untouched. A single-address header is believed only from a
	// trusted peer, and only when it appears once and holds one address;
	// otherwise the peer's own address is the key, so a forged or doubled
	// header never picks another client's bucket.
	Header string
	// IPv4PrefixLen groups IPv4 clients by network. The default is 32, one
	// bucket per address.
	IPv4PrefixLen int
	// IPv6PrefixLen groups IPv6 clients by network. The default is 64,
	// since one host usually controls a whole /64.
	IPv6PrefixLen int
}

// Validate checks the configuration, naming the offending field.
func (c IPConfig) Validate() error {
	switch http.CanonicalHeaderKey(c.Header) {
	case "", HeaderXForwardedFor, HeaderForwarded, HeaderCFConnectingIP, HeaderTrueClientIP, HeaderXRealIP:
	default:
		return fmt.Errorf("%w: httplimit: ip config: header must be one of %q, %q, %q, %q or %q, got %q",
			fleetrate.ErrInvalid, HeaderXForwardedFor, HeaderForwarded, HeaderCFConnectingIP, HeaderTrueClientIP, HeaderXRealIP, c.Header)
	}
	if c.IPv4PrefixLen < 0 || c.IPv4PrefixLen > 32 {
		return fmt.Errorf("%w: httplimit: ip config: ipv4 prefix length must be between 1 and 32 (0 means 32), got %d", fleetrate.ErrInvalid, c.IPv4PrefixLen)
	}
	if c.IPv6PrefixLen < 0 || c.IPv6PrefixLen > 128 {
		return fmt.Errorf("%w: httplimit: ip config: ipv6 prefix length must be between 1 and 128 (0 means 64), got %d", fleetrate.ErrInvalid, c.IPv6PrefixLen)
	}
	for i, p := range c.TrustedProxies {
		if !p.IsValid() {
			return fmt.Errorf("%w: httplimit: ip config: trusted proxies[%d] is not a valid prefix", fleetrate.ErrInvalid, i)
		}
	}
	return nil
}

// ParsePrefixes parses CIDRs such as "10.0.0.0/8" or "2001:db8::/32" for
// IPConfig.TrustedProxies; a bare address is a single-host prefix. The
// error names the first value that does not parse.
func ParsePrefixes(cidrs ...string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, s := range cidrs {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("httplimit: trusted proxy %q is neither a CIDR nor an address", s)
		}
		a = a.Unmap().WithZone("")
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

type ipResolver struct {
	trusted   []netip.Prefix
	forwarded bool
	single    string // a single-address header, or ""
	v4, v6    int
}

// ClientIP keys requests by the client's IP address, read as described
// in IPConfig: the TCP peer, or, behind trusted proxies, the address they
// report. Keys look like "ip:203.0.113.7/32" or "ip:2001:db8:1:2::/64".
func ClientIP(cfg IPConfig) (KeyFunc, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	res := &ipResolver{
		forwarded: http.CanonicalHeaderKey(cfg.Header) == HeaderForwarded,
		v4:        cfg.IPv4PrefixLen,
		v6:        cfg.IPv6PrefixLen,
	}
	for _, p := range cfg.TrustedProxies {
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		res.trusted = append(res.trusted, p.Masked())
	}
	switch h := http.CanonicalHeaderKey(cfg.Header); h {
	case HeaderCFConnectingIP, HeaderTrueClientIP, HeaderXRealIP:
		res.single = h
	}
	if res.v4 == 0 {
		res.v4 = 32
	}
	if res.v6 == 0 {
		res.v6 = 64
	}
	return func(r *http.Request) (string, error) {
		a, err := res.clientAddr(r)
		if err != nil {
			return "", err
		}
		bits := res.v6
		if a.Is4() {
			bits = res.v4
		}
		p, err := a.Prefix(bits)
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrNoKey, err)
		}
		return "ip:" + p.String(), nil
	}, nil
}

func (c *ipResolver) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// clientAddr walks the forwarding chain from the peer towards the client,
// believing each hop only while the hop that reported it is trusted.
func (c *ipResolver) clientAddr(r *http.Request) (netip.Addr, error) {
	peer, ok := parseHost(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, fmt.Errorf("%w: cannot parse the peer address %q", ErrNoKey, r.RemoteAddr)
	}
	if !c.isTrusted(peer) {
		return peer, nil
	}
	if c.single != "" {
		// One line holding one address, or the client is not known
		// better than by the trusted peer.
		if vals := r.Header.Values(c.single); len(vals) == 1 {
			if a, ok := parseHost(strings.TrimSpace(vals[0])); ok {
				return a, nil
			}
		}
		return peer, nil
	}
	var hops []string
	if c.forwarded {
		hops = forwardedFor(r.Header.Values(HeaderForwarded))
	} else {
		for _, line := range r.Header.Values(HeaderXForwardedFor) {
			hops = append(hops, strings.Split(line, ",")...)
		}
	}
	addr := peer
	for i := len(hops) - 1; i >= 0; i-- {
		h, ok := parseHost(strings.TrimSpace(hops[i]))
		if !ok {
			// "unknown", an obfuscated identifier or garbage: the client
			// cannot be known, so use the last trusted hop.
			return addr, nil
		}
		addr = h
		if !c.isTrusted(h) {
			return h, nil
		}
	}
	return addr, nil
}

// parseHost parses "addr", "addr:port", "[v6]" or "[v6]:port", and
// returns the address without zone, IPv4-mapped IPv6 unmapped.
func parseHost(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

// forwardedFor returns the for= value of every element of Forwarded
// field lines (RFC 7239), in order; an element without one contributes an
// empty hop, which stops the walk. Quoted strings may contain ',' and ';'.
func forwardedFor(lines []string) []string {
	var hops []string
	for _, line := range lines {
		for _, elem := range splitQuoted(line, ',') {
			if strings.TrimSpace(elem) == "" {
				continue
			}
			hop := ""
			for _, pair := range splitQuoted(elem, ';') {
				k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if ok && strings.EqualFold(strings.TrimSpace(k), "for") {
					hop = unquote(strings.TrimSpace(v))
				}
			}
			hops = append(hops, hop)
		}
	}
	return hops
}

// splitQuoted splits s at sep outside quoted strings.
func splitQuoted(s string, sep byte) []string {
	var out []string
	start, inQuote := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && inQuote:
			i++
		case c == '"':
			inQuote = !inQuote
		case c == sep && !inQuote:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

func unquote(v string) string {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return v
	}
	var b strings.Builder
	for i := 1; i < len(v)-1; i++ {
		if v[i] == '\\' && i+1 < len(v)-1 {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// maxVerbatimName is the longest key kept readable in a bucket name;
// longer keys are hashed.
const maxVerbatimName = 128

// bucketName turns a key into a bucket name that is safe in any store:
// bytes outside [A-Za-z0-9-._~:/@] are percent-encoded (so '{', '}',
// newlines and '%' itself never appear raw), and a name that would be
// longer than maxVerbatimName becomes '#' followed by the key's SHA-256.
// The mapping is injective: verbatim names have no '%' or '#', escaped
// ones have a '%', hashed ones start with '#'.
func bucketName(key string) string {
	n := 0
	for i := 0; i < len(key); i++ {
		if safeByte(key[i]) {
			n++
		} else {
			n += 3
		}
		if n > maxVerbatimName {
			sum := sha256.Sum256([]byte(key))
			return "#" + hex.EncodeToString(sum[:])
		}
	}
	if n == len(key) {
		return key
	}
	const hexDigits = "0123456789ABCDEF"
	b := make([]byte, 0, n)
	for i := 0; i < len(key); i++ {
		c := key[i]
		if safeByte(c) {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
	}
	return string(b)
}

func safeByte(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		c == '-' || c == '.' || c == '_' || c == '~' || c == ':' || c == '/' || c == '@'
}
