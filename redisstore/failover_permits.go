package redisstore

// This file is what Options.EmptyAfterFailover does for in-flight permits.
//
// A new master has the permits the replica last copied, or none: the
// permits the old master granted after that copy, or all of them on a
// master restarted without its data, would be free again, and the new
// master would admit up to the bound more holders while the old ones
// still work. So, as it empties a bucket (failover.go), the store fills
// its permit set: before its first take of a bucket with an in-flight
// bound on a new master, it counts every permit of the bucket as held
// (the FILL member of scripts/permits.lua) for hold from the new master's
// clock, where hold is the longest lease this process has asked for
// (acquired or renewed, on any bucket) or the take's own, whichever is
// longer, plus a second for the two masters' clocks: a permit the old
// master granted or renewed before the switch ended by then, unless its
// holder renewed it since on the new master. While a bucket is filled:
//
//   - no take is granted a permit of it (a take that may wait queues);
//   - a holder that renews is taken back as a holder, up to the bound
//     (renew.lua), so live holders keep working and Renew tells them so;
//     a holder that does not renew within its lease is gone, as on the
//     old master;
//   - the fill ends by itself (its member's score passes), after which
//     the bucket admits as usual, counting the holders taken back.
//
// The bound holds if every process of the fleet uses one lease TTL per
// bucket (the Limiter's default), or the process that takes first after
// the switch knows the longest: a process that fills for a shorter lease
// than another process's holders have lets the bucket admit again before
// those leases could end. Without EmptyAfterFailover (Cluster and Ring
// clients, or KeepAfterFailover) nothing is filled: after a failover the
// bucket may hold up to the bound more permits than it should until the
// lost holders' leases end (one TTL at most), and a lost holder's next
// Renew reports 0, telling it that its permit may be another's.

import (
	"context"
	"time"

	"github.com/fleetrate/fleetrate"
)

// fillSlack is added to a fill for the clocks of the old and new masters,
// which differ by a little.
const fillSlack = time.Second

// leased notes a permit lease of d that this process asked for.
func (f *failover) leased(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lease = max(f.lease, d)
}

// toFill returns the buckets of a take with an in-flight bound whose
// permits this process has not yet filled on the current master, and how
// long to fill them (see above). active is false when no switch happened
// within the failover window or the longest lease, whichever is longer:
// there is nothing to fill then.
func (f *failover) toFill(buckets []fleetrate.Bucket, ttl time.Duration) (todo []fleetrate.Bucket, hold time.Duration, epoch int64, active bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lease = max(f.lease, ttl)
	if f.epoch == 0 || f.now().Sub(f.switched) > max(f.window, f.lease+fillSlack) {
		return nil, 0, f.epoch, false
	}
	if f.filledEpoch != f.epoch {
		f.filled, f.filledEpoch = map[string]bool{}, f.epoch
	}
	hold = min(f.lease, fleetrate.MaxPermitTTL)
	for _, b := range buckets {
		if b.InFlight > 0 && !f.filled[b.StoreKey()] {
			todo = append(todo, b)
		}
	}
	return todo, hold, f.epoch, true
}

// filledOn marks key's permits as filled on the master of epoch.
func (f *failover) filledOn(key string, epoch int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.filledEpoch == epoch && f.filled != nil {
		f.filled[key] = true
	}
}

// fill fills, on a new master, the permits of the buckets of req that
// bound in-flight takes (see above), and marks their permit keys as
// emptied for the guard, which otherwise refuses a take on them.
func (f *failover) fill(ctx context.Context, s *Store, req fleetrate.Request) error {
	if !extended(&req) {
		return nil // no bound: a plain take pays nothing here
	}
	todo, hold, epoch, active := f.toFill(req.Buckets, req.Permit.TTL)
	if !active {
		return nil
	}
	for _, b := range todo {
		keys, _, err := s.appendPermitKeys(nil, []fleetrate.Bucket{b}, false)
		if err != nil {
			return err
		}
		if hold > 0 {
			if err := s.eval(ctx, fillScript, keys, microseconds(hold+fillSlack)).Err(); err != nil {
				return failed(ctx, "fill permits", err)
			}
			f.filledOn(b.StoreKey(), epoch)
		}
	}
	for _, b := range req.Buckets {
		if b.InFlight == 0 {
			continue
		}
		keys, _, err := s.appendPermitKeys(nil, []fleetrate.Bucket{b}, false)
		if err != nil {
			return err
		}
		for _, k := range keys {
			f.emptiedOn(k, epoch)
		}
	}
	return nil
}
