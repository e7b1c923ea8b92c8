package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/gcra"
	"github.com/fleetrate/fleetrate/inflight"
)

// extended reports whether req has costs by bucket or an in-flight bound,
// which the take script of scripts/take_ext.lua runs (never the batcher,
// the folder or the one-limit path, so that no cost is ever read as N).
func extended(req *fleetrate.Request) bool {
	if req.Costs != nil || req.Permit.ID != "" {
		return true
	}
	for i := range req.Buckets {
		if req.Buckets[i].InFlight > 0 || len(req.Buckets[i].Quotas) > 0 {
			return true
		}
	}
	return false
}

// quotaSuffix names, after a bucket's permit base (see permitBase), the
// hash that holds what its calendar quotas used.
const quotaSuffix = ":quotas"

// appendQuotaKeys appends to keys the quota key of each bucket with
// calendar quotas.
func (s *Store) appendQuotaKeys(keys []string, buckets []fleetrate.Bucket) ([]string, error) {
	for _, b := range buckets {
		if len(b.Quotas) == 0 {
			continue
		}
		base, err := permitBase(b.StoreKey(), s.cluster || s.MultipleClocks())
		if err != nil {
			return nil, err
		}
		keys = append(keys, base+quotaSuffix)
	}
	return keys, nil
}

// clientNow is this machine's clock, which the first try of a take with
// calendar quotas computes their windows on; a test moves it.
var clientNow = time.Now

// windowTries is how many times a take with calendar quotas is sent: the
// first with the windows of this machine's clock, then with those of the
// server's clock when they differ (a take near a boundary).
const windowTries = 3

// takeExt runs one validated take with costs by bucket or in-flight
// permits in one call of the extended take script.
func (s *Store) takeExt(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	keys := storeKeys(req.Buckets)
	if err := s.sameSlot(keys); err != nil {
		return fleetrate.Result{}, err
	}
	keys, _, err := s.appendPermitKeys(keys, req.Buckets, false)
	if err != nil {
		return fleetrate.Result{}, err
	}
	if keys, err = s.appendQuotaKeys(keys, req.Buckets); err != nil {
		return fleetrate.Result{}, err
	}
	sctx, cancel := s.ctx(ctx)
	defer cancel()
	at := clientNow()
	for range windowTries {
		args := extArgs(req, at)
		var reply []int64
		err = s.bounded(sctx, func(ctx context.Context) (err error) {
			reply, err = s.eval(ctx, takeExtScript, keys, args...).Int64Slice()
			return err
		})
		if err != nil {
			return fleetrate.Result{}, failed(ctx, "take", err)
		}
		if len(reply) == 2 && reply[1] == 3 {
			at = time.UnixMicro(reply[0]) // the server's clock: its windows
			continue
		}
		return decodeExt(req, reply)
	}
	return fleetrate.Result{}, unavailable("take", fmt.Errorf("the calendar quotas' windows moved %d times in a row (the server's clock jumping?)", windowTries))
}

// extArgs returns the arguments of the extended take script for req, with
// the calendar quotas' windows at at.
func extArgs(req fleetrate.Request, at time.Time) []any {
	args := make([]any, 4, 4+len(req.Buckets)*9)
	args[0], args[1], args[2], args[3] = len(req.Buckets), int64(req.MaxWait), req.Permit.ID, microseconds(req.Permit.TTL)
	for i := range req.Buckets {
		b := &req.Buckets[i]
		args = appendTakeLimits(args, req.Buckets[i:i+1])
		args = append(args, fleetrate.CostOf(req.N, req.Costs, i), b.InFlight, b.PermitReserve, len(b.Quotas))
		for _, q := range b.Quotas {
			start, end := q.Period.Window(at)
			args = append(args, q.Key(), start.UnixMicro(), end.UnixMicro(), q.Count)
		}
	}
	return args
}

// decodeExt checks and replays the extended take script's reply for req:
// now_us, 1, the debts of each bucket before the take, where each bound
// stood (see view in scripts/permits.lua) and the script's decision. It
// makes the decision again with gcra.Decide from that state; a reply the
// replay does not agree with is an error, never a decision.
func decodeExt(req fleetrate.Request, reply []int64) (fleetrate.Result, error) {
	bad := func(format string, a ...any) (fleetrate.Result, error) {
		return fleetrate.Result{}, unavailable("take", fmt.Errorf("take script reply: "+format, a...))
	}
	if len(reply) < 2 || reply[1] != 1 {
		return bad("%d values, want now and 1 decision first", len(reply))
	}
	now, pos := reply[0], 2
	states := make([]gcra.State, len(req.Buckets))
	pos, err := readDebts(req.Buckets, now, reply, pos, states)
	if err != nil {
		return bad("%v", err)
	}
	for b, bk := range req.Buckets {
		if bk.InFlight == 0 {
			continue
		}
		if len(reply) < pos+viewLen {
			return bad("ends early")
		}
		p, err := permitView(now, req.Permit.ID, reply[pos:pos+viewLen])
		if err != nil {
			return bad("bucket %d: %v", b, err)
		}
		states[b].Permits = p
		pos += viewLen
	}
	for b, bk := range req.Buckets {
		for qi := range bk.Quotas {
			if len(reply) < pos+1 || reply[pos] < 0 || reply[pos] > fleetrate.MaxQuotaCount {
				return bad("bucket %d quota %d: no use, or out of range", b, qi)
			}
			q := &bk.Quotas[qi]
			start, end := q.Period.Window(time.UnixMicro(now))
			states[b].Quotas = append(states[b].Quotas, gcra.QuotaUse{Key: q.Key(), Start: start.UnixMicro(), End: end.UnixMicro(), Used: reply[pos]})
			pos++
		}
	}
	if len(reply) != pos+1 {
		return bad("%d values, want %d", len(reply), pos+1)
	}
	res, _ := gcra.Decide(now, req, states)
	if got := reply[pos]; res.Allowed != (got == 1) || res.InFlight.Queued != (got == 2) {
		return bad("decision %d, but allowed=%v queued=%v on replay", got, res.Allowed, res.InFlight.Queued)
	}
	return res, nil
}

// viewLen is how many values the take script reports for each bound.
const viewLen = 7

// permitView returns a set of permits that stands as a bound stood for id
// before a take, from the script's view of it (held, mine, place, qlen,
// first, qfirst, eligible): the leases that gcra.Decide reads (the
// earliest end of the held and of the waiters' places), with every other
// holder and waiter anonymous, and of the waiters ahead of id (all, when
// it waits not) eligible of its priority class or above and the others
// below every class. The replay allocates what memstore keeps: at most
// the bound's holders (65,536) and the waiters, of which a reply may
// report maxQueueView at most (beyond, the takes of the bucket fail as an
// unavailable store: a million takes waiting on one bucket is no queue
// but a fault).
func permitView(now int64, id string, v []int64) (inflight.Set, error) {
	held, mine, place, qlen, first, qfirst, eligible := v[0], v[1], v[2], v[3], v[4], v[5], v[6]
	before := place // the waiters ahead of id
	if place < 0 {
		before = qlen
	}
	switch {
	case held < 0 || held > fleetrate.MaxInFlight || qlen < 0 || qlen > maxQueueView:
		return inflight.Set{}, fmt.Errorf("%d held and %d waiting", held, qlen)
	case mine != 0 && (held == 0 || id == ""), mine != 0 && mine != 1:
		return inflight.Set{}, errors.New("a permit held by no one")
	case place < -1 || place >= max(qlen, 0) && place != -1:
		return inflight.Set{}, fmt.Errorf("place %d in a queue of %d", place, qlen)
	case held > 0 && first <= now:
		return inflight.Set{}, fmt.Errorf("a lease ending at %d, not after now %d", first, now)
	case qlen > 0 && qfirst <= now:
		return inflight.Set{}, fmt.Errorf("a place in the queue ending at %d, not after now %d", qfirst, now)
	case eligible < 0 || eligible > before:
		return inflight.Set{}, fmt.Errorf("%d waiters of the take's class ahead of it, of %d", eligible, before)
	}
	var p inflight.Set
	if held > 0 {
		p.Held = make([]inflight.Lease, held)
		for i := range p.Held {
			p.Held[i].Expires = first
		}
		if mine == 1 {
			p.Held[0].ID = id
		}
	}
	if qlen > 0 {
		p.Queue = make([]inflight.Lease, qlen)
		for i := range p.Queue {
			p.Queue[i].Expires = math.MaxInt64
			if int64(i) >= eligible {
				p.Queue[i].Reserve = fleetrate.MaxInFlight // below every class
			}
		}
		p.Queue[0].Expires = qfirst
		if place >= 0 {
			p.Queue[place].ID = id
		}
	}
	return p, nil
}

// maxQueueView is the longest queue of a bucket whose reply the client
// replays (see permitView).
const maxQueueView = 1 << 20
