package httplimit

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
)

// ProblemContentType is the media type of problem details (RFC 9457).
const ProblemContentType = "application/problem+json"

// ProblemQuotaExceeded is the problem type the ratelimit-headers draft
// registers for requests refused because a quota is exhausted.
const ProblemQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// Problem is a problem details object (RFC 9457), the body of every
// response the middleware writes itself.
type Problem struct {
	// Type is a URI identifying the problem type; empty means
	// "about:blank", whose title is the status text.
	Type string `json:"type,omitempty"`
	// Title is a short summary of the problem type.
	Title string `json:"title"`
	// Status is the HTTP status code.
	Status int `json:"status"`
	// Detail explains this occurrence.
	Detail string `json:"detail,omitempty"`
	// ViolatedPolicies names the exhausted quota policies, as in the
	// RateLimit headers (the draft's extension member).
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

// writeProblem writes p as the response with the given status.
func writeProblem(w http.ResponseWriter, status int, p *Problem) {
	p.Status = status
	body, err := json.Marshal(p)
	if err != nil {
		body = []byte(`{"title":"Internal Server Error","status":500}`)
		status = http.StatusInternalServerError
	}
	h := w.Header()
	h.Set("Content-Type", ProblemContentType)
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// WriteProblem writes a problem details response, for KeyError handlers
// and applications that answer like the middleware does.
func WriteProblem(w http.ResponseWriter, status int, p Problem) {
	writeProblem(w, status, &p)
}

func defaultKeyError(w http.ResponseWriter, _ *http.Request, err error) {
	if errors.As(err, new(misconfigured)) {
		// A key function of httplimit's, misconfigured: the server's
		// fault, not the client's.
		writeProblem(w, http.StatusInternalServerError, &Problem{
			Title:  http.StatusText(http.StatusInternalServerError),
			Detail: "the rate limiter's key function is misconfigured: " + err.Error(),
		})
		return
	}
	detail := "cannot identify the client of this request"
	if errors.Is(err, ErrNoKey) {
		detail += ": " + err.Error()
	}
	writeProblem(w, http.StatusBadRequest, &Problem{
		Title:  http.StatusText(http.StatusBadRequest),
		Detail: detail,
	})
}
