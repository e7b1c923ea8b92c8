package wire

import (
	"time"

	"github.com/fleetrate/fleetrate"
)

// Permit is a fleetrate.Permit.
type Permit struct {
	// ID names the holder (fleetrate.Permit.ID). Anyone who knows it can
	// release or renew the permit: a Limiter draws 96 random bits for it.
	ID string `json:"id"`
	// TTLNS is the lease, in nanoseconds.
	TTLNS int64 `json:"ttl_ns"`
}

// ToPermit converts to a fleetrate.Permit.
func (p Permit) ToPermit() fleetrate.Permit {
	return fleetrate.Permit{ID: p.ID, TTL: time.Duration(p.TTLNS)}
}

// InFlight is a fleetrate.InFlight.
type InFlight struct {
	Bound  int64 `json:"bound"`
	Held   int64 `json:"held"`
	Bucket int   `json:"bucket"`
	Queued bool  `json:"queued,omitempty"`
	Ahead  int   `json:"ahead,omitempty"`
}

// SettleRequest asks for Store.Settle.
type SettleRequest struct {
	Buckets []Bucket `json:"buckets"`
	// Costs and Actual are fleetrate.Settlement's, one per bucket.
	Costs  []int64 `json:"costs"`
	Actual []int64 `json:"actual"`
	// AtUnixMicro is the grant's slot (its Result.At plus Result.Wait).
	AtUnixMicro int64 `json:"at_unix_micro"`
	// Grant is the take's signed settle grant (Result.SettleGrant).
	// Without one, the settle needs the admin scope.
	Grant string `json:"grant,omitempty"`
}

// ReleaseRequest asks for Store.Release.
type ReleaseRequest struct {
	Buckets []Bucket `json:"buckets"`
	ID      string   `json:"id"`
}

// RenewRequest asks for Store.Renew.
type RenewRequest struct {
	Buckets []Bucket `json:"buckets"`
	ID      string   `json:"id"`
	TTLNS   int64    `json:"ttl_ns"`
}

// Held is the answer of a release or a renew: how many of the buckets
// held (or queued) the permit.
type Held struct {
	Held int `json:"held"`
}

// NotifyPath is the long-poll of remotestore's PermitNotifier.
const NotifyPath = "/v1/store/notify"

// NotifyRequest waits, up to WaitNS, for the service's store to say a
// permit of the bucket Key may have been freed for the waiter ID.
type NotifyRequest struct {
	Key    Bytes  `json:"key"`
	ID     string `json:"id"`
	WaitNS int64  `json:"wait_ns"`
}

// Notified answers a NotifyRequest: Notified when the store said so
// within the wait; Supported false when the service's store cannot tell
// (the waiter keeps to its timer).
type Notified struct {
	Supported bool `json:"supported"`
	Notified  bool `json:"notified,omitempty"`
}
