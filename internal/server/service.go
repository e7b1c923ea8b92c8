package server

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/server/wire"
)

// service is the HTTP API's operations on the store: each takes a decoded
// request and the store's context and returns its answer or an error
// (an *httpError for a bad request, or the store's own error). endpoint
// puts them on HTTP. The arguments the stores check themselves (a refund's
// n >= 0, a drain's duration, a take's request) are left to them, so that
// each check has one place; the service checks what only it knows:
// bucket names, its own keys, and its own bounds.
type service struct{ *Server }

// take serves POST /v1/take.
func (v service) take(ctx context.Context, req *TakeRequest) (Decision, error) {
	return v.takeBuckets(ctx, takeSpec{api: apiTake, one: req.Bucket, many: req.Buckets, costs: req.Costs, n: req.N, reserve: req.Reserve})
}

// wait serves POST /v1/wait.
func (v service) wait(ctx context.Context, req *WaitRequest) (Decision, error) {
	maxWait, err := v.maxWait(req.MaxWaitMS)
	if err != nil {
		return Decision{}, err
	}
	return v.takeBuckets(ctx, takeSpec{api: apiWait, one: req.Bucket, many: req.Buckets, costs: req.Costs, n: req.N, reserve: req.Reserve, maxWait: &maxWait})
}

// maxWait reads a request's max_wait_ms: the server's max wait when not
// given, and at most it.
func (v service) maxWait(ms *float64) (time.Duration, error) {
	maxWait := v.opts.MaxWait
	if ms != nil {
		d, err := fromMillis("max_wait_ms", *ms, fleetrate.MaxWaitCap)
		if err != nil {
			return 0, err
		}
		maxWait = min(d, v.opts.MaxWait)
	}
	return maxWait, nil
}

// takeBuckets takes from the named buckets, each keeping reserve tokens,
// waiting up to *maxWait for /v1/wait and /v1/acquire (maxWait is nil for
// /v1/take, which does not wait). It is long because the decision, its
// metric and its answer (with the booking and grants a give-back needs)
// read best in the order they happen.
func (v service) takeBuckets(ctx context.Context, t takeSpec) (Decision, error) {
	names, bs, n, costs, err := v.resolveTake(t)
	if err != nil {
		return Decision{}, err
	}
	for i := range bs {
		bs[i].Reserve = t.reserve // resolve's own copies
		if bs[i].InFlight > 0 {
			bs[i].PermitReserve = t.permitReserve
		}
	}
	req := fleetrate.Request{Buckets: bs, N: n, Costs: costs, Permit: t.permit}
	var booking fleetrate.Booking
	if t.maxWait != nil {
		req.MaxWait = *t.maxWait
		req.Booking = &booking
	}
	// Checked here rather than left to the store, so that a bad request is
	// not counted as a decision that failed.
	if err := checkPermitTake(names, req); err != nil {
		return Decision{}, err
	}
	if err := req.Validate(); err != nil {
		return Decision{}, err
	}
	res, err := v.decidePermit(ctx, req)
	// The metric names one bucket, the one that decided, so that lists of
	// buckets cannot multiply the label values.
	label, result := names[0], resultError
	decider := ""
	if err == nil {
		result = resultAllowed
		if !res.Allowed {
			result = resultOverLimit
		}
		if res.Bucket >= 0 && res.Bucket < len(names) {
			label, decider = names[res.Bucket], names[res.Bucket]
		}
		if f := res.InFlight; f.Bucket >= 0 && f.Bucket < len(names) {
			v.metrics.permitsHeld(names[f.Bucket], f)
		}
	}
	v.metrics.decision(t.api, "", label, result)
	if err != nil {
		return Decision{}, err
	}
	d := Decision{
		Allowed:      res.Allowed,
		N:            res.N,
		Remaining:    res.Remaining,
		WaitMS:       millis(res.Wait),
		RetryAfterMS: millis(res.RetryAfter),
		ResetAfterMS: millis(res.ResetAfter),
		Bucket:       decider,
		Limit:        wire.FromLimit(res.Limit),
		AtUnixMicro:  res.At.UnixMicro(),
		retryAfter:   res.RetryAfter,
	}
	taken := n > 0 || slices.ContainsFunc(req.Costs, func(c int64) bool { return c > 0 })
	if t.maxWait != nil {
		mw := millis(*t.maxWait)
		d.MaxWaitMS = &mw
		if res.Allowed && taken && len(booking.Debts) > 0 {
			d.Booking = &wire.Booking{StampUnixMicro: booking.Stamp, DebtsNS: booking.Debts, Costs: booking.Costs}
		}
	}
	if res.Allowed && taken {
		// A settle grant for the metered takes only (costs, acquire): it
		// costs /v1/take's hot path a tenth of its allocations.
		d.Grant, d.SettleGrant, d.Booking = v.grantsFor(ctx, bs, n, req.Costs, res.At, res.Wait, d.Booking, req.Costs != nil || req.Permit.ID != "")
	}
	v.describePermit(&d, names, req, res)
	d.Quotas, d.QuotaDenied = quotaViews(names, res), res.QuotaDenied
	return d, nil
}

// refund serves POST /v1/refund.
func (v service) refund(ctx context.Context, req *RefundRequest) (Done, error) {
	n, err := cost(req.N, 1)
	if err == nil {
		err = maxRefund(n)
	}
	if err == nil && req.AtUnixMicro <= 0 && req.Grant == "" {
		err = badRequest(wire.CodeInvalid, "at_unix_micro: the grant's time (its decision's at_unix_micro) is required without a grant, got %d", req.AtUnixMicro)
	}
	if err == nil && req.Reserve < 0 {
		err = badRequest(wire.CodeInvalid, "reserve: must be at least 0, got %d", req.Reserve)
	}
	if err != nil {
		return Done{}, err
	}
	_, bs, err := v.resolve(req.Bucket, req.Buckets)
	if err != nil {
		return Done{}, err
	}
	for i := range bs {
		bs[i].Reserve = req.Reserve // resolve's own copies
	}
	cl, err := v.prove(ctx, giveBack{kind: grantRefund, grant: req.Grant, bs: bs, n: n, at: max(req.AtUnixMicro, 0)})
	if err != nil {
		return Done{}, err
	}
	at := req.AtUnixMicro
	if cl.exp != 0 {
		at = cl.at
		if req.N == nil {
			n = cl.n // a grant's refund gives back all of it unless told
		}
	}
	if err := v.store.Refund(ctx, bs, n, time.UnixMicro(at)); err != nil {
		v.unspend(ctx, cl)
		return Done{}, err
	}
	return Done{OK: true}, nil
}

// maxRefund bounds a refund's n. The stores check n >= 0, but not that it
// is at most MaxBurst: more would refill any bucket, and a count that
// large is a client's mistake.
func maxRefund(n int64) error {
	if n > fleetrate.MaxBurst {
		return badRequest(wire.CodeInvalid, "n: must be at most %d, got %d", int64(fleetrate.MaxBurst), n)
	}
	return nil
}

// cancel serves POST /v1/cancel.
func (v service) cancel(ctx context.Context, req *CancelRequest) (Done, error) {
	n, err := cost(req.N, 1)
	if err != nil {
		return Done{}, err
	}
	if req.Booking == nil {
		return Done{}, badRequest(wire.CodeInvalid, "booking: the /v1/wait decision's booking is required")
	}
	if req.Booking.Costs != nil && req.N == nil {
		n = 0 // a booking of costs by bucket carries its costs
	}
	_, bs, err := v.resolve(req.Bucket, req.Buckets)
	if err != nil {
		return Done{}, err
	}
	return v.cancelBooking(ctx, bs, n, req.Booking)
}

// cancelBooking gives back a booking, proven by its grant (or by the
// admin scope).
func (v service) cancelBooking(ctx context.Context, bs []fleetrate.Bucket, n int64, b *wire.Booking) (Done, error) {
	cl, err := v.prove(ctx, giveBack{kind: grantCancel, grant: b.Grant, bs: bs, n: n, at: b.StampUnixMicro, debts: bookingProof(b.DebtsNS, b.Costs)})
	if err != nil {
		return Done{}, err
	}
	if err := v.store.Cancel(ctx, bs, n, fleetrate.Booking{Stamp: b.StampUnixMicro, Debts: b.DebtsNS, Costs: b.Costs}); err != nil {
		v.unspend(ctx, cl)
		return Done{}, err
	}
	return Done{OK: true}, nil
}

// drain serves POST /v1/drain.
func (v service) drain(ctx context.Context, req *DrainRequest) (Done, error) {
	var d time.Duration
	switch {
	case req.PauseMS != nil && req.Until != nil:
		return Done{}, badRequest(wire.CodeInvalid, "give pause_ms or until, not both")
	case req.PauseMS == nil && req.Until == nil:
		// A forgotten field would empty the buckets: 0 must be said.
		return Done{}, badRequest(wire.CodeInvalid, "pause_ms or until is required (pause_ms 0 empties the buckets without a pause)")
	case req.PauseMS != nil:
		var err error
		if d, err = fromMillis("pause_ms", *req.PauseMS, fleetrate.MaxWaitCap); err != nil {
			return Done{}, err
		}
	case req.Until != nil:
		d = max(req.Until.Sub(v.opts.Clock()), 0)
		if d > fleetrate.MaxWaitCap {
			return Done{}, badRequest(wire.CodeInvalid, "until: must be at most %v from now, got %v", fleetrate.MaxWaitCap, d)
		}
	}
	_, bs, err := v.resolve(req.Bucket, req.Buckets)
	if err != nil {
		return Done{}, err
	}
	ms := millis(d)
	return Done{OK: true, PauseMS: &ms}, v.store.Drain(ctx, bs, d)
}

// reset serves POST /v1/reset.
func (v service) reset(ctx context.Context, req *BucketsRequest) (Done, error) {
	_, bs, err := v.resolve(req.Bucket, req.Buckets)
	if err != nil {
		return Done{}, err
	}
	keys := make([]string, len(bs))
	for i, b := range bs {
		keys[i] = b.StoreKey()
	}
	return Done{OK: true}, v.store.Reset(ctx, keys...)
}

// storeTake serves the raw store API's take.
func (v service) storeTake(ctx context.Context, req *wire.TakeRequest) (wire.Result, error) {
	if err := checkWireBuckets(req.Buckets); err != nil {
		return wire.Result{}, err
	}
	freq := fleetrate.Request{Buckets: wire.ToBuckets(req.Buckets), N: req.N, MaxWait: time.Duration(req.MaxWaitNS), Costs: req.Costs}
	if req.Permit != nil {
		freq.Permit = req.Permit.ToPermit()
	}
	var booked fleetrate.Booking
	if req.Booking {
		freq.Booking = &booked
	}
	// Validated before ownBuckets, whose messages assume valid buckets.
	if err := freq.Validate(); err != nil {
		return wire.Result{}, err
	}
	if err := v.ownBuckets(freq.Buckets); err != nil {
		return wire.Result{}, err
	}
	if err := v.pinned(ctx, freq.Buckets, false); err != nil {
		return wire.Result{}, err
	}
	res, err := v.store.Take(ctx, freq)
	if err != nil {
		return wire.Result{}, err
	}
	out := wire.FromResult(res)
	if len(booked.Debts) > 0 {
		out.Booking = &wire.Booking{StampUnixMicro: booked.Stamp, DebtsNS: booked.Debts, Costs: booked.Costs}
	}
	if res.Allowed && (freq.N > 0 || slices.ContainsFunc(freq.Costs, func(c int64) bool { return c > 0 })) {
		out.Grant, out.SettleGrant, out.Booking = v.grantsFor(ctx, freq.Buckets, freq.N, freq.Costs, res.At, res.Wait, out.Booking, true)
	}
	return out, nil
}

// storeCancel serves the raw store API's cancel.
func (v service) storeCancel(ctx context.Context, req *wire.CancelRequest) (wire.OK, error) {
	bs, err := v.storeBuckets(req.Buckets)
	if err == nil {
		err = v.pinned(ctx, bs, false)
	}
	if err == nil {
		// Checked before the grant is spent, with the store's own words.
		err = fleetrate.ValidateCancel(bs, req.N, fleetrate.Booking{Stamp: req.Booking.StampUnixMicro, Debts: req.Booking.DebtsNS, Costs: req.Booking.Costs})
	}
	if err != nil {
		return wire.OK{}, err
	}
	_, err = v.cancelBooking(ctx, bs, req.N, &req.Booking)
	return wire.OK{OK: err == nil}, err
}

// storeRefund serves the raw store API's refund.
func (v service) storeRefund(ctx context.Context, req *wire.RefundRequest) (wire.OK, error) {
	bs, err := v.storeBuckets(req.Buckets)
	if err == nil {
		err = maxRefund(req.N)
	}
	if err == nil {
		err = v.pinned(ctx, bs, false)
	}
	if err != nil {
		return wire.OK{}, err
	}
	var at time.Time // none: the store names the missing field
	if req.AtUnixMicro > 0 {
		at = time.UnixMicro(req.AtUnixMicro)
	}
	if req.Grant == "" {
		// Checked before the grant is asked for, with the store's words.
		if err := fleetrate.ValidateRefund(bs, req.N, at); err != nil {
			return wire.OK{}, err
		}
	}
	cl, err := v.prove(ctx, giveBack{kind: grantRefund, grant: req.Grant, bs: bs, n: req.N, at: max(req.AtUnixMicro, 0)})
	if err != nil {
		return wire.OK{}, err
	}
	if cl.exp != 0 {
		at = time.UnixMicro(cl.at)
	}
	if err := v.store.Refund(ctx, bs, req.N, at); err != nil {
		v.unspend(ctx, cl)
		return wire.OK{}, err
	}
	return wire.OK{OK: true}, nil
}

// storeDrain serves the raw store API's drain.
func (v service) storeDrain(ctx context.Context, req *wire.DrainRequest) (wire.OK, error) {
	if len(req.Each) > 0 {
		return v.storeDrainEach(ctx, req.Each)
	}
	bs, err := v.storeBuckets(req.Buckets)
	if err == nil {
		err = v.pinned(ctx, bs, true)
	}
	if err != nil {
		return wire.OK{}, err
	}
	return wire.OK{OK: true}, v.store.Drain(ctx, bs, time.Duration(req.DurationNS))
}

// storeDrainEach serves the raw store API's drain of each bucket for its
// own duration.
func (v service) storeDrainEach(ctx context.Context, each []wire.DrainItem) (wire.OK, error) {
	wbs := make([]wire.Bucket, len(each))
	for i, d := range each {
		wbs[i] = d.Bucket
	}
	bs, err := v.storeBuckets(wbs)
	if err == nil {
		err = v.pinned(ctx, bs, true)
	}
	if err != nil {
		return wire.OK{}, err
	}
	drains := make([]fleetrate.Drain, len(each))
	for i, d := range each {
		drains[i] = fleetrate.Drain{Bucket: bs[i], For: time.Duration(d.DurationNS), Void: d.Void}
	}
	return wire.OK{OK: true}, v.store.DrainEach(ctx, drains)
}

// storeReset serves the raw store API's reset.
func (v service) storeReset(ctx context.Context, req *wire.ResetRequest) (wire.OK, error) {
	if len(req.Keys) > MaxBuckets {
		return wire.OK{}, badRequest(wire.CodeInvalid, "keys: at most %d, got %d", MaxBuckets, len(req.Keys))
	}
	keys := make([]string, len(req.Keys))
	for i, k := range req.Keys {
		keys[i] = string(k)
		if err := v.ownKey(fmt.Sprintf("keys[%d]", i), keys[i]); err != nil {
			return wire.OK{}, err
		}
		if err := v.pinnedKey(ctx, fmt.Sprintf("keys[%d]", i), keys[i], nil, true); err != nil {
			return wire.OK{}, err
		}
	}
	return wire.OK{OK: true}, v.store.Reset(ctx, keys...)
}

// cost reads a request's n, def when it is not given.
func cost(n *int64, def int64) (int64, error) {
	if n == nil {
		return def, nil
	}
	if *n < 0 {
		return 0, badRequest(wire.CodeInvalid, "n: must be >= 0, got %d", *n)
	}
	return *n, nil
}

// resolve maps bucket names to configured buckets.
func (s *Server) resolve(one string, many []string) ([]string, []fleetrate.Bucket, error) {
	names := many
	switch {
	case one != "" && len(many) > 0:
		return nil, nil, badRequest(wire.CodeInvalid, "give bucket or buckets, not both")
	case one != "":
		names = []string{one}
	case len(many) == 0:
		return nil, nil, badRequest(wire.CodeInvalid, "bucket: required (or buckets, a list)")
	case len(many) > MaxBuckets:
		return nil, nil, badRequest(wire.CodeInvalid, "buckets: at most %d, got %d", MaxBuckets, len(many))
	}
	st := s.state.Load()
	canon := make([]string, len(names))
	bs := make([]fleetrate.Bucket, len(names))
	for i, n := range names {
		b, ok := st.buckets[n]
		if !ok {
			return nil, nil, &httpError{status: http.StatusBadRequest, code: wire.CodeUnknownBucket,
				msg: fmt.Sprintf("bucket %q is not configured%s", n, s.knownBuckets(st))}
		}
		cb, _ := st.cfg.Bucket(n)
		canon[i], bs[i] = cb.Name, b
		if slices.Contains(canon[:i], cb.Name) {
			return nil, nil, badRequest(wire.CodeInvalid, "bucket %q is named twice", cb.Name)
		}
	}
	return canon, bs, nil
}

func (s *Server) knownBuckets(st *state) string {
	if len(st.cfg.Buckets) == 0 {
		return " (the configuration has no buckets)"
	}
	names := make([]string, 0, 10)
	for _, b := range st.cfg.Buckets {
		if len(names) == cap(names) {
			names = append(names, "...")
			break
		}
		names = append(names, b.Name)
	}
	return "; configured: " + strings.Join(names, ", ")
}

func checkWireBuckets(bs []wire.Bucket) error {
	if len(bs) > MaxBuckets {
		return badRequest(wire.CodeInvalid, "buckets: at most %d, got %d", MaxBuckets, len(bs))
	}
	for i, b := range bs {
		if n := len(b.Key) + len(b.Prefix); n > MaxStoreKeyBytes {
			return badRequest(wire.CodeInvalid, "buckets[%d].key: %d bytes, at most %d", i, n, MaxStoreKeyBytes)
		}
		for j, q := range b.Quotas {
			if _, err := q.ToQuota(); err != nil {
				return badRequest(wire.CodeInvalid, "buckets[%d].quotas[%d].period: %v", i, j, err)
			}
		}
	}
	return nil
}

// ownKey keeps the raw store API to the service's own keys: without it a
// client could delete or overwrite any key of the Redis behind it.
func (s *Server) ownKey(field, key string) error {
	if n := len(key); n > MaxStoreKeyBytes {
		return badRequest(wire.CodeInvalid, "%s: key of %d bytes, at most %d", field, n, MaxStoreKeyBytes)
	}
	if !strings.HasPrefix(key, s.opts.Prefix) {
		return badRequest(wire.CodeInvalid, "%s: key %q must start with the service's prefix %q", field, key, s.opts.Prefix)
	}
	return nil
}

// storeBuckets converts and checks the buckets of a raw store request
// other than a take: count, limits, and the service's own keys.
func (s *Server) storeBuckets(wb []wire.Bucket) ([]fleetrate.Bucket, error) {
	if err := checkWireBuckets(wb); err != nil {
		return nil, err
	}
	bs := wire.ToBuckets(wb)
	if err := fleetrate.ValidateBuckets(bs); err != nil {
		return nil, err
	}
	return bs, s.ownBuckets(bs)
}

// ownBuckets checks ownKey for every bucket.
func (s *Server) ownBuckets(bs []fleetrate.Bucket) error {
	for i, b := range bs {
		if err := s.ownKey(fmt.Sprintf("buckets[%d]", i), b.StoreKey()); err != nil {
			return err
		}
	}
	return nil
}
