package fleetrate

import (
	"fmt"
	"time"
)

// Defaults applied by New when a Config field is zero.
const (
	// DefaultPrefix namespaces every store key.
	DefaultPrefix = "fleetrate:"
	// DefaultMaxWait bounds how long Wait and Reserve may book ahead.
	DefaultMaxWait = 5 * time.Second
	// MaxNameLen is the longest bucket name a Limiter accepts. Callers that
	// key buckets by client input (API keys, IPs) should hash it first, as
	// httplimit does.
	MaxNameLen = 512
	// refundTimeout bounds the best-effort refund after a cancelled wait.
	refundTimeout = time.Second
)

// BucketConfig gives a named bucket its own limits, e.g. one bucket per
// (channel, endpoint) of an upstream API.
type BucketConfig struct {
	// Name identifies the bucket, e.g. "booking_com/availability". The
	// store key is Config.Prefix + Name. To keep buckets that are taken
	// together on one Redis Cluster slot, give them a common {hash tag}:
	// "{booking_com}/availability" and "{booking_com}".
	Name string
	// Limits are enforced together.
	Limits []Limit
	// Priorities are the classes of takes below the top one on this
	// bucket (see Priority and WithPriority). When empty, the bucket has
	// Config.Priorities.
	Priorities []Priority
	// InFlight, when above 0, bounds how many takes of the bucket may be
	// in flight at once across the fleet: take from it with Acquire or
	// TryAcquire, which hold a permit until Reservation.Release (see
	// Bucket.InFlight). At most MaxInFlight.
	InFlight int64
	// Quotas are the bucket's calendar quotas ("10,000 a month"), enforced
	// with its Limits in one atomic step (see Quota).
	Quotas []Quota
}

// Config configures a Limiter. The zero value of each field means its
// default.
type Config struct {
	// Prefix is prepended to every bucket name to form the store key.
	// The default is DefaultPrefix ("fleetrate:").
	Prefix string
	// Limits apply to every name that has no entry in Buckets, e.g. one
	// bucket per API key. When empty, only the names in Buckets are valid.
	Limits []Limit
	// Buckets are named buckets with limits of their own.
	Buckets []BucketConfig
	// Priorities are the classes of takes below the top one (see Priority
	// and WithPriority) on every bucket that configures none of its own.
	// None by default: every take is of one class.
	Priorities []Priority
	// MaxWait is the longest Wait and Reserve may book ahead; a longer wait
	// fails at once with a *BackpressureError. The default is
	// DefaultMaxWait (5 s).
	MaxWait time.Duration
	// Clock is used only to turn the absolute time given to DrainUntil
	// into a duration. Decisions use the store's clock. Default time.Now.
	Clock func() time.Time
	// InFlight bounds, as BucketConfig.InFlight does, the takes in flight
	// of every bucket of the default Limits.
	InFlight int64
	// Quotas are, as BucketConfig.Quotas are, the calendar quotas of every
	// bucket of the default Limits (each bucket name uses its own),
	// enforced with them in one atomic step (see Quota). They need Limits.
	Quotas []Quota
	// PermitTTL is the lease of an in-flight permit: a holder that dies
	// gives its permit back this long after its last renewal, and the
	// Limiter renews held permits at a third of it. Between MinPermitTTL
	// and MaxPermitTTL; the default is DefaultPermitTTL (15 s).
	PermitTTL time.Duration
}

// DefaultPermitTTL is the default Config.PermitTTL: a dead holder's permit
// comes back within 15 s, and a live one renews every 5 s.
const DefaultPermitTTL = 15 * time.Second

// Validate checks the configuration, naming the failing field and value.
func (c Config) Validate() error {
	if len(c.Limits) == 0 && len(c.Buckets) == 0 {
		return fmt.Errorf("%w: config: limits or buckets must be set", ErrInvalid)
	}
	if len(c.Limits) > 0 {
		if err := validateLimits("limits", c.Limits); err != nil {
			return fmt.Errorf("%w: config: %w", ErrInvalid, err)
		}
	}
	if len(c.Quotas) > 0 && len(c.Limits) == 0 {
		return fmt.Errorf("%w: config: quotas apply to the buckets of the default limits, and there are no limits", ErrInvalid)
	}
	if err := validateQuotas("config:", c.Quotas); err != nil {
		return err
	}
	if c.InFlight < 0 || c.InFlight > MaxInFlight {
		return fmt.Errorf("%w: config: in_flight: must be between 1 and %d (0: no bound), got %d", ErrInvalid, MaxInFlight, c.InFlight)
	}
	if c.PermitTTL != 0 && (c.PermitTTL < MinPermitTTL || c.PermitTTL > MaxPermitTTL) {
		return fmt.Errorf("%w: config: permit ttl: must be between %v and %v (the limiter renews at a third of it), got %v", ErrInvalid, MinPermitTTL, MaxPermitTTL, c.PermitTTL)
	}
	if c.MaxWait < 0 || c.MaxWait > MaxWaitCap {
		return fmt.Errorf("%w: config: max wait must be between 0 and %v, got %v", ErrInvalid, MaxWaitCap, c.MaxWait)
	}
	if err := validatePriorities("priorities", c.Priorities, c.Limits, c.InFlight); err != nil {
		return fmt.Errorf("%w: config: %w", ErrInvalid, err)
	}
	seen := make(map[string]bool, len(c.Buckets))
	for i, b := range c.Buckets {
		if err := validateName(b.Name); err != nil {
			return fmt.Errorf("%w: config: buckets[%d].name: %w", ErrInvalid, i, err)
		}
		if seen[b.Name] {
			return fmt.Errorf("%w: config: buckets[%d].name: duplicate %q", ErrInvalid, i, b.Name)
		}
		seen[b.Name] = true
		if b.InFlight < 0 || b.InFlight > MaxInFlight {
			return fmt.Errorf("%w: config: buckets[%d] %q in_flight: must be between 1 and %d (0: no bound), got %d", ErrInvalid, i, b.Name, MaxInFlight, b.InFlight)
		}
		if err := validateLimits(fmt.Sprintf("buckets[%d] %q limits", i, b.Name), b.Limits); err != nil {
			return fmt.Errorf("%w: config: %w", ErrInvalid, err)
		}
		if err := validateQuotas(fmt.Sprintf("config: buckets[%d] %q", i, b.Name), b.Quotas); err != nil {
			return err
		}
		field, ps := fmt.Sprintf("buckets[%d] %q priorities", i, b.Name), b.Priorities
		if len(ps) == 0 {
			field, ps = fmt.Sprintf("priorities (of buckets[%d] %q)", i, b.Name), c.Priorities
		}
		if err := validatePriorities(field, ps, b.Limits, b.InFlight); err != nil {
			return fmt.Errorf("%w: config: %w", ErrInvalid, err)
		}
	}
	return nil
}

// validName reports whether name may name a bucket; validateName says why
// not.
func validName(name string) bool { return name != "" && len(name) <= MaxNameLen }

func validateName(name string) error {
	if validName(name) {
		return nil
	}
	switch {
	case name == "":
		return fmt.Errorf("name must not be empty")
	case len(name) > MaxNameLen:
		return fmt.Errorf("name must be at most %d bytes, got %d", MaxNameLen, len(name))
	}
	return nil
}
