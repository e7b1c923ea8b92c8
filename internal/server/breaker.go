package server

import (
	"errors"

	"github.com/fleetrate/fleetrate"
)

// Breaker is a circuit breaker in front of the store, as failsafe.Store
// is: Open reports whether it currently keeps calls from the store.
type Breaker interface {
	Open() bool
}

// errDegraded is /readyz's answer when the store's failure policy, not
// the store, answered the probe (fail_open or local_fallback).
var errDegraded = errors.New("the store does not answer: decisions follow the failure policy")

// degradedErr is err, or errDegraded when the probe's result came from
// the failure policy rather than the store.
func degradedErr(res fleetrate.Result, err error) error {
	if err == nil && res.Degraded {
		return errDegraded
	}
	return err
}

// readyBody is /readyz's body: body, with the breaker's state when the
// server has a breaker ("open" while it keeps calls from the store, else
// "closed").
func (s *Server) readyBody(body map[string]string) map[string]string {
	if s.opts.Breaker == nil {
		return body
	}
	body["breaker"] = "closed"
	if s.opts.Breaker.Open() {
		body["breaker"] = "open"
	}
	return body
}
