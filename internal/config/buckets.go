package config

import (
	"errors"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/fleetrate/fleetrate"
)

// bucketEntry is one entry of the buckets list, as the file gives it.
type bucketEntry struct {
	name, channel, endpoint string
	hasName, hasChannel     bool
	rl, rls, quotas         *yaml.Node
	inFlight                int64
}

// errRLSInFlight is why a descriptor of the RLS rules takes no in_flight.
const errRLSInFlight = "an in-flight bound cannot be enforced through Envoy's rate limit service: " +
	"RLS has no release, so a permit taken for a request would never come back; " +
	"put in_flight on a bucket of the buckets section and take with /v1/acquire and /v1/release"

// buckets parses the buckets list into cfg.
func (p *parser) buckets(n *yaml.Node, cfg *Config) {
	for i, item := range p.sequence(n, "buckets") {
		f := fmt.Sprintf("buckets[%d]", i)
		if b, ok := p.bucket(item, f, cfg); ok {
			cfg.byName[b.Name] = len(cfg.Buckets)
			cfg.byName[b.Key] = len(cfg.Buckets)
			cfg.Buckets = append(cfg.Buckets, b)
		}
	}
}

// bucket parses one entry of the buckets list.
func (p *parser) bucket(item *yaml.Node, f string, cfg *Config) (Bucket, bool) {
	pairs, ok := p.mapping(item, f, "name", "channel", "endpoint", "rate_limit", "rate_limits", "in_flight", "quotas")
	if !ok {
		return Bucket{}, false
	}
	var e bucketEntry
	for _, kv := range pairs {
		switch kv.key {
		case "name":
			e.name, _ = p.str(kv.val, join(f, "name"))
			e.hasName = true
		case "channel":
			e.channel, _ = p.str(kv.val, join(f, "channel"))
			e.hasChannel = true
		case "endpoint":
			e.endpoint, _ = p.str(kv.val, join(f, "endpoint"))
		case "rate_limit":
			e.rl = kv.val
		case "rate_limits":
			e.rls = kv.val
		case "quotas":
			e.quotas = kv.val
		case "in_flight":
			e.inFlight, _ = p.integer(kv.val, join(f, "in_flight"), 1, fleetrate.MaxInFlight)
		}
	}
	at := p.deref(item)
	b, ok := p.bucketName(e, at, f, cfg)
	if !ok {
		return Bucket{}, false
	}
	r := &Rule{}
	switch {
	case !p.limits(at, f, e.rl, e.rls, r, false):
		return Bucket{}, false
	case len(r.Limits) == 0:
		p.errorf(at, f, "needs rate_limit or rate_limits with at least one limit")
		return Bucket{}, false
	case r.Denies():
		p.errorf(at, f, "requests_per_unit 0 is not allowed on a bucket")
		return Bucket{}, false
	}
	b.Limits, b.InFlight = r.Limits, e.inFlight
	if e.quotas != nil {
		if b.Quotas, ok = p.quotas(e.quotas, join(f, "quotas")); !ok {
			return Bucket{}, false
		}
	}
	return b, true
}

// bucketName checks the entry's name (or channel and endpoint) and
// returns the bucket it names, without limits.
func (p *parser) bucketName(e bucketEntry, at *yaml.Node, f string, cfg *Config) (Bucket, bool) {
	switch {
	case e.hasName && (e.hasChannel || e.endpoint != ""):
		p.errorf(at, f, "give name, or channel and endpoint, not both")
		return Bucket{}, false
	case e.hasName:
		e.channel, e.endpoint, _ = strings.Cut(e.name, "/")
	}
	if err := checkBucketPart(e.channel, false); err != nil {
		p.errorf(at, join(f, "channel"), "%v", err)
		return Bucket{}, false
	}
	if err := checkBucketPart(e.endpoint, true); err != nil {
		p.errorf(at, join(f, "endpoint"), "%v", err)
		return Bucket{}, false
	}
	b := Bucket{Channel: e.channel, Endpoint: e.endpoint, Name: e.channel, Key: BucketKey(e.channel, e.endpoint), File: p.file, Line: at.Line}
	if e.endpoint != "" {
		b.Name += "/" + e.endpoint
	}
	if len(b.Key) > fleetrate.MaxNameLen {
		p.errorf(at, f, "bucket name must be at most %d bytes, got %d", fleetrate.MaxNameLen, len(b.Key))
		return Bucket{}, false
	}
	if j, dup := cfg.byName[b.Name]; dup {
		p.errorf(at, f, "duplicate bucket %q (first on line %d)", b.Name, cfg.Buckets[j].Line)
		return Bucket{}, false
	}
	return b, true
}

// checkBucketPart validates a channel or endpoint name.
func checkBucketPart(s string, optional bool) error {
	switch {
	case s == "" && optional:
		return nil
	case s == "":
		return errors.New("must not be empty")
	case strings.ContainsAny(s, "{}"):
		return fmt.Errorf("must not contain { or }, got %q", s)
	case strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return fmt.Errorf("must not contain control characters, got %q", s)
	case !optional && strings.Contains(s, "/"):
		return fmt.Errorf("must not contain /, got %q", s)
	}
	return nil
}
