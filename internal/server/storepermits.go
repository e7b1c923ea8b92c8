package server

import (
	"context"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/server/wire"
)

// The raw store API's settle, release and renew (/v1/store/settle,
// /release, /renew), for remotestore.
//
// A settle gives back (a grant settled to less) as a refund does, so it
// presents the take's settle grant (wire.Result.SettleGrant), spent once:
// a second settle of one grant, or a refund after it, is refused with
// grant_refused ("already settled or given back"); without a grant it
// needs the admin scope. Release and renew need the store scope and the
// permit's id: the id is the capability. A Limiter draws 96 random bits
// for each acquisition, so a client cannot release or renew another's
// permit without having been told its id.

// storeSettle serves the raw store API's settle.
func (v service) storeSettle(ctx context.Context, req *wire.SettleRequest) (wire.OK, error) {
	bs, err := v.storeBuckets(req.Buckets)
	if err == nil {
		err = v.pinned(ctx, bs, false)
	}
	if err != nil {
		return wire.OK{}, err
	}
	st := fleetrate.Settlement{Costs: req.Costs, Actual: req.Actual}
	if req.AtUnixMicro > 0 {
		st.At = time.UnixMicro(req.AtUnixMicro)
	}
	// Checked before the grant is spent, with the store's own words.
	if err := fleetrate.ValidateSettle(bs, st); err != nil {
		v.metrics.settle(settleInvalid)
		return wire.OK{}, err
	}
	return wire.OK{OK: true}, v.settleProven(ctx, bs, st, req.Grant)
}

// settleProven settles st, proven by its settle grant (or by the admin
// scope), counting the outcome.
func (v service) settleProven(ctx context.Context, bs []fleetrate.Bucket, st fleetrate.Settlement, grant string) error {
	at := int64(0)
	if !st.At.IsZero() {
		at = st.At.UnixMicro()
	}
	cl, err := v.prove(ctx, giveBack{kind: grantSettle, grant: grant, bs: bs, at: at, debts: st.Costs})
	if err != nil {
		v.metrics.settle(settleRefused)
		return err
	}
	if cl.exp != 0 {
		st.At = time.UnixMicro(cl.at)
	}
	if err := v.store.Settle(ctx, bs, st); err != nil {
		v.unspend(ctx, cl)
		v.metrics.settle(settleError)
		return err
	}
	v.metrics.settle(settleOutcome(st))
	return nil
}

// storeRelease serves the raw store API's release.
func (v service) storeRelease(ctx context.Context, req *wire.ReleaseRequest) (wire.Held, error) {
	bs, err := v.permitBuckets(ctx, req.Buckets)
	if err == nil {
		err = fleetrate.ValidateRelease(bs, req.ID)
	}
	if err != nil {
		return wire.Held{}, err
	}
	held, err := v.store.Release(ctx, bs, req.ID)
	v.metrics.permitLapsed(storeOpRelease, err, held, bs)
	return wire.Held{Held: held}, err
}

// storeRenew serves the raw store API's renew.
func (v service) storeRenew(ctx context.Context, req *wire.RenewRequest) (wire.Held, error) {
	bs, err := v.permitBuckets(ctx, req.Buckets)
	p := fleetrate.Permit{ID: req.ID, TTL: time.Duration(req.TTLNS)}
	if err == nil {
		err = fleetrate.ValidateRenew(bs, p)
	}
	if err != nil {
		return wire.Held{}, err
	}
	held, err := v.store.Renew(ctx, bs, p)
	v.metrics.permitLapsed(storeOpRenew, err, held, bs)
	return wire.Held{Held: held}, err
}

// permitBuckets converts and checks the buckets of a release or renew.
func (v service) permitBuckets(ctx context.Context, wb []wire.Bucket) ([]fleetrate.Bucket, error) {
	bs, err := v.storeBuckets(wb)
	if err == nil {
		err = v.pinned(ctx, bs, false)
	}
	return bs, err
}

// each is n for each of k buckets.
func each(n int64, k int) []int64 {
	out := make([]int64, k)
	for i := range out {
		out[i] = n
	}
	return out
}
