package server

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
)

// SetConfig puts cfg in force at once. Requests already deciding finish
// with the configuration they started with.
func (s *Server) SetConfig(cfg *config.Config) {
	s.state.Store(s.newState(cfg))
	s.metrics.lastReload.SetToCurrentTime()
	if s.opts.HealthyWithConfig {
		s.refreshHealth()
	}
}

// Reload reads ConfigPath again. A file that fails to load leaves the
// configuration in force unchanged; the error says why, and is logged.
// A file identical to the one in force is not reloaded.
func (s *Server) Reload() error {
	if s.opts.ConfigPath == "" {
		return fmt.Errorf("%w: server: no config file to reload", fleetrate.ErrInvalid)
	}
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	cfg, err := config.LoadPath(s.opts.ConfigPath, s.opts.ConfigOptions)
	if err == nil {
		err = emptied(s.Config(), cfg)
	}
	if err != nil {
		s.metrics.reloads.WithLabelValues(reloadFailure).Inc()
		s.metrics.reloadFailing.Set(1)
		s.log.Error("config reload failed; keeping the configuration in force",
			"path", s.opts.ConfigPath, "error", err.Error())
		return err
	}
	s.tried = cfg.Hash
	s.metrics.reloadFailing.Set(0)
	if cfg.Hash == s.Config().Hash {
		s.metrics.reloads.WithLabelValues(reloadUnchanged).Inc()
		s.log.Info("config unchanged", "path", s.opts.ConfigPath)
		return nil
	}
	if !reflect.DeepEqual(cfg.Settings, s.Config().Settings) {
		s.log.Warn("config reload: the server section changed; restart to apply it", "path", s.opts.ConfigPath)
	}
	s.SetConfig(cfg)
	s.logNotices(cfg)
	s.metrics.reloads.WithLabelValues(reloadSuccess).Inc()
	domains, rules, buckets := cfg.Summary()
	s.log.Info("config reloaded", "path", s.opts.ConfigPath, "domains", domains, "rules", rules, "buckets", buckets)
	return nil
}

// emptied refuses a reload from a configuration with limits to one with
// none: what an editor's truncate-then-write, a half-copied file or a
// ConfigMap key moved away leaves for a moment, which would switch every
// limit off. A configuration meant to limit nothing is started with.
func emptied(old, cfg *config.Config) error {
	_, oldRules, oldBuckets := old.Summary()
	_, rules, buckets := cfg.Summary()
	if rules+buckets == 0 && oldRules+oldBuckets > 0 {
		return fmt.Errorf("%w: %s: the new configuration defines no limits (an empty or truncated file?): a reload does not switch every limit off; restart to run without limits", fleetrate.ErrInvalid, cfg.Path)
	}
	return nil
}

// logNotices logs, once per load, what the configuration says that has no
// effect.
func (s *Server) logNotices(cfg *config.Config) {
	for _, n := range cfg.Notices {
		s.log.Warn("config: "+n.Msg, "at", n.String())
	}
}

// watch reloads the config file whenever its content changes.
func (s *Server) watch(ctx context.Context) {
	every(ctx, s.opts.ReloadInterval, func() bool {
		h, err := config.Fingerprint(s.opts.ConfigPath, s.opts.ConfigOptions)
		if err != nil {
			return true // a file being replaced may be missing for a moment
		}
		if h != s.lastTried() {
			_ = s.Reload()
			s.reloadMu.Lock()
			s.tried = h
			s.reloadMu.Unlock()
		}
		return true
	})
}

// every calls f every d until ctx ends or f returns false.
func every(ctx context.Context, d time.Duration, f func() bool) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !f() {
			return
		}
	}
}

func (s *Server) lastTried() [32]byte {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	return s.tried
}
