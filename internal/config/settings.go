package config

import (
	"fmt"
	"math"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// settings parses the server section into s. It is long because it is a
// table: each key names its field once, grouped by the parser of its
// type, and the loop that follows dispatches on the group.
func (p *parser) settings(n *yaml.Node, s *Settings) {
	strs := map[string]**string{
		"http_addr": &s.HTTPAddr, "grpc_addr": &s.GRPCAddr, "redis": &s.Redis, "prefix": &s.Prefix,
		"auth_token_file": &s.AuthTokenFile, "tls_cert_file": &s.TLSCertFile, "tls_key_file": &s.TLSKeyFile,
		"tls_client_ca_file": &s.TLSClientCAFile, "log_format": &s.LogFormat, "log_level": &s.LogLevel,
		"limit_header_limit": &s.LimitHeaderLimit, "limit_header_remaining": &s.LimitHeaderRemaining, "limit_header_reset": &s.LimitHeaderReset, "tls_client_san": &s.TLSClientSAN,
		"redis_tls_ca_file": &s.RedisTLSCAFile, "redis_tls_cert_file": &s.RedisTLSCertFile, "redis_tls_key_file": &s.RedisTLSKeyFile,
		"metrics_addr": &s.MetricsAddr, "metrics_path": &s.MetricsPath,
		"failure_policy": &s.FailurePolicy,
	}
	durs := map[string]**time.Duration{
		"max_wait": &s.MaxWait, "read_timeout": &s.ReadTimeout, "write_timeout": &s.WriteTimeout,
		"idle_timeout": &s.IdleTimeout, "shutdown_timeout": &s.ShutdownTimeout, "drain_delay": &s.DrainDelay, "store_timeout": &s.StoreTimeout,
		"grpc_max_connection_age": &s.GRPCMaxConnAge, "grpc_max_connection_age_grace": &s.GRPCMaxConnAgeGrace, "grpc_keepalive_time": &s.GRPCKeepaliveTime, "grpc_keepalive_timeout": &s.GRPCKeepaliveTimeout,
		"reload_interval":  &s.ReloadInterval,
		"breaker_cool_off": &s.BreakerCoolOff, "latency_target": &s.LatencyTarget,
	}
	bools := map[string]**bool{
		"response_headers": &s.ResponseHeaders, "shadow_mode": &s.ShadowMode, "store_api": &s.StoreAPI,
		"redis_batch": &s.RedisBatch, "health_checks_store": &s.HealthChecksStore, "tls_http": &s.TLSHTTP,
		"quota_mode": &s.QuotaMode, "fixed_window": &s.FixedWindow, "adaptive_procs": &s.AdaptiveProcs, "response_dynamic_metadata": &s.ResponseDynamicMetadata,
		"limit_headers": &s.LimitHeaders, "redis_tls_skip_hostname_verification": &s.RedisTLSSkipHostname,
	}
	type bounded struct {
		dst    **int64
		lo, hi int64
	}
	ints := map[string]bounded{
		"max_request_bytes": {&s.MaxRequestBytes, 1, 1 << 30},
		// The flags' bounds: any positive count (0 or more bytes for the
		// cache, where 0 is off).
		"memory_max_keys":        {&s.MemoryMaxKeys, 1, math.MaxInt64},
		"memory_max_bytes":       {&s.MemoryMaxBytes, 1, math.MaxInt64},
		"max_metric_descriptors": {&s.MaxMetricDescriptors, 1, math.MaxInt64},
		"local_cache_bytes":      {&s.LocalCacheBytes, 0, math.MaxInt64},
		"breaker_failures":       {&s.BreakerFailures, 1, math.MaxInt32},
		"fleet_size":             {&s.FleetSize, 1, math.MaxInt32},
		"max_in_flight":          {&s.MaxInFlight, 1, math.MaxInt64},
	}
	allowed := []string{"near_limit_ratio"}
	for k := range ints {
		allowed = append(allowed, k)
	}
	for k := range strs {
		allowed = append(allowed, k)
	}
	for k := range durs {
		allowed = append(allowed, k)
	}
	for k := range bools {
		allowed = append(allowed, k)
	}
	slices.Sort(allowed)
	pairs, _ := p.mapping(n, "server", allowed...)
	for _, kv := range pairs {
		f := join("server", kv.key)
		if dst, ok := strs[kv.key]; ok {
			if v, ok := p.str(kv.val, f); ok {
				*dst = &v
			}
		} else if dst, ok := durs[kv.key]; ok {
			if v, ok := p.duration(kv.val, f); ok {
				*dst = &v
			}
		} else if dst, ok := bools[kv.key]; ok {
			if v, ok := p.boolean(kv.val, f); ok {
				*dst = &v
			}
		} else if b, ok := ints[kv.key]; ok {
			if v, ok := p.integer(kv.val, f, b.lo, b.hi); ok {
				*b.dst = &v
			}
		} else if kv.key == "near_limit_ratio" {
			if v, ok := p.ratio(kv.val, f); ok {
				s.NearLimitRatio = &v
			}
		}
	}
}

// metadata parses a descriptor's metadata: any mapping, sent back to
// Envoy as dynamic metadata when the descriptor's limit applies and the
// request passes, as envoyproxy/ratelimit does.
func (p *parser) metadata(n *yaml.Node, field string) *structpb.Struct {
	n = p.deref(n)
	if n == nil {
		p.errorf(nil, field, "too deeply aliased")
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, field, "must be a mapping (key: value), got %s", kindName(n))
		return nil
	}
	var v map[string]any
	if err := n.Decode(&v); err != nil {
		p.errorf(n, field, "%v", err)
		return nil
	}
	st, err := structpb.NewStruct(plainMap(v))
	if err != nil {
		p.errorf(n, field, "%v", err)
		return nil
	}
	return st
}

// plainMap turns what YAML decoded into the types structpb takes: maps
// with string keys, lists, strings, numbers, booleans and null. Anything
// else (a timestamp, a map with non-string keys) becomes its text.
func plainMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = plainValue(v)
	}
	return out
}

func plainValue(v any) any {
	switch v := v.(type) {
	case nil, bool, string, int, int64, uint64, float64:
		return v
	case map[string]any:
		return plainMap(v)
	case map[any]any:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[fmt.Sprint(k)] = plainValue(x)
		}
		return m
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = plainValue(x)
		}
		return out
	}
	return fmt.Sprint(v)
}
