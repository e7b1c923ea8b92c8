package server

import (
	"errors"
)

// errNoDomain is /readyz's error while Options.HealthyWithConfig holds the
// server out of rotation.
var errNoDomain = errors.New("no configuration with a domain loaded yet (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED)")

// configMissing reports whether Options.HealthyWithConfig fails the
// health checks: the configuration in force has no domain.
func (s *Server) configMissing() bool {
	return s.opts.HealthyWithConfig && len(s.Config().Domains) == 0
}

// configReady is /readyz's check of the configuration: errNoDomain while
// configMissing.
func (s *Server) configReady() error {
	if s.configMissing() {
		return errNoDomain
	}
	return nil
}

// refreshHealth sets the gRPC health status from everything that fails
// it: shutdown, the store's probe (with Options.HealthChecksStore) and a
// configuration without a domain (with Options.HealthyWithConfig).
func (s *Server) refreshHealth() {
	s.setHealth(!s.draining.Load() && !(s.opts.HealthChecksStore && s.storeDown.Load()) && !s.configMissing())
}
