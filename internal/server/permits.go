package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"slices"
	"sort"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/server/wire"
)

// The decide API's costs by bucket, settles and in-flight permits, for
// workers in any language: /v1/take and /v1/wait take "costs" by bucket
// name; /v1/settle adjusts a grant to its real cost, once, with the
// decision's settle_grant; /v1/acquire takes a permit of the buckets that
// bound in-flight takes (in_flight in the configuration), waiting for one
// first come first served up to max_wait_ms; /v1/renew extends its lease
// and /v1/release gives it back.
//
// The permit's id is what renews and releases it: the service draws 96
// random bits for it, and binds it to the caller's token (the store's id
// is the token's identity, a hash, then the id), so that a caller can
// neither guess another's permit nor release one another token acquired.

// mountPermits adds the endpoints of this file and the raw store API's
// settle, release and renew.
func (s *Server) mountPermits(mux *http.ServeMux, v service) {
	mux.HandleFunc("/v1/settle", s.api(http.MethodPost, ScopeDecide, endpoint(s, v.settle)))
	// /v1/acquire waits up to its max wait: each store call is bounded,
	// not the whole call.
	mux.HandleFunc("/v1/acquire", s.api(http.MethodPost, ScopeDecide, endpointWith(s, v.acquire, false)))
	mux.HandleFunc("/v1/renew", s.api(http.MethodPost, ScopeDecide, endpoint(s, v.renew)))
	mux.HandleFunc("/v1/release", s.api(http.MethodPost, ScopeDecide, endpoint(s, v.release)))
	mux.HandleFunc(wire.SettlePath, s.api(http.MethodPost, ScopeStore, s.storeAPI(endpoint(s, v.storeSettle))))
	mux.HandleFunc(wire.ReleasePath, s.api(http.MethodPost, ScopeStore, s.storeAPI(endpoint(s, v.storeRelease))))
	mux.HandleFunc(wire.RenewPath, s.api(http.MethodPost, ScopeStore, s.storeAPI(endpoint(s, v.storeRenew))))
	s.mountNotify(mux, v)
}

// AcquireRequest is the body of POST /v1/acquire: a take of n tokens (or
// of costs by bucket) with a permit of every named bucket that bounds
// in-flight takes, waiting for one up to MaxWaitMS (default 0: answer at
// once; at most the server's max wait), first come first served. TTLMS is
// the permit's lease (default 15000, between 1000 and 3600000): renew it
// within, or it lapses and goes to the next.
type AcquireRequest struct {
	Bucket    string           `json:"bucket,omitempty"`
	Buckets   []string         `json:"buckets,omitempty"`
	Costs     map[string]int64 `json:"costs,omitempty"`
	N         *int64           `json:"n,omitempty"`
	MaxWaitMS *float64         `json:"max_wait_ms,omitempty"`
	TTLMS     *float64         `json:"ttl_ms,omitempty"`
	Reserve   int64            `json:"reserve,omitempty"`
	// PermitReserve makes the acquire one of a lower priority class for
	// the permits too: it is granted only while the permits held, the
	// waiters of its class or above ahead of it, and PermitReserve stay
	// below each bucket's bound (fleetrate.Bucket.PermitReserve).
	PermitReserve int64 `json:"permit_reserve,omitempty"`
}

// PermitRequest is the body of POST /v1/renew and /v1/release: the
// buckets the permit was acquired from, its id (the decision's permit.id)
// and, for a renew, the new lease from now (TTLMS, default 15000; the
// service does not remember the lease the permit was acquired with).
type PermitRequest struct {
	Bucket   string   `json:"bucket,omitempty"`
	Buckets  []string `json:"buckets,omitempty"`
	PermitID string   `json:"permit_id"`
	TTLMS    *float64 `json:"ttl_ms,omitempty"`
}

// SettleRequest is the body of POST /v1/settle: what a grant's work
// really cost, by bucket name (Actual, every bucket of the take), against
// what the take cost (Costs by bucket, or N from each of Bucket or
// Buckets, as the take gave them). Grant is the decision's settle_grant:
// with it, the decide scope suffices and the grant's time is its own;
// without it, the settle needs the admin scope and AtUnixMicro (the
// decision's at_unix_micro plus its wait).
type SettleRequest struct {
	Bucket      string           `json:"bucket,omitempty"`
	Buckets     []string         `json:"buckets,omitempty"`
	Costs       map[string]int64 `json:"costs,omitempty"`
	N           *int64           `json:"n,omitempty"`
	Actual      map[string]int64 `json:"actual"`
	Grant       string           `json:"grant,omitempty"`
	AtUnixMicro int64            `json:"at_unix_micro,omitempty"`
}

// InFlightView is where the tightest in-flight bound of a decision
// stands: the bucket's bound, the permits held, and, for an acquire left
// waiting, its place.
type InFlightView struct {
	Bucket string `json:"bucket"`
	Bound  int64  `json:"bound"`
	Held   int64  `json:"held"`
	Queued bool   `json:"queued,omitempty"`
	Ahead  int    `json:"ahead,omitempty"`
}

// PermitView is a permit acquired: what /v1/renew and /v1/release present.
type PermitView struct {
	ID    string  `json:"id"`
	TTLMS float64 `json:"ttl_ms"`
}

// PermitAnswer is the response of /v1/renew and /v1/release: how many
// of the buckets that bound in-flight takes held the permit (Held of
// Bounded). On a renew, Lapsed (Held < Bounded) says a lease had ended:
// the permit may be another's now, so stop the work or acquire again.
type PermitAnswer struct {
	Held    int  `json:"held"`
	Bounded int  `json:"bounded"`
	Lapsed  bool `json:"lapsed,omitempty"`
}

// takeSpec is a decide API take as the request gave it.
type takeSpec struct {
	api     string
	one     string
	many    []string
	costs   map[string]int64
	n       *int64
	reserve int64
	// permitReserve is, for an acquire, each bounded bucket's
	// fleetrate.Bucket.PermitReserve.
	permitReserve int64
	maxWait       *time.Duration
	permit        fleetrate.Permit
}

// resolveTake maps a take's buckets to configured buckets: bucket or
// buckets with n each, or costs by bucket name (in the order of the
// buckets' names, whatever the spelling).
func (v service) resolveTake(t takeSpec) (names []string, bs []fleetrate.Bucket, n int64, costs []int64, err error) {
	if t.costs == nil {
		if n, err = cost(t.n, 1); err != nil {
			return nil, nil, 0, nil, err
		}
		names, bs, err = v.resolve(t.one, t.many)
		return names, bs, n, nil, err
	}
	switch {
	case t.one != "" || len(t.many) > 0:
		return nil, nil, 0, nil, badRequest(wire.CodeInvalid, "costs: give costs (by bucket name), or bucket or buckets, not both")
	case t.n != nil:
		return nil, nil, 0, nil, badRequest(wire.CodeInvalid, "n: give costs (by bucket name) or n, not both")
	case len(t.costs) == 0:
		return nil, nil, 0, nil, badRequest(wire.CodeInvalid, "costs: at least one bucket, got {}")
	}
	asked := make([]string, 0, len(t.costs))
	for name, c := range t.costs {
		if c < 0 {
			return nil, nil, 0, nil, badRequest(wire.CodeInvalid, "costs[%q]: must be >= 0, got %d", name, c)
		}
		asked = append(asked, name)
	}
	sort.Strings(asked)
	names, bs, err = v.resolve("", asked)
	if err != nil {
		return nil, nil, 0, nil, err
	}
	costs = make([]int64, len(asked))
	for i, name := range asked {
		costs[i] = t.costs[name]
	}
	sortTogether(names, bs, costs)
	return names, bs, 0, costs, nil
}

// sortTogether orders the buckets by canonical name, so that two
// spellings of one bucket take in one order (a grant names the order).
func sortTogether(names []string, bs []fleetrate.Bucket, costs []int64) {
	idx := make([]int, len(names))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return names[idx[a]] < names[idx[b]] })
	n2, b2, c2 := slices.Clone(names), slices.Clone(bs), slices.Clone(costs)
	for i, j := range idx {
		names[i], bs[i], costs[i] = n2[j], b2[j], c2[j]
	}
}

// checkPermitTake refuses, in the decide API's words, a take of tokens
// from a bucket that bounds in-flight takes without a permit, and an
// acquire from buckets none of which bounds them.
func checkPermitTake(names []string, req fleetrate.Request) error {
	bounded := false
	for i, b := range req.Buckets {
		if b.InFlight == 0 {
			continue
		}
		bounded = true
		if req.Permit.ID == "" && fleetrate.CostOf(req.N, req.Costs, i) > 0 {
			return badRequest(wire.CodeInvalid, "bucket %q bounds in-flight takes (in_flight %d): take from it with /v1/acquire, and release the permit when the work is done", names[i], b.InFlight)
		}
	}
	if req.Permit.ID != "" && !bounded {
		return badRequest(wire.CodeInvalid, "buckets: none of %q bounds in-flight takes: give a bucket in_flight in the configuration to acquire its permits, or use /v1/take", names)
	}
	return nil
}

// describePermit puts the costs, the in-flight bound and the permit
// acquired in a decision.
func (v service) describePermit(d *Decision, names []string, req fleetrate.Request, res fleetrate.Result) {
	switch {
	case req.Costs != nil:
		d.Costs, d.Buckets = req.Costs, names
	case req.Permit.ID != "":
		d.Costs, d.Buckets = each(req.N, len(names)), names
	}
	if f := res.InFlight; f.Bound > 0 && f.Bucket >= 0 && f.Bucket < len(names) {
		d.InFlight = &InFlightView{Bucket: names[f.Bucket], Bound: f.Bound, Held: f.Held, Queued: f.Queued, Ahead: f.Ahead}
	}
	if res.Allowed && req.Permit.ID != "" {
		d.Permit = &PermitView{ID: publicID(req.Permit.ID), TTLMS: millis(req.Permit.TTL)}
	}
}

// acquire serves POST /v1/acquire.
func (v service) acquire(ctx context.Context, req *AcquireRequest) (Decision, error) {
	maxWait := time.Duration(0)
	if req.MaxWaitMS != nil {
		var err error
		if maxWait, err = v.maxWait(req.MaxWaitMS); err != nil {
			return Decision{}, err
		}
	}
	ttl, err := permitTTL(req.TTLMS)
	if err != nil {
		return Decision{}, err
	}
	var id [12]byte
	_, _ = rand.Read(id[:]) // never fails (crypto/rand)
	p := fleetrate.Permit{ID: storeID(ctx, hex.EncodeToString(id[:])), TTL: ttl}
	return v.takeBuckets(ctx, takeSpec{api: apiAcquire, one: req.Bucket, many: req.Buckets, costs: req.Costs, n: req.N,
		reserve: req.Reserve, permitReserve: req.PermitReserve, maxWait: &maxWait, permit: p})
}

// permitTTL reads a request's ttl_ms.
func permitTTL(ms *float64) (time.Duration, error) {
	if ms == nil {
		return fleetrate.DefaultPermitTTL, nil
	}
	d, err := fromMillis("ttl_ms", *ms, fleetrate.MaxPermitTTL)
	if err == nil && d < fleetrate.MinPermitTTL {
		err = badRequest(wire.CodeInvalid, "ttl_ms: must be at least %d (renew at a third of it), got %v", fleetrate.MinPermitTTL/time.Millisecond, *ms)
	}
	return d, err
}

// storeID is the store's id of a permit the caller of ctx acquired with
// id: bound to its token, so that another token's caller that learned id
// cannot release it.
func storeID(ctx context.Context, id string) string {
	return "h" + callerOf(ctx).id + "." + id
}

// publicID is the caller's id of a permit the store knows as id.
func publicID(id string) string {
	for i := 0; i < len(id); i++ {
		if id[i] == '.' {
			return id[i+1:]
		}
	}
	return id
}

// renew serves POST /v1/renew.
func (v service) renew(ctx context.Context, req *PermitRequest) (PermitAnswer, error) {
	ttl, err := permitTTL(req.TTLMS)
	if err != nil {
		return PermitAnswer{}, err
	}
	bs, err := v.permitOf(ctx, req)
	if err != nil {
		return PermitAnswer{}, err
	}
	held, err := v.store.Renew(ctx, bs, fleetrate.Permit{ID: storeID(ctx, req.PermitID), TTL: ttl})
	v.metrics.permitLapsed(storeOpRenew, err, held, bs)
	bounded := countBounded(bs)
	return PermitAnswer{Held: held, Bounded: bounded, Lapsed: held < bounded}, err
}

// release serves POST /v1/release.
func (v service) release(ctx context.Context, req *PermitRequest) (PermitAnswer, error) {
	if req.TTLMS != nil {
		return PermitAnswer{}, badRequest(wire.CodeInvalid, "ttl_ms: a release takes none (it ends the lease)")
	}
	bs, err := v.permitOf(ctx, req)
	if err != nil {
		return PermitAnswer{}, err
	}
	held, err := v.store.Release(ctx, bs, storeID(ctx, req.PermitID))
	v.metrics.permitLapsed(storeOpRelease, err, held, bs)
	return PermitAnswer{Held: held, Bounded: countBounded(bs)}, err
}

// permitOf checks a renew's or release's permit id and resolves its
// buckets, one at least bounding in-flight takes.
func (v service) permitOf(ctx context.Context, req *PermitRequest) ([]fleetrate.Bucket, error) {
	if req.PermitID == "" {
		return nil, badRequest(wire.CodeInvalid, "permit_id: required (the /v1/acquire decision's permit.id)")
	}
	if err := (fleetrate.Permit{ID: req.PermitID, TTL: fleetrate.MinPermitTTL}).Validate(); err != nil {
		return nil, badRequest(wire.CodeInvalid, "permit_id: %q is not a permit id: printable ASCII without spaces, at most %d bytes", req.PermitID, fleetrate.MaxPermitIDLen/2)
	}
	if len(req.PermitID) > fleetrate.MaxPermitIDLen/2 {
		return nil, badRequest(wire.CodeInvalid, "permit_id: at most %d bytes, got %d", fleetrate.MaxPermitIDLen/2, len(req.PermitID))
	}
	names, bs, err := v.resolve(req.Bucket, req.Buckets)
	if err != nil {
		return nil, err
	}
	if countBounded(bs) == 0 {
		return nil, badRequest(wire.CodeInvalid, "buckets: none of %q bounds in-flight takes (no in_flight in the configuration), so none holds a permit", names)
	}
	return bs, nil
}

func countBounded(bs []fleetrate.Bucket) int {
	n := 0
	for _, b := range bs {
		if b.InFlight > 0 {
			n++
		}
	}
	return n
}

// settle serves POST /v1/settle.
func (v service) settle(ctx context.Context, req *SettleRequest) (Done, error) {
	names, bs, n, costs, err := v.resolveTake(takeSpec{one: req.Bucket, many: req.Buckets, costs: req.Costs, n: req.N})
	if err != nil {
		v.metrics.settle(settleInvalid)
		return Done{}, err
	}
	if costs == nil {
		costs = each(n, len(bs))
	}
	st := fleetrate.Settlement{Costs: costs, Actual: make([]int64, len(bs))}
	if err := settleActual(req.Actual, names, st.Actual); err != nil {
		v.metrics.settle(settleInvalid)
		return Done{}, err
	}
	switch {
	case req.AtUnixMicro < 0:
		err = badRequest(wire.CodeInvalid, "at_unix_micro: must be > 0, got %d", req.AtUnixMicro)
	case req.AtUnixMicro == 0 && req.Grant == "":
		err = badRequest(wire.CodeInvalid, "at_unix_micro: the grant's slot (its decision's at_unix_micro plus wait) is required without a grant (its settle_grant)")
	case req.AtUnixMicro > 0:
		st.At = time.UnixMicro(req.AtUnixMicro)
	default:
		st.At = time.UnixMicro(1) // the grant's own, once proven
	}
	if err == nil {
		err = fleetrate.ValidateSettle(bs, st)
	}
	if err != nil {
		v.metrics.settle(settleInvalid)
		return Done{}, err
	}
	if req.AtUnixMicro == 0 {
		st.At = time.Time{}
	}
	return Done{OK: true}, v.settleProven(ctx, bs, st, req.Grant)
}

// settleActual reads a settle's actual costs, one for every bucket of the
// take and no other.
func settleActual(actual map[string]int64, names []string, out []int64) error {
	if actual == nil {
		return badRequest(wire.CodeInvalid, "actual: required, what the work cost each bucket by name, e.g. {%q: 3}", names[0])
	}
	for i, name := range names {
		a, ok := actual[name]
		if !ok {
			return badRequest(wire.CodeInvalid, "actual[%q]: missing: give what the work cost every bucket of the take", name)
		}
		if a < 0 {
			return badRequest(wire.CodeInvalid, "actual[%q]: must be >= 0, got %d", name, a)
		}
		out[i] = a
	}
	if len(actual) != len(names) {
		for name := range actual {
			if !slices.Contains(names, name) {
				return badRequest(wire.CodeInvalid, "actual[%q]: not a bucket of the take (%q; give the names as the take's decision's buckets)", name, names)
			}
		}
	}
	return nil
}
