package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestPagesAreBehindTheTokens(t *testing.T) {
	t.Parallel()
	page := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "page "+r.URL.Path) })
	ts := start(t, bucketConfig, func(o *Options) {
		o.Access.Tokens = []Token{{Secret: "tok", Scopes: ScopeAdmin}}
		o.Pages = map[string]http.Handler{"/status/": page}
	})
	for _, tc := range []struct {
		name string
		auth func(*http.Request)
		want int
	}{
		{"no token", func(*http.Request) {}, http.StatusUnauthorized},
		{"wrong bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope") }, http.StatusUnauthorized},
		{"wrong basic", func(r *http.Request) { r.SetBasicAuth("ops", "nope") }, http.StatusUnauthorized},
		{"bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer tok") }, http.StatusOK},
		{"basic password", func(r *http.Request) { r.SetBasicAuth("anyone", "tok") }, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(ctxT(t), http.MethodGet, ts.url+"/status/x", nil)
			if err != nil {
				t.Fatal(err)
			}
			tc.auth(req)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.want, body)
			}
			if tc.want == http.StatusOK && string(body) != "page /status/x" {
				t.Errorf("body %q, want the page's", body)
			}
			if tc.want == http.StatusUnauthorized && !strings.HasPrefix(strings.Join(resp.Header.Values("WWW-Authenticate"), ","), `Basic realm="fleetrate"`) {
				t.Errorf("WWW-Authenticate = %q, want a Basic challenge first, so browsers prompt", resp.Header.Values("WWW-Authenticate"))
			}
		})
	}
}
