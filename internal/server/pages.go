package server

import "net/http"

// mountPages serves Options.Pages, each behind the admin scope.
func (s *Server) mountPages(mux *http.ServeMux) {
	for pattern, h := range s.opts.Pages {
		mux.Handle(pattern, s.page(pattern, h))
	}
}

// page checks the admin scope, from a bearer token or a token given as the
// password of HTTP Basic authentication (any user name), before serving h.
// A request with neither is asked for Basic credentials, so a browser
// shows its login prompt and then sends them with every request to the
// page.
func (s *Server) page(pattern string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pw, basic := r.BasicAuth(); basic {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+pw)
		}
		if _, reason := s.access.identify(r.Header.Get("Authorization"), r.RemoteAddr); reason != "" {
			w.Header().Add("WWW-Authenticate", `Basic realm="fleetrate", charset="UTF-8"`)
		}
		ctx, ok := s.access.admit(w, r, pattern, ScopeAdmin)
		if !ok {
			return
		}
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}
