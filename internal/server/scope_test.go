package server

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

func TestParseTokenFile(t *testing.T) {
	t.Parallel()
	toks, err := ParseTokenFile([]byte("# comment\nplain\n\n  ops\tadmin,decide \nall-of-it all\nplus decide+store\n"), DefaultTokenScopes)
	if err != nil {
		t.Fatal(err)
	}
	want := []Token{{"plain", ScopeDecide | ScopeStore}, {"ops", ScopeAdmin | ScopeDecide}, {"all-of-it", ScopeAll}, {"plus", ScopeDecide | ScopeStore}}
	if len(toks) != len(want) {
		t.Fatalf("got %v, want %v", toks, want)
	}
	for i := range want {
		if toks[i] != want[i] {
			t.Errorf("token %d: got %v, want %v", i, toks[i], want[i])
		}
	}
	for _, bad := range []struct{ in, want string }{
		{"tok root", `line 1: fleetrate: invalid: unknown scope "root" (want decide, store, admin or all)`},
		{"ok\ntok decide,,", ""},

		{"ok\n\ntok decide,superuser", `line 3: fleetrate: invalid: unknown scope "superuser" (want decide, store, admin or all)`},
	} {
		_, err := ParseTokenFile([]byte(bad.in), DefaultTokenScopes)
		if bad.want == "" {
			if err != nil {
				t.Errorf("%q: %v", bad.in, err)
			}
			continue
		}
		if err == nil || err.Error() != bad.want {
			t.Errorf("%q: error %v, want %q", bad.in, err, bad.want)
		}
		if err != nil && strings.Contains(err.Error(), "tok ") {
			t.Errorf("%q: the error shows the token: %v", bad.in, err)
		}
	}
}

func TestParseTokenList(t *testing.T) {
	t.Parallel()
	toks, err := ParseTokenList(" w0rker , 0ps:admin+decide,,", DefaultTokenScopes)
	if err != nil {
		t.Fatal(err)
	}
	if len(toks) != 2 || toks[0] != (Token{"w0rker", DefaultTokenScopes}) || toks[1] != (Token{"0ps", ScopeAdmin | ScopeDecide}) {
		t.Errorf("got %v", toks)
	}
	if _, err := ParseTokenList("a,s3cret:sudo", DefaultTokenScopes); err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "token 2") {
		t.Errorf("unknown scope: %v, want an error naming token 2 without its secret", err)
	}
}

func TestScopeString(t *testing.T) {
	t.Parallel()
	for s := range ScopeAll + 1 {
		got, err := ParseScopes(s.String())
		if s == 0 {
			if err == nil {
				t.Errorf("ParseScopes(%q) = %v, want an error", s.String(), got)
			}
			continue
		}
		if err != nil || got != s {
			t.Errorf("ParseScopes(%q) = %v, %v, want %v", s.String(), got, err, s)
		}
	}
}

// FuzzParseTokens feeds arbitrary token files and lists to the parsers:
// they never panic, and every token they return is non-empty, without
// spaces, and carries a known, non-empty set of scopes.
func FuzzParseTokens(f *testing.F) {
	for _, s := range []string{"tok", "tok decide", "# c\n a \tadmin,store\n", "a:decide+admin,b", "x all", "x ,", "x:", ":admin", "a b c", "\x00 decide"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		file, errFile := ParseTokenFile([]byte(in), DefaultTokenScopes)
		list, errList := ParseTokenList(in, DefaultTokenScopes)
		for _, toks := range [][]Token{file, list} {
			for _, tok := range toks {
				if tok.Scopes == 0 || tok.Scopes&^ScopeAll != 0 {
					t.Fatalf("%q: token with scopes %#x", in, uint8(tok.Scopes))
				}
				if err := (AccessOptions{Tokens: []Token{tok}}).validate(nil); err != nil {
					t.Fatalf("%q: parsed token %q refused: %v", in, tok.Secret, err)
				}
			}
		}
		_, _ = errFile, errList
	})
}

// FuzzParseGrant feeds arbitrary strings to the grant parser: it never
// panics and accepts nothing but a grant the key signed; a grant it
// issued parses back to its claim, and any change of one character is
// refused.
func FuzzParseGrant(f *testing.F) {
	key := []byte(strings.Repeat("k", MinGrantKeyBytes))
	g, err := newGrants(key, DefaultGrantTTL)
	if err != nil {
		f.Fatal(err)
	}
	valid := g.issue(grantRefund, "id", []fleetrate.Bucket{{Prefix: "p:", Key: "k"}}, 3, 42, nil, time.Unix(1e9, 0))
	for _, s := range []string{"", valid, strings.Repeat("A", 94), valid[:50], valid + "A"} {
		f.Add(s, 0, byte(0))
	}
	f.Fuzz(func(t *testing.T, s string, at int, flip byte) {
		if _, reason := g.parseGrant(s); reason == "" && !signed(s, key) {
			t.Fatalf("%q: accepted a grant the key did not sign", s)
		}
		cl, reason := g.parseGrant(valid)
		if reason != "" || cl.n != 3 || cl.at != 42 || cl.kind != grantRefund {
			t.Fatalf("issued grant: %+v %q", cl, reason)
		}
		if flip == 0 || len(valid) == 0 {
			return
		}
		b := []byte(valid)
		i := (at%len(b) + len(b)) % len(b)
		b[i] ^= flip
		if _, reason := g.parseGrant(string(b)); reason == "" && string(b) != valid {
			t.Fatalf("grant with byte %d changed accepted", i)
		}
	})
}

// signed reports whether s is the canonical base64url of a grant body
// followed by its HMAC-SHA256 under key, computed here independently.
func signed(s string, key []byte) bool {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(raw) != grantBody+grantMAC || base64.RawURLEncoding.EncodeToString(raw) != s {
		return false
	}
	m := hmac.New(sha256.New, key)
	m.Write(raw[:grantBody])
	return hmac.Equal(m.Sum(nil)[:grantMAC], raw[grantBody:])
}
