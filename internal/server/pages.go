package server

import (
	"net/http"

	"github.com/fleetrate/fleetrate/internal/server/wire"
)

// mountPages serves Options.Pages, each behind the bearer tokens.
func (s *Server) mountPages(mux *http.ServeMux) {
	for pattern, h := range s.opts.Pages {
		mux.Handle(pattern, s.page(h))
	}
}

// page checks the bearer token, or a token given as the password of HTTP
// Basic authentication (any user name), before serving h. A request with
// neither is asked for Basic credentials, so a browser shows its login
// prompt and then sends them with every request to the page.
func (s *Server) page(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok := s.authorized(r.Header.Get("Authorization"))
		if _, pw, basic := r.BasicAuth(); !ok && basic {
			ok = s.authorized("Bearer " + pw)
		}
		if !ok {
			w.Header().Add("WWW-Authenticate", `Basic realm="fleetrate", charset="UTF-8"`)
			w.Header().Add("WWW-Authenticate", `Bearer realm="fleetrate"`)
			writeError(w, &httpError{status: http.StatusUnauthorized, code: wire.CodeUnauthorized,
				msg: "missing or wrong token: give a bearer token, or a token as the Basic password"})
			return
		}
		h.ServeHTTP(w, r)
	})
}
