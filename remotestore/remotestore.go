// Package remotestore is a fleetrate.Store backed by the fleetrate service
// (fleetrate serve). Go workers use it to share the service's buckets
// without a connection to Redis: each call is one HTTP request to the
// service's raw store API, which applies it to the service's own store.
//
// The store never turns a failure into a decision: when the service cannot
// be reached, answers with an error, or times out, the call returns an
// error wrapping fleetrate.ErrStoreUnavailable, and the caller decides
// whether to fail open or closed.
//
// The whole store contract goes over the wire: costs by bucket, settles
// (presenting the settle grant the service issued with the take, so a
// grant settles once), and in-flight permits (Release and Renew name the
// permit's id, which is what authorises them: a Limiter draws 96 random
// bits for it). A Store is a fleetrate.PermitNotifier without polling: the
// service streams a notice when its own store says a permit was released.
//
// A Store neither announces (transport.Announcer) nor unwraps: the
// service offers no announcement channel, and there is no store in this
// process to unwrap to. A transport over it therefore logs
// rate_announcer_missing at New, and its process does not tell the fleet
// of its pauses; they are still kept in the shared markers, which a
// request that slept reads before it is sent. Since a listening process
// trusts that a pause it was not told of did not happen, either every
// process sharing the service's buckets goes without announcements (all of
// them on remotestore, for instance), or each is given the same
// Announcer in transport.Options.Announcer (such as a redisstore.Store on
// the Redis the service uses).
package remotestore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/server/wire"
)

// DefaultTimeout bounds every call that has no earlier deadline.
const DefaultTimeout = time.Second

// maxResponse bounds the body read from the service.
const maxResponse = 1 << 20

// Options configure a Store. The zero value of each field means its
// default.
type Options struct {
	// HTTPClient sends the requests. The default keeps up to 64 idle
	// connections to the service, so that concurrent callers reuse them.
	HTTPClient *http.Client
	// Token, when set, is sent as "Authorization: Bearer <Token>", for a
	// service started with auth tokens.
	Token string
	// Timeout bounds each call; a context with an earlier deadline keeps
	// it. The default is DefaultTimeout (1 s); a negative value means no
	// bound beyond the context's.
	Timeout time.Duration
}

// Store is a fleetrate.Store that forwards every call to a fleetrate
// service. It is safe for concurrent use.
type Store struct {
	base    string
	client  *http.Client
	auth    string
	timeout time.Duration
	grants  grantBook
}

var (
	_ fleetrate.Store          = (*Store)(nil)
	_ fleetrate.MultiClock     = (*Store)(nil)
	_ fleetrate.PermitNotifier = (*Store)(nil)
)

// MultipleClocks implements fleetrate.MultiClock: the service may run as
// several instances, each answering on its own store's clock.
func (s *Store) MultipleClocks() bool { return true }

// New returns a Store talking to the service at baseURL, such as
// "http://fleetrate:8080" or "https://fleetrate.internal".
func New(baseURL string, opts Options) (*Store, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: remotestore: base URL must be http://host:port or https://host:port, got %q", fleetrate.ErrInvalid, baseURL)
	}
	if strings.ContainsAny(opts.Token, " \t\r\n") {
		return nil, fmt.Errorf("%w: remotestore: token must not contain spaces", fleetrate.ErrInvalid)
	}
	s := &Store{base: strings.TrimSuffix(u.String(), "/"), client: opts.HTTPClient, timeout: opts.Timeout}
	if s.client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns = 64
		t.MaxIdleConnsPerHost = 64
		s.client = &http.Client{Transport: t}
	}
	if s.timeout == 0 {
		s.timeout = DefaultTimeout
	}
	if opts.Token != "" {
		s.auth = "Bearer " + opts.Token
	}
	return s, nil
}

// Close releases the idle connections to the service.
func (s *Store) Close() error {
	s.client.CloseIdleConnections()
	return nil
}

// Take implements fleetrate.Store.
func (s *Store) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if err := req.Validate(); err != nil {
		return fleetrate.Result{}, err
	}
	var res wire.Result
	body := wire.TakeRequest{Buckets: wire.FromBuckets(req.Buckets), N: req.N, MaxWaitNS: int64(req.MaxWait), Booking: req.Booking != nil, Costs: req.Costs}
	if req.Permit.ID != "" {
		body.Permit = &wire.Permit{ID: req.Permit.ID, TTLNS: int64(req.Permit.TTL)}
	}
	if err := s.call(ctx, wire.TakePath, body, &res); err != nil {
		return fleetrate.Result{}, err
	}
	if bk := req.Booking; bk != nil && res.Booking != nil {
		bk.Stamp, bk.Debts = res.Booking.StampUnixMicro, append(bk.Debts[:0], res.Booking.DebtsNS...)
		bk.Costs = res.Booking.Costs
	}
	if res.Grant != "" {
		s.grants.put(grantKey(grantRefund, req.Buckets, res.AtUnixMicro), res.Grant)
	}
	if res.SettleGrant != "" {
		s.grants.put(grantKey(grantSettle, req.Buckets, slot(res)), res.SettleGrant)
	}
	if res.Booking != nil && res.Booking.Grant != "" {
		s.grants.put(grantKey(grantCancel, req.Buckets, res.Booking.StampUnixMicro), res.Booking.Grant)
	}
	if f := res.InFlight; f != nil && (f.Bucket < 0 || f.Bucket >= len(req.Buckets) || f.Ahead < 0) {
		return fleetrate.Result{}, fmt.Errorf("%w: remote: answer names in-flight bucket %d of %d, %d ahead", fleetrate.ErrStoreUnavailable, f.Bucket, len(req.Buckets), f.Ahead)
	}
	if res.Bucket < 0 || res.Bucket >= len(req.Buckets) {
		return fleetrate.Result{}, fmt.Errorf("%w: remote: answer names bucket %d of %d", fleetrate.ErrStoreUnavailable, res.Bucket, len(req.Buckets))
	}
	if n := len(req.Buckets[res.Bucket].Limits); res.LimitIndex < 0 || res.LimitIndex >= n || res.NextTokenNS < 0 {
		return fleetrate.Result{}, fmt.Errorf("%w: remote: answer names limit %d of %d, next token in %dns", fleetrate.ErrStoreUnavailable, res.LimitIndex, n, res.NextTokenNS)
	}
	out := res.ToResult()
	if err := quotasOf(req, &out); err != nil {
		return fleetrate.Result{}, err
	}
	return out, nil
}

// quotasOf checks that res reports every calendar quota of req, in order,
// and gives each the request's own Quota.
func quotasOf(req fleetrate.Request, res *fleetrate.Result) error {
	k := 0
	for b := range req.Buckets {
		for qi, q := range req.Buckets[b].Quotas {
			if k >= len(res.Quotas) || res.Quotas[k].Bucket != b || res.Quotas[k].Index != qi {
				return fmt.Errorf("%w: remote: answer does not report quota %d of bucket %d", fleetrate.ErrStoreUnavailable, qi, b)
			}
			res.Quotas[k].Quota = q
			k++
		}
	}
	if k != len(res.Quotas) || k > 0 && (res.Quota < 0 || res.Quota >= k) {
		return fmt.Errorf("%w: remote: answer reports %d quotas (index %d) for %d", fleetrate.ErrStoreUnavailable, len(res.Quotas), res.Quota, k)
	}
	return nil
}

// Cancel implements fleetrate.Store. It presents the grant the service
// issued with the booking's take through this Store; without one (the
// take went through another Store, or too long ago), the service gives
// the booking back only to a token with the admin scope.
func (s *Store) Cancel(ctx context.Context, buckets []fleetrate.Bucket, n int64, b fleetrate.Booking) error {
	if err := fleetrate.ValidateCancel(buckets, n, b); err != nil {
		return err
	}
	key := grantKey(grantCancel, buckets, b.Stamp)
	grant := s.grants.take(key)
	body := wire.CancelRequest{Buckets: wire.FromBuckets(buckets), N: n, Booking: wire.Booking{StampUnixMicro: b.Stamp, DebtsNS: b.Debts, Costs: b.Costs, Grant: grant}}
	err := s.call(ctx, wire.CancelPath, body, &wire.OK{})
	if err != nil && errors.Is(err, fleetrate.ErrStoreUnavailable) {
		s.grants.put(key, grant) // the service gives it back on a store failure
	}
	return err
}

// Refund implements fleetrate.Store. It presents the grant the service
// issued with the take at at through this Store, as Cancel does.
func (s *Store) Refund(ctx context.Context, buckets []fleetrate.Bucket, n int64, at time.Time) error {
	if err := fleetrate.ValidateRefund(buckets, n, at); err != nil {
		return err
	}
	key := grantKey(grantRefund, buckets, at.UnixMicro())
	grant := s.grants.take(key)
	err := s.call(ctx, wire.RefundPath, wire.RefundRequest{Buckets: wire.FromBuckets(buckets), N: n, AtUnixMicro: at.UnixMicro(), Grant: grant}, &wire.OK{})
	if err != nil && errors.Is(err, fleetrate.ErrStoreUnavailable) {
		s.grants.put(key, grant) // the service gives it back on a store failure
	}
	return err
}

// Drain implements fleetrate.Store.
func (s *Store) Drain(ctx context.Context, buckets []fleetrate.Bucket, d time.Duration) error {
	if err := fleetrate.ValidateBuckets(buckets); err != nil {
		return err
	}
	if d < 0 || d > fleetrate.MaxWaitCap {
		return fmt.Errorf("%w: drain duration must be between 0 and %v, got %v", fleetrate.ErrInvalid, fleetrate.MaxWaitCap, d)
	}
	return s.call(ctx, wire.DrainPath, wire.DrainRequest{Buckets: wire.FromBuckets(buckets), DurationNS: int64(d)}, &wire.OK{})
}

// Reset implements fleetrate.Store.
func (s *Store) Reset(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return ctx.Err()
	}
	wk := make([]wire.Bytes, len(keys))
	for i, k := range keys {
		wk[i] = wire.Bytes(k)
	}
	return s.call(ctx, wire.ResetPath, wire.ResetRequest{Keys: wk}, &wire.OK{})
}

// call posts body to path and decodes a 200 answer into out. Every
// failure other than a rejected argument wraps ErrStoreUnavailable; a
// context that the caller cancelled, or whose own deadline passed, returns
// its error.
func (s *Store) call(ctx context.Context, path string, body, out any) error {
	return s.callWithin(ctx, s.timeout, path, body, out)
}

// callWithin is call with its own timeout (0 or less: the context's).
func (s *Store) callWithin(ctx context.Context, timeout time.Duration, path string, body, out any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	data, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("%w: remotestore: encoding the request: %w", fleetrate.ErrInvalid, err)
	}
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		cctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, s.base+path, bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%w: remote: %w", fleetrate.ErrStoreUnavailable, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if s.auth != "" {
		req.Header.Set("Authorization", s.auth)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("remotestore: %w", cerr)
		}
		return fmt.Errorf("%w: remote: %w", fleetrate.ErrStoreUnavailable, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("%w: remote: reading the answer: %w", fleetrate.ErrStoreUnavailable, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e wire.Error
		if json.Unmarshal(raw, &e) != nil || e.Code == "" {
			return fmt.Errorf("%w: remote: HTTP %s", fleetrate.ErrStoreUnavailable, resp.Status)
		}
		return e.Err(resp.StatusCode)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%w: remote: malformed answer: %w", fleetrate.ErrStoreUnavailable, err)
	}
	return nil
}
