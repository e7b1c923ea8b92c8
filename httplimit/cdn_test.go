package httplimit

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestSingleAddressHeaders(t *testing.T) {
	t.Parallel()
	trusted, err := ParsePrefixes("10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		header string
		peer   string
		values []string
		extra  map[string]string
		want   string
	}{
		{"cloudflare", HeaderCFConnectingIP, "10.1.1.1:443", []string{"198.51.100.7"}, nil, "ip:198.51.100.7/32"},
		{"akamai, IPv6 grouped by /64", HeaderTrueClientIP, "10.1.1.1:443", []string{"2001:db8:1:2::99"}, nil, "ip:2001:db8:1:2::/64"},
		{"nginx", HeaderXRealIP, "10.1.1.1:443", []string{" 203.0.113.4 "}, nil, "ip:203.0.113.4/32"},
		{"lower-case header name in config", "cf-connecting-ip", "10.1.1.1:443", []string{"198.51.100.7"}, nil, "ip:198.51.100.7/32"},
		{"spoofed from an untrusted peer", HeaderCFConnectingIP, "203.0.113.9:5000", []string{"198.51.100.7"}, nil, "ip:203.0.113.9/32"},
		{"given twice", HeaderCFConnectingIP, "10.1.1.1:443", []string{"198.51.100.7", "198.51.100.8"}, nil, "ip:10.1.1.1/32"},
		{"a list, not one address", HeaderCFConnectingIP, "10.1.1.1:443", []string{"6.6.6.6, 198.51.100.7"}, nil, "ip:10.1.1.1/32"},
		{"garbage", HeaderCFConnectingIP, "10.1.1.1:443", []string{"unknown"}, nil, "ip:10.1.1.1/32"},
		{"missing", HeaderCFConnectingIP, "10.1.1.1:443", nil, nil, "ip:10.1.1.1/32"},
		{"other headers are not read", HeaderCFConnectingIP, "10.1.1.1:443", nil,
			map[string]string{HeaderXForwardedFor: "6.6.6.6", HeaderTrueClientIP: "6.6.6.7", HeaderXRealIP: "6.6.6.8"}, "ip:10.1.1.1/32"},
	}
	for _, tt := range tests {
		key, err := ClientIP(IPConfig{TrustedProxies: trusted, Header: tt.header})
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = tt.peer
		for _, v := range tt.values {
			r.Header.Add(tt.header, v)
		}
		for k, v := range tt.extra {
			r.Header.Set(k, v)
		}
		if got, err := key(r); err != nil || got != tt.want {
			t.Errorf("%s: key %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
	if _, err := ClientIP(IPConfig{Header: "X-Client-IP"}); err == nil || !strings.Contains(err.Error(), "X-Client-IP") {
		t.Errorf("unknown header accepted: %v", err)
	}
}

// TestCDNClientIPThroughAServer runs the middleware behind a real server
// whose peer (127.0.0.1) is, or is not, the trusted CDN: only from the CDN
// do distinct CF-Connecting-IP values get distinct buckets; a client that
// forges the header directly still shares its own single bucket.
func TestCDNClientIPThroughAServer(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, trusted string
		want          int // admitted of 2 × 25 requests from two claimed addresses
	}{
		{"peer is the trusted CDN", "127.0.0.0/8", 40},
		{"peer is not trusted: forged headers ignored", "10.0.0.0/8", 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			trusted, err := ParsePrefixes(tt.trusted)
			if err != nil {
				t.Fatal(err)
			}
			key, err := ClientIP(IPConfig{TrustedProxies: trusted, Header: HeaderCFConnectingIP})
			if err != nil {
				t.Fatal(err)
			}
			cfg := memConfig(newClock())
			cfg.Key = key
			srv := httptest.NewServer(limited(t, cfg, messagesPolicy(), &okHandler{}))
			t.Cleanup(srv.Close)
			admitted := 0
			for _, claimed := range []string{"198.51.100.7", "198.51.100.8"} {
				for range 25 {
					req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
					req.Header.Set(HeaderCFConnectingIP, claimed)
					resp, err := srv.Client().Do(req)
					if err != nil {
						t.Fatal(err)
					}
					_ = resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						admitted++
					}
				}
			}
			if admitted != tt.want {
				t.Errorf("%d admitted, want %d", admitted, tt.want)
			}
		})
	}
}
