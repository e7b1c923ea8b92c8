package main

import (
	"cmp"
	"strings"
)

// envoyDefaultService is envoyproxy/ratelimit's TRACING_SERVICE_NAME
// default: its deployments' traces keep their service name.
const envoyDefaultService = "RateLimit"

// observe reads tracing (TRACING_*), the debug listener
// (DEBUG_HOST/DEBUG_PORT) and HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, and
// notes the statistics settings fleetrate does not honour (USE_STATSD,
// whose default there is true, EXTRA_TAGS); it reads the per-second Redis
// (REDIS_PERSECOND and REDIS_PERSECOND_*).
func (e *envoyReader) observe() {
	e.flagBool("TRACING_ENABLED", "tracing")
	if on, _ := e.boolean("TRACING_ENABLED"); on {
		e.vals["tracing-service-name"] = cmp.Or(e.getenv("TRACING_SERVICE_NAME"), envoyDefaultService)
	}
	e.copy("TRACING_SERVICE_NAMESPACE", "tracing-service-namespace")
	e.copy("TRACING_SERVICE_INSTANCE_ID", "tracing-service-instance-id")
	e.copy("TRACING_SAMPLING_RATE", "tracing-sampling-rate")
	if v := e.getenv("TRACING_EXPORTER_PROTOCOL"); v != "" {
		e.vals["tracing-protocol"] = strings.ToLower(v)
	}
	// There the debug port is always on, on every address (0.0.0.0:6070);
	// here only when one of the two is set, and on loopback unless
	// DEBUG_HOST says otherwise.
	if e.set("DEBUG_HOST") || e.set("DEBUG_PORT") {
		e.vals["debug-addr"] = hostPort(cmp.Or(e.getenv("DEBUG_HOST"), "127.0.0.1"), e.getenv("DEBUG_PORT"), "6070")
	}
	e.flagBool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "healthy-with-config")
	e.statsNotes()
	for _, n := range envoyNoted {
		if e.set(n.name) {
			e.notes = append(e.notes, n.name+": ignored; "+n.why)
		}
	}
	if per, err := e.boolean("REDIS_PERSECOND"); err != nil {
		e.errs = append(e.errs, err)
	} else if per {
		if u, err := envoyPerSecondURL(e.getenv); err != nil {
			e.errs = append(e.errs, err)
		} else {
			e.vals["redis-per-second"] = u
		}
	}
}

// envoyMarkers are variables only an envoyproxy/ratelimit deployment
// sets: with one of them, USE_STATSD's default (true) applies.
var envoyMarkers = []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "REDIS_SOCKET_TYPE", "REDIS_URL", "BACKEND_TYPE", "USE_STATSD", "STATSD_HOST", "STATSD_PORT", "GRPC_PORT"}

// statsNotes notes envoyproxy/ratelimit's statsd settings, on by default
// there: a deployment that relies on the default (USE_STATSD unset) gets
// the note too.
func (e *envoyReader) statsNotes() {
	deployment := false
	for _, name := range envoyMarkers {
		deployment = deployment || e.set(name)
	}
	statsd := true // envoyproxy/ratelimit's default
	if e.set("USE_STATSD") {
		statsd, _ = e.boolean("USE_STATSD")
	}
	if off, _ := e.boolean("DISABLE_STATS"); off {
		statsd = false
	}
	if deployment && statsd {
		why := "set"
		if !e.set("USE_STATSD") {
			why = "unset, so true as envoyproxy/ratelimit's default"
		}
		e.notes = append(e.notes, "USE_STATSD ("+why+"): ignored; fleetrate sends no statsd: its metrics are Prometheus's, on /metrics (and --metrics-addr, USE_PROMETHEUS); nothing is sent to "+hostPort(cmp.Or(e.getenv("STATSD_HOST"), "localhost"), e.getenv("STATSD_PORT"), "8125"))
	}
	if e.set("EXTRA_TAGS") {
		e.notes = append(e.notes, "EXTRA_TAGS: ignored; fleetrate's metrics are Prometheus's: add such tags as target labels where they are scraped (a relabeling, or a ServiceMonitor's targetLabels)")
	}
}

// envoyNoted are more variables fleetrate has no equivalent for, noted
// whenever they are set (envoyIgnored's are noted only when on).
var envoyNoted = []struct{ name, why string }{
	{"STATS_FLUSH_INTERVAL", "fleetrate's metrics are scraped from /metrics, not flushed"},
	{"PROMETHEUS_MAPPER_YAML", "fleetrate's metrics have Prometheus names of their own (docs/API.md); there is no statsd name to map"},
	{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "fleetrate's durations are in seconds, Prometheus's convention"},
	{"USE_DOG_STATSD_MOGRIFIERS", "fleetrate sends no DogStatsD"},
	{"REDIS_CLUSTER_PIPELINE_PARALLELISM", "the Redis Cluster client sends each node its calls over connections of its own"},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "a call waits for a free connection within --store-timeout (pool_size and pool_timeout in the --redis URL size the pool)"},
	{"REDIS_STARTUP_INITIAL_INTERVAL", "fleetrate starts while Redis is away, and /readyz fails until it answers"},
	{"REDIS_STARTUP_MAX_INTERVAL", "fleetrate starts while Redis is away, and /readyz fails until it answers"},
	{"REDIS_STARTUP_MAX_ELAPSED_TIME", "fleetrate starts while Redis is away, and /readyz fails until it answers"},
	{"REDIS_PERSECOND_TIMEOUT", "--store-timeout (REDIS_TIMEOUT) bounds the calls to both stores"},
	{"REDIS_PERSECOND_PIPELINE_WINDOW", "fleetrate batches concurrent Redis calls itself (--redis-batch, on by default), to both stores"},
	{"REDIS_PERSECOND_PIPELINE_LIMIT", "fleetrate batches concurrent Redis calls itself (--redis-batch, on by default), to both stores"},
	{"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "the Redis Cluster client sends each node its calls over connections of its own"},
	{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "a call waits for a free connection within --store-timeout"},
}
