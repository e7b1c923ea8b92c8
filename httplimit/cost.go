package httplimit

import "net/http"

// CostFunc returns how many tokens a request costs. A cost of 0 lets the
// request through without consuming (it is still refused while the bucket
// is in debt). An error answers 400 Bad Request.
type CostFunc func(*http.Request) (int64, error)

// Weight returns a CostFunc charging n tokens for every request: give an
// expensive route a policy with Weight(5) and a cheap one Weight(1).
// A negative n is treated as 0.
func Weight(n int64) CostFunc {
	n = max(n, 0)
	return func(*http.Request) (int64, error) { return n, nil }
}

// BodySize returns a CostFunc charging one token per started unit bytes
// of the request body as announced by Content-Length, at least 1 token.
// A body of unknown length (chunked) or longer than maxBytes is charged
// as maxBytes: pair this with http.MaxBytesReader(w, r.Body, maxBytes) in
// the handler so that the body cannot be longer than what was paid for.
// A unit below 1 is treated as 1, a negative maxBytes as 0.
func BodySize(unit, maxBytes int64) CostFunc {
	unit, maxBytes = max(unit, 1), max(maxBytes, 0)
	return func(r *http.Request) (int64, error) {
		n := r.ContentLength
		if n < 0 || n > maxBytes {
			n = maxBytes
		}
		return max(1, n/unit+min(n%unit, 1)), nil
	}
}
