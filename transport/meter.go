package transport

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/fleetrate/fleetrate"
)

// Meter is a budget of an upstream counted in a unit of its own, such as
// the tokens per minute of an LLM API beside its requests per minute. It
// is a bucket of the channel (MeterBucket) that each request draws from
// by what it costs the meter: an estimate before it is sent
// (Endpoint.Costs, Endpoint.CostFunc), settled to the real cost from its
// answer (Endpoint.Settle).
type Meter struct {
	// Name names the meter in costs, bucket names and logs, e.g.
	// "tokens". It must not be empty and must not contain '#'.
	Name string
	// Limits are the meter's limits, e.g. fleetrate.PerPeriod(85_500,
	// time.Minute) for "90,000 tokens per minute" kept 5 % below. A
	// request's cost must not exceed a burst.
	Limits []fleetrate.Limit
}

// Settle reads what a request really cost the upstream's meters from its
// answer: resp, its status and headers, and body, what the caller read
// of resp.Body (its first MaxSettleBody bytes), once the caller has read
// the body to its end or closed it. It returns the real costs by meter
// name; a meter not named keeps the cost booked for it. The transport
// then settles the booking (fleetrate.Reservation.Settle): a meter
// charged less gets the difference back, one charged more owes it at
// once, which pushes the next requests back. An error keeps the booked
// costs and is logged as rate_settle_error. A rate-limited answer (see
// IsRateLimited) and a failed round trip are not settled: they keep the
// booked costs.
type Settle func(resp *http.Response, body []byte) (map[string]int64, error)

// MaxSettleBody is how much of a response body the transport keeps for
// Settle: an LLM API's usage comes in the answer's JSON, or in the last
// event of a stream, well within it for a short answer; read a longer
// stream's usage in a header, or keep the last event yourself.
const MaxSettleBody = 1 << 20

// MeterBucket returns the bucket name of a channel's meter,
// "{channel}:meter": in the channel's hash tag, so that a request takes
// from it atomically with its endpoint's and credential's buckets.
func MeterBucket(channel, meter string) string {
	return "{" + channel + "}:" + meter
}

// checkMeter checks a meter's name.
func checkMeter(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("meter name must not be empty")
	case strings.Contains(name, "#"):
		return fmt.Errorf("meter %q must not contain '#'", name)
	}
	return nil
}

// checkCosts checks a target's costs by meter.
func (t Target) checkCosts() error {
	for name, n := range t.Costs {
		if err := checkMeter(name); err != nil {
			return fmt.Errorf("%w: target (channel %q): costs: %w", fleetrate.ErrInvalid, t.Channel, err)
		}
		if n < 0 {
			return fmt.Errorf("%w: target (channel %q): costs[%q]: must be >= 0, got %d", fleetrate.ErrInvalid, t.Channel, name, n)
		}
	}
	return nil
}

// metered returns the names of the buckets a request with costs by meter
// draws from: its endpoint's, its credential's, then its meters' in the
// order of their names.
func (t Target) metered() []string {
	names := make([]string, 0, 2+len(t.Costs))
	names = append(names, EndpointBucket(t.Channel, t.Endpoint))
	if t.Credential {
		names = append(names, CredentialBucket(t.Channel))
	}
	for _, m := range slices.Sorted(maps.Keys(t.Costs)) {
		names = append(names, MeterBucket(t.Channel, m))
	}
	return names
}

// costVector returns the cost of each of the target's buckets (those of
// buckets, in order), or nil when it has no costs by meter and takes its
// cost from each.
func (t Target) costVector() []int64 {
	if len(t.Costs) == 0 {
		return nil
	}
	cs := []int64{t.cost()}
	if t.Credential {
		cs = append(cs, t.cost())
	}
	for _, m := range slices.Sorted(maps.Keys(t.Costs)) {
		cs = append(cs, t.Costs[m])
	}
	return cs
}

// costs completes the target of a request to e with the request's costs
// by meter: e.CostFunc's, or e.Costs.
func (e Endpoint) costs(req *http.Request, tg Target) (Target, error) {
	tg.Costs = e.Costs
	if e.CostFunc != nil {
		cs, err := e.CostFunc(req)
		if err != nil {
			return Target{}, fmt.Errorf("endpoint %q: cost of %s %s: %w", e.Name, req.Method, urlPath(req), err)
		}
		tg.Costs = cs
	}
	return tg, nil
}

// validateMeters checks the upstream's meters, in-flight bounds and the
// endpoints' costs by meter, naming the failing field and value.
//
// It is long because each field gets its own check and message.
func (u Upstream) validateMeters() error {
	up := fmt.Sprintf("upstream %q", u.Channel)
	if u.CredentialInFlight < 0 || u.CredentialInFlight > fleetrate.MaxInFlight {
		return fmt.Errorf("%w: %s: credential in-flight: must be between 1 and %d (0: no bound), got %d", fleetrate.ErrInvalid, up, fleetrate.MaxInFlight, u.CredentialInFlight)
	}
	if u.CredentialInFlight > 0 && len(u.Credential) == 0 {
		return fmt.Errorf("%w: %s: credential in-flight needs credential limits", fleetrate.ErrInvalid, up)
	}
	meters := make(map[string]Meter, len(u.Meters))
	for i, m := range u.Meters {
		if err := checkMeter(m.Name); err != nil {
			return fmt.Errorf("%w: %s: meters[%d].name: %w", fleetrate.ErrInvalid, up, i, err)
		}
		if _, dup := meters[m.Name]; dup {
			return fmt.Errorf("%w: %s: meters[%d].name: duplicate %q", fleetrate.ErrInvalid, up, i, m.Name)
		}
		meters[m.Name] = m
		if len(m.Limits) == 0 {
			return fmt.Errorf("%w: %s: meters[%d] %q limits: at least one limit is required", fleetrate.ErrInvalid, up, i, m.Name)
		}
		for j, l := range m.Limits {
			if err := l.Validate(); err != nil {
				return fmt.Errorf("%w: %s: meters[%d] %q limits[%d]: %w", fleetrate.ErrInvalid, up, i, m.Name, j, err)
			}
		}
	}
	for i, e := range u.Endpoints {
		field := fmt.Sprintf("%s: endpoints[%d] %q", up, i, e.Name)
		if e.InFlight < 0 || e.InFlight > fleetrate.MaxInFlight {
			return fmt.Errorf("%w: %s.in_flight: must be between 1 and %d (0: no bound), got %d", fleetrate.ErrInvalid, field, fleetrate.MaxInFlight, e.InFlight)
		}
		for _, name := range slices.Sorted(maps.Keys(e.Costs)) {
			m, ok := meters[name]
			if !ok {
				return fmt.Errorf("%w: %s.costs: %q is not one of the upstream's meters", fleetrate.ErrInvalid, field, name)
			}
			n := e.Costs[name]
			if n < 0 {
				return fmt.Errorf("%w: %s.costs[%q]: must be >= 0, got %d", fleetrate.ErrInvalid, field, name, n)
			}
			for j, l := range m.Limits {
				if n > l.Burst {
					return fmt.Errorf("%w: %s.costs[%q]: %d exceeds burst %d of the meter's limits[%d]", fleetrate.ErrInvalid, field, name, n, l.Burst, j)
				}
			}
		}
	}
	return nil
}

// meterBuckets completes the bucket configuration bs of Buckets with the
// in-flight bounds and the meters' buckets (each with its pause marker).
func (u Upstream) meterBuckets(bs []fleetrate.BucketConfig) []fleetrate.BucketConfig {
	bounds := map[string]int64{CredentialBucket(u.Channel): u.CredentialInFlight}
	for _, e := range u.Endpoints {
		bounds[EndpointBucket(u.Channel, e.Name)] = e.InFlight
	}
	for i := range bs {
		bs[i].InFlight = bounds[bs[i].Name]
	}
	for _, m := range u.Meters {
		name := MeterBucket(u.Channel, m.Name)
		bs = append(bs,
			fleetrate.BucketConfig{Name: name, Limits: slices.Clone(m.Limits), Priorities: slices.Clone(u.Priorities)},
			fleetrate.BucketConfig{Name: PauseBucket(name), Limits: []fleetrate.Limit{PauseLimit}})
	}
	return bs
}
