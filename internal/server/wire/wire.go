// Package wire holds the JSON messages of the service's raw store API
// (/v1/store/...), shared by the server and remotestore. Durations are
// whole nanoseconds, so a remote store answers exactly what the store
// behind the service answered.
package wire

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
)

// Paths of the raw store API.
const (
	TakePath   = "/v1/store/take"
	RefundPath = "/v1/store/refund"
	CancelPath = "/v1/store/cancel"
	DrainPath  = "/v1/store/drain"
	ResetPath  = "/v1/store/reset"
	// SettlePath, ReleasePath and RenewPath are Store.Settle,
	// Store.Release and Store.Renew.
	SettlePath  = "/v1/store/settle"
	ReleasePath = "/v1/store/release"
	RenewPath   = "/v1/store/renew"
)

// Error codes carried in Error.Code. They map to fleetrate's sentinels.
const (
	CodeInvalid          = "invalid"
	CodeBurstExceeded    = "burst_exceeded"
	CodeStoreUnavailable = "store_unavailable"
	CodeUnauthorized     = "unauthorized"
	CodeBodyTooLarge     = "body_too_large"
	CodeInvalidJSON      = "invalid_json"
	CodeNotFound         = "not_found"
	CodeMethod           = "method_not_allowed"
	CodeInternal         = "internal"
	CodeUnknownBucket    = "unknown_bucket"
	CodeDisabled         = "disabled"
)

// Error is the body of every error response of the service.
type Error struct {
	// Error is a human-readable message naming the offending field.
	Error string `json:"error"`
	// Code is a stable machine-readable code, such as "invalid".
	Code string `json:"code"`
}

// Limit is a fleetrate.Limit.
type Limit struct {
	Name  string  `json:"name,omitempty"`
	Rate  float64 `json:"rate"`
	Burst int64   `json:"burst"`
}

// Bucket is a fleetrate.Bucket.
type Bucket struct {
	Prefix Bytes   `json:"prefix,omitempty"`
	Key    Bytes   `json:"key"`
	Limits []Limit `json:"limits"`
	// Reserve is fleetrate.Bucket.Reserve: for a take of a lower priority
	// class, the tokens every limit keeps for the classes above.
	Reserve int64 `json:"reserve,omitempty"`
	// InFlight is fleetrate.Bucket.InFlight: how many permits of the
	// bucket may be held at once (0: no bound).
	InFlight int64 `json:"in_flight,omitempty"`
	// PermitReserve is fleetrate.Bucket.PermitReserve: for a take of a
	// lower priority class, the permits it leaves free for those above.
	PermitReserve int64 `json:"permit_reserve,omitempty"`
	// Quotas are fleetrate.Bucket.Quotas: calendar quotas.
	Quotas []Quota `json:"quotas,omitempty"`
}

// Quota is a fleetrate.Quota, its period as calendar.Parse reads it
// ("month day=1 Europe/Paris").
type Quota struct {
	Name   string `json:"name,omitempty"`
	Count  int64  `json:"count"`
	Period string `json:"period"`
}

// QuotaStatus is a fleetrate.QuotaStatus.
type QuotaStatus struct {
	Bucket         int   `json:"bucket"`
	Index          int   `json:"index"`
	Quota          Quota `json:"quota"`
	Used           int64 `json:"used"`
	Remaining      int64 `json:"remaining"`
	ResetUnixMicro int64 `json:"reset_unix_micro"`
}

// Bytes is a key that may hold any bytes. It travels as a plain JSON
// string when it is valid UTF-8, and otherwise as {"base64": "..."}: JSON
// strings cannot carry other bytes, and replacing them would make two
// different keys one bucket.
type Bytes string

type base64Form struct {
	Base64 string `json:"base64"`
}

// MarshalJSON implements json.Marshaler.
func (b Bytes) MarshalJSON() ([]byte, error) {
	if utf8.ValidString(string(b)) {
		return json.Marshal(string(b))
	}
	return json.Marshal(base64Form{Base64: base64.StdEncoding.EncodeToString([]byte(b))})
}

// UnmarshalJSON implements json.Unmarshaler.
func (b *Bytes) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err == nil {
		*b = Bytes(s)
		return nil
	}
	var f base64Form
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return fmt.Errorf("want a string or {\"base64\": \"...\"}")
	}
	raw, err := base64.StdEncoding.DecodeString(f.Base64)
	if err != nil {
		return fmt.Errorf("base64: %w", err)
	}
	*b = Bytes(raw)
	return nil
}

// TakeRequest is a fleetrate.Request.
type TakeRequest struct {
	Buckets   []Bucket `json:"buckets"`
	N         int64    `json:"n"`
	MaxWaitNS int64    `json:"max_wait_ns"`
	// Booking asks for the take's Booking in the answer (Request.Booking).
	Booking bool `json:"booking,omitempty"`
	// Costs are fleetrate.Request.Costs: one cost per bucket, in order
	// (n is then 0).
	Costs []int64 `json:"costs,omitempty"`
	// Permit is fleetrate.Request.Permit.
	Permit *Permit `json:"permit,omitempty"`
}

// Booking is a fleetrate.Booking.
type Booking struct {
	StampUnixMicro int64   `json:"stamp_unix_micro"`
	DebtsNS        []int64 `json:"debts_ns"`
	// Costs are fleetrate.Booking.Costs: the take's costs by bucket.
	Costs []int64 `json:"costs,omitempty"`
	// Grant, in an answer, is the signed grant a cancel of this booking
	// presents (in its booking) to give it back.
	Grant string `json:"grant,omitempty"`
}

// CancelRequest asks for Store.Cancel.
type CancelRequest struct {
	Buckets []Bucket `json:"buckets"`
	N       int64    `json:"n"`
	Booking Booking  `json:"booking"`
}

// Result is a fleetrate.Result.
type Result struct {
	Allowed      bool  `json:"allowed"`
	N            int64 `json:"n"`
	Remaining    int64 `json:"remaining"`
	WaitNS       int64 `json:"wait_ns"`
	RetryAfterNS int64 `json:"retry_after_ns"`
	ResetAfterNS int64 `json:"reset_after_ns"`
	Limit        Limit `json:"limit"`
	Bucket       int   `json:"bucket"`
	// LimitIndex is the index of Limit in its bucket's limits.
	LimitIndex int `json:"limit_index,omitempty"`
	// NextTokenNS is fleetrate.Result.NextToken.
	NextTokenNS int64 `json:"next_token_ns,omitempty"`
	// AtUnixMicro is the store's clock at the decision, in microseconds.
	AtUnixMicro int64 `json:"at_unix_micro"`
	// Degraded marks a decision a failure policy made without the shared
	// store.
	Degraded bool `json:"degraded,omitempty"`
	// Booking is where a granted take left its buckets, when the request
	// asked for it.
	Booking *Booking `json:"booking,omitempty"`
	// Grant, for a granted take, is the signed grant a refund of it
	// presents.
	Grant string `json:"grant,omitempty"`
	// SettleGrant, for a granted take, is the signed grant a settle of it
	// presents. It is the refund's grant in another form: whichever is
	// presented first spends both.
	SettleGrant string `json:"settle_grant,omitempty"`
	// InFlight is fleetrate.Result.InFlight, when a bucket of the take
	// bounds in-flight takes.
	InFlight *InFlight `json:"in_flight,omitempty"`
	// Quotas, Quota and QuotaDenied are fleetrate.Result's, when buckets
	// of the take have calendar quotas.
	Quotas      []QuotaStatus `json:"quotas,omitempty"`
	Quota       int           `json:"quota,omitempty"`
	QuotaDenied bool          `json:"quota_denied,omitempty"`
}

// RefundRequest asks for Store.Refund.
type RefundRequest struct {
	Buckets []Bucket `json:"buckets"`
	N       int64    `json:"n"`
	// AtUnixMicro is the grant's time (its decision's at_unix_micro).
	AtUnixMicro int64 `json:"at_unix_micro"`
	// Grant is the take's signed grant (Result.Grant). Without one, the
	// refund needs the admin scope.
	Grant string `json:"grant,omitempty"`
}

// DrainRequest asks for Store.Drain, or with Each for Store.DrainEach
// (then Buckets and DurationNS are unused).
type DrainRequest struct {
	Buckets    []Bucket    `json:"buckets"`
	DurationNS int64       `json:"duration_ns"`
	Each       []DrainItem `json:"each,omitempty"`
}

// DrainItem is one bucket's drain of Store.DrainEach.
type DrainItem struct {
	Bucket     Bucket `json:"bucket"`
	DurationNS int64  `json:"duration_ns"`
	Void       bool   `json:"void,omitempty"`
}

// ResetRequest asks for Store.Reset.
type ResetRequest struct {
	Keys []Bytes `json:"keys"`
}

// OK is the body of a successful refund, drain or reset.
type OK struct {
	OK bool `json:"ok"`
}

// FromLimit converts a fleetrate.Limit.
func FromLimit(l fleetrate.Limit) Limit {
	return Limit{Name: l.Name, Rate: l.Rate, Burst: l.Burst}
}

// ToLimit converts to a fleetrate.Limit.
func (l Limit) ToLimit() fleetrate.Limit {
	return fleetrate.Limit{Name: l.Name, Rate: l.Rate, Burst: l.Burst}
}

// FromBuckets converts fleetrate buckets.
func FromBuckets(bs []fleetrate.Bucket) []Bucket {
	out := make([]Bucket, len(bs))
	for i, b := range bs {
		ls := make([]Limit, len(b.Limits))
		for j, l := range b.Limits {
			ls[j] = FromLimit(l)
		}
		out[i] = Bucket{Prefix: Bytes(b.Prefix), Key: Bytes(b.Key), Limits: ls, Reserve: b.Reserve, InFlight: b.InFlight, PermitReserve: b.PermitReserve}
		for _, q := range b.Quotas {
			out[i].Quotas = append(out[i].Quotas, FromQuota(q))
		}
	}
	return out
}

// FromQuota converts a fleetrate.Quota.
func FromQuota(q fleetrate.Quota) Quota {
	return Quota{Name: q.Name, Count: q.Count, Period: q.Period.String()}
}

// ToQuota converts to a fleetrate.Quota; an error names the period that
// calendar.Parse does not read.
func (q Quota) ToQuota() (fleetrate.Quota, error) {
	p, err := calendar.Parse(q.Period)
	if err != nil {
		return fleetrate.Quota{}, err
	}
	return fleetrate.Quota{Name: q.Name, Count: q.Count, Period: p}, nil
}

// ToBuckets converts to fleetrate buckets.
func ToBuckets(bs []Bucket) []fleetrate.Bucket {
	out := make([]fleetrate.Bucket, len(bs))
	for i, b := range bs {
		ls := make([]fleetrate.Limit, len(b.Limits))
		for j, l := range b.Limits {
			ls[j] = l.ToLimit()
		}
		out[i] = fleetrate.Bucket{Prefix: string(b.Prefix), Key: string(b.Key), Limits: ls, Reserve: b.Reserve, InFlight: b.InFlight, PermitReserve: b.PermitReserve}
		for _, wq := range b.Quotas {
			// A period Parse refuses is a zero one, which validation
			// refuses naming it; servers check the periods first.
			q, _ := wq.ToQuota()
			q.Name, q.Count = wq.Name, wq.Count
			out[i].Quotas = append(out[i].Quotas, q)
		}
	}
	return out
}

// FromResult converts a fleetrate.Result.
func FromResult(r fleetrate.Result) Result {
	w := Result{
		Allowed:      r.Allowed,
		N:            r.N,
		Remaining:    r.Remaining,
		WaitNS:       int64(r.Wait),
		RetryAfterNS: int64(r.RetryAfter),
		ResetAfterNS: int64(r.ResetAfter),
		Limit:        FromLimit(r.Limit),
		Bucket:       r.Bucket,
		LimitIndex:   r.LimitIndex,
		NextTokenNS:  int64(r.NextToken),
		Degraded:     r.Degraded,
	}
	if !r.At.IsZero() {
		w.AtUnixMicro = r.At.UnixMicro()
	}
	if f := r.InFlight; f != (fleetrate.InFlight{}) {
		w.InFlight = &InFlight{Bound: f.Bound, Held: f.Held, Bucket: f.Bucket, Queued: f.Queued, Ahead: f.Ahead}
	}
	for _, q := range r.Quotas {
		w.Quotas = append(w.Quotas, QuotaStatus{Bucket: q.Bucket, Index: q.Index, Quota: FromQuota(q.Quota), Used: q.Used, Remaining: q.Remaining, ResetUnixMicro: q.Reset.UnixMicro()})
	}
	w.Quota, w.QuotaDenied = r.Quota, r.QuotaDenied
	return w
}

// ToResult converts to a fleetrate.Result.
func (r Result) ToResult() fleetrate.Result {
	res := fleetrate.Result{
		Allowed:    r.Allowed,
		N:          r.N,
		Remaining:  r.Remaining,
		Wait:       time.Duration(r.WaitNS),
		RetryAfter: time.Duration(r.RetryAfterNS),
		ResetAfter: time.Duration(r.ResetAfterNS),
		Limit:      r.Limit.ToLimit(),
		Bucket:     r.Bucket,
		LimitIndex: r.LimitIndex,
		NextToken:  time.Duration(r.NextTokenNS),
		Degraded:   r.Degraded,
	}
	if r.AtUnixMicro != 0 {
		res.At = time.UnixMicro(r.AtUnixMicro)
	}
	if f := r.InFlight; f != nil {
		res.InFlight = fleetrate.InFlight{Bound: f.Bound, Held: f.Held, Bucket: f.Bucket, Queued: f.Queued, Ahead: f.Ahead}
	}
	for _, w := range r.Quotas {
		q, _ := w.Quota.ToQuota() // checked by the client against its request
		q.Name, q.Count = w.Quota.Name, w.Quota.Count
		res.Quotas = append(res.Quotas, fleetrate.QuotaStatus{Bucket: w.Bucket, Index: w.Index, Quota: q, Used: w.Used, Remaining: w.Remaining, Reset: time.UnixMicro(w.ResetUnixMicro)})
	}
	res.Quota, res.QuotaDenied = r.Quota, r.QuotaDenied
	return res
}

// CodeOf returns the error code for err: invalid, burst_exceeded or
// store_unavailable (for every other failure, including timeouts).
func CodeOf(err error) string {
	switch {
	case errors.Is(err, fleetrate.ErrBurstExceeded):
		return CodeBurstExceeded
	case errors.Is(err, fleetrate.ErrInvalid):
		return CodeInvalid
	}
	return CodeStoreUnavailable
}

// Err turns an error response back into an error wrapping the matching
// fleetrate sentinel. Codes other than invalid and burst_exceeded wrap
// fleetrate.ErrStoreUnavailable: to the caller the remote store failed.
func (e Error) Err(status int) error {
	switch e.Code {
	case CodeInvalid, CodeInvalidJSON, CodeUnknownBucket:
		return fmt.Errorf("%w: %s", fleetrate.ErrInvalid, e.Error)
	case CodeBurstExceeded:
		return fmt.Errorf("%w: %s", fleetrate.ErrBurstExceeded, e.Error)
	}
	msg := e.Error
	if msg == "" {
		msg = fmt.Sprintf("HTTP %d", status)
	}
	return fmt.Errorf("%w: remote: %s (%s)", fleetrate.ErrStoreUnavailable, msg, e.Code)
}
