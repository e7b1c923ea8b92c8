package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/httplimit"
)

// Limits of the API's input.
const (
	maxBodyBytes      = 64 << 10
	maxToLen          = 320
	maxBodyRunes      = 4096
	maxKeyLen         = 512
	maxMessagesPerKey = 1000
	listLimit         = 50
)

// serverConfig configures the API handler.
type serverConfig struct {
	// Store keeps the rate-limit buckets. Required.
	Store fleetrate.Store
	// Rate and Burst limit POST /v1/messages per API key; reads get five
	// times both.
	Rate  float64
	Burst int64
	// FailClosed, Shadow and LegacyHeaders are passed to the middleware.
	FailClosed, Shadow, LegacyHeaders bool
	// Timeout bounds each store call; zero means httplimit.DefaultTimeout.
	Timeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the middleware's metrics; nil means none.
	Registerer prometheus.Registerer
	// Now stamps messages; the default is time.Now.
	Now func() time.Time
}

// message is one stored message.
type message struct {
	ID        string    `json:"id"`
	To        string    `json:"to"`
	Body      string    `json:"body"`
	CreatedAt time.Time `json:"created_at"`
}

// server is the message API. Messages are kept per API key (by its hash).
type server struct {
	now func() time.Time

	mu    sync.Mutex
	byKey map[string][]message
}

// apiKeyFunc identifies clients by X-API-Key or an Authorization bearer
// token.
var apiKeyFunc = httplimit.FirstOf(httplimit.APIKey("X-API-Key"), httplimit.APIKey("Authorization"))

// newServer returns the API's handler, or an error naming a bad setting.
func newServer(cfg serverConfig) (http.Handler, error) {
	if cfg.Rate <= 0 || cfg.Burst < 1 {
		return nil, fmt.Errorf("rate must be positive and burst at least 1, got rate %g burst %d", cfg.Rate, cfg.Burst)
	}
	s := &server{now: cfg.Now, byKey: map[string][]message{}}
	if s.now == nil {
		s.now = time.Now
	}
	m, err := httplimit.New(httplimit.Config{
		Store:         cfg.Store,
		Prefix:        "messages:",
		Key:           apiKeyFunc,
		FailClosed:    cfg.FailClosed,
		Shadow:        cfg.Shadow,
		LegacyHeaders: cfg.LegacyHeaders,
		Timeout:       cfg.Timeout,
		Logger:        cfg.Logger,
		Registerer:    cfg.Registerer,
	})
	if err != nil {
		return nil, err
	}
	create, err := m.Limit(httplimit.Policy{
		Name:   "messages",
		Limits: []fleetrate.Limit{fleetrate.PerSecond(cfg.Rate, cfg.Burst)},
	})
	if err != nil {
		return nil, err
	}
	read, err := m.Limit(httplimit.Policy{
		Name:   "reads",
		Limits: []fleetrate.Limit{fleetrate.PerSecond(5*cfg.Rate, 5*cfg.Burst)},
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/messages", authenticated(create(http.HandlerFunc(s.create))))
	mux.Handle("GET /v1/messages", authenticated(read(http.HandlerFunc(s.list))))
	mux.Handle("GET /v1/messages/{id}", authenticated(read(http.HandlerFunc(s.get))))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	return mux, nil
}

// fieldError is one validation failure, an extension member of the
// problem details.
type fieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// problem is an RFC 9457 problem details body.
type problem struct {
	Type   string       `json:"type,omitempty"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Detail string       `json:"detail,omitempty"`
	Errors []fieldError `json:"errors,omitempty"`
}

func writeProblem(w http.ResponseWriter, status int, detail string, errs ...fieldError) {
	writeJSON(w, status, httplimit.ProblemContentType, problem{
		Title: http.StatusText(status), Status: status, Detail: detail, Errors: errs,
	})
}

func writeJSON(w http.ResponseWriter, status int, contentType string, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// ownerKey is the hash identifying an API key's messages.
type ownerKey struct{}

// authenticated requires an API key; a real service would look it up.
// It runs before the rate limiter, so the limiter always has a key.
func authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		owner, err := apiKeyFunc(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="messages"`)
			writeProblem(w, http.StatusUnauthorized, "send your API key in the X-API-Key header or as Authorization: Bearer <key>")
			return
		}
		if len(r.Header.Get("X-API-Key")) > maxKeyLen || len(r.Header.Get("Authorization")) > maxKeyLen+7 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="messages", error="invalid_token"`)
			writeProblem(w, http.StatusUnauthorized, fmt.Sprintf("API keys are at most %d bytes", maxKeyLen))
			return
		}
		next.ServeHTTP(w, r.WithContext(contextWithOwner(r, owner)))
	})
}

func (s *server) create(w http.ResponseWriter, r *http.Request) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeProblem(w, http.StatusUnsupportedMediaType, "send the message as Content-Type: application/json")
		return
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	var in struct {
		To   *string `json:"to"`
		Body *string `json:"body"`
	}
	if err := dec.Decode(&in); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeProblem(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body must be at most %d bytes", maxBodyBytes))
			return
		}
		writeProblem(w, http.StatusBadRequest, "the request body is not a valid message object: "+err.Error())
		return
	}
	if dec.More() {
		writeProblem(w, http.StatusBadRequest, "the request body must hold exactly one JSON object")
		return
	}
	var errs []fieldError
	switch {
	case in.To == nil || strings.TrimSpace(*in.To) == "":
		errs = append(errs, fieldError{"to", "is required"})
	case utf8.RuneCountInString(*in.To) > maxToLen:
		errs = append(errs, fieldError{"to", fmt.Sprintf("must be at most %d characters", maxToLen)})
	}
	switch {
	case in.Body == nil || strings.TrimSpace(*in.Body) == "":
		errs = append(errs, fieldError{"body", "is required"})
	case utf8.RuneCountInString(*in.Body) > maxBodyRunes:
		errs = append(errs, fieldError{"body", fmt.Sprintf("must be at most %d characters", maxBodyRunes)})
	}
	if len(errs) > 0 {
		writeProblem(w, http.StatusUnprocessableEntity, "the message is invalid", errs...)
		return
	}
	msg := message{ID: newID(), To: strings.TrimSpace(*in.To), Body: *in.Body, CreatedAt: s.now().UTC()}
	owner := ownerFrom(r)
	s.mu.Lock()
	msgs := append(s.byKey[owner], msg)
	if len(msgs) > maxMessagesPerKey {
		msgs = msgs[len(msgs)-maxMessagesPerKey:]
	}
	s.byKey[owner] = msgs
	s.mu.Unlock()
	w.Header().Set("Location", "/v1/messages/"+msg.ID)
	writeJSON(w, http.StatusCreated, "application/json", msg)
}

func (s *server) get(w http.ResponseWriter, r *http.Request) {
	id, owner := r.PathValue("id"), ownerFrom(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.byKey[owner] {
		if m.ID == id {
			writeJSON(w, http.StatusOK, "application/json", m)
			return
		}
	}
	writeProblem(w, http.StatusNotFound, "no message with this id")
}

func (s *server) list(w http.ResponseWriter, r *http.Request) {
	owner := ownerFrom(r)
	s.mu.Lock()
	msgs := s.byKey[owner]
	out := make([]message, 0, min(len(msgs), listLimit))
	for i := len(msgs) - 1; i >= 0 && len(out) < listLimit; i-- {
		out = append(out, msgs[i])
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, "application/json", struct {
		Messages []message `json:"messages"`
	}{out})
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "msg_" + hex.EncodeToString(b[:])
}

func contextWithOwner(r *http.Request, owner string) context.Context {
	return context.WithValue(r.Context(), ownerKey{}, owner)
}

func ownerFrom(r *http.Request) string {
	owner, _ := r.Context().Value(ownerKey{}).(string)
	return owner
}
