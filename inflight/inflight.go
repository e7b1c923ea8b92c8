// Package inflight is the in-flight bound of a bucket, for store authors:
// which permits are held, who waits for one, and the pure functions that
// grant, queue, renew, release and expire them. A bucket with
// fleetrate.Bucket.InFlight set admits at most that many holders at once
// across the fleet; a take from it acquires a permit together with its
// tokens, all or nothing (see gcra.Decide, which calls Admit and Grant).
//
// A permit is a lease on the store's clock: it lapses at Expires unless
// its holder renews it, so a holder that dies (kill -9, a partition) gives
// its permit back within its TTL and never earlier. A place in the queue
// is a lease too: a waiter that dies leaves the queue within its TTL.
//
// Everything here is pure: time comes in as an argument (µs since the Unix
// epoch on the store's clock) and the Set is changed in place.
package inflight

import "slices"

// Lease is one holder's permit, or one waiter's place in the queue: who,
// and until when (µs on the store's clock). A waiter's Reserve is the
// permits its take leaves free for the priority classes above its own
// (fleetrate.Bucket.PermitReserve): 0 for the top class.
type Lease struct {
	ID      string
	Expires int64
	Reserve int64
}

// Set is what a store keeps for a bucket's in-flight bound: the permits
// held and the queue of takes waiting for one, first come first served.
// The zero value is a bucket with no permit held and nobody waiting.
type Set struct {
	// Held are the permits held, in no particular order.
	Held []Lease
	// Queue are the waiters, in the order they came.
	Queue []Lease
}

// Expire drops the leases that ended by now.
func (s *Set) Expire(now int64) {
	s.Held = slices.DeleteFunc(s.Held, func(l Lease) bool { return l.Expires <= now })
	s.Queue = slices.DeleteFunc(s.Queue, func(l Lease) bool { return l.Expires <= now })
}

// Empty reports whether nobody holds or waits.
func (s *Set) Empty() bool { return len(s.Held) == 0 && len(s.Queue) == 0 }

// holds returns the index of id in s.Held, or -1.
func (s *Set) holds(id string) int {
	return slices.IndexFunc(s.Held, func(l Lease) bool { return l.ID == id })
}

// place returns the index of id in s.Queue, or -1.
func (s *Set) place(id string) int {
	return slices.IndexFunc(s.Queue, func(l Lease) bool { return l.ID == id })
}

// Admit reports whether id, a take that leaves reserve permits free for
// the classes above its own (0: the top class), may hold a permit now
// under bound: it holds one already (a retried acquire), or a permit is
// free for it once every waiter ahead of it of its class or above (a
// reserve no larger) is served, with reserve permits to spare. A take
// that is not queued counts as the last in line, so it never takes a
// permit a waiter of its class or above is owed; a waiter of a lower
// class never holds back one above it. ahead is how many waiters of its
// class or above come before id (all of them, when id is not queued). The
// caller has expired s.
func (s *Set) Admit(id string, bound, reserve int64) (ok bool, ahead int) {
	if s.holds(id) >= 0 {
		return true, 0
	}
	ahead = s.ahead(id, reserve)
	return int64(len(s.Held)+ahead)+reserve < bound, ahead
}

// ahead returns how many waiters of reserve at most reserve come before
// id in the queue (before its end, when id does not wait).
func (s *Set) ahead(id string, reserve int64) int {
	end := s.place(id)
	if end < 0 {
		end = len(s.Queue)
	}
	n := 0
	for _, l := range s.Queue[:end] {
		if l.Reserve <= reserve {
			n++
		}
	}
	return n
}

// Grant gives id a permit until expires, leaving the queue if it waited.
// It renews a permit id holds already.
func (s *Set) Grant(id string, expires int64) {
	if i := s.place(id); i >= 0 {
		s.Queue = slices.Delete(s.Queue, i, i+1)
	}
	if i := s.holds(id); i >= 0 {
		s.Held[i].Expires = max(s.Held[i].Expires, expires)
		return
	}
	s.Held = append(s.Held, Lease{ID: id, Expires: expires})
}

// Enqueue puts id, of reserve (see Admit), in the queue until expires,
// keeping its place when it waits already (its lease is renewed), and
// returns how many of its class or above wait ahead.
func (s *Set) Enqueue(id string, expires, reserve int64) (ahead int) {
	if i := s.place(id); i >= 0 {
		s.Queue[i].Expires = max(s.Queue[i].Expires, expires)
		return s.ahead(id, reserve)
	}
	ahead = s.ahead(id, reserve)
	s.Queue = append(s.Queue, Lease{ID: id, Expires: expires, Reserve: reserve})
	return ahead
}

// Renew extends id's permit, or its place in the queue, until expires. It
// reports false when id neither holds nor waits: its lease lapsed (or was
// released), and the permit may be another's now.
func (s *Set) Renew(id string, expires int64) bool {
	if i := s.holds(id); i >= 0 {
		s.Held[i].Expires = max(s.Held[i].Expires, expires)
		return true
	}
	if i := s.place(id); i >= 0 {
		s.Queue[i].Expires = max(s.Queue[i].Expires, expires)
		return true
	}
	return false
}

// Release gives back id's permit and its place in the queue, if any. It
// reports whether id held a permit. Releasing what is not held (twice, or
// after the lease lapsed) changes nothing.
func (s *Set) Release(id string) (held bool) {
	if i := s.place(id); i >= 0 {
		s.Queue = slices.Delete(s.Queue, i, i+1)
	}
	if i := s.holds(id); i >= 0 {
		s.Held = slices.Delete(s.Held, i, i+1)
		return true
	}
	return false
}

// Woken returns the waiters a permit is free for under bound, the ones a
// store wakes after a release: the first in the queue, as many as permits
// are free, passing over a waiter whose reserve (its priority class)
// leaves it none, within the first free + 64.
func (s *Set) Woken(bound int64) []string {
	free := bound - int64(len(s.Held))
	var ids []string
	for i, l := range s.Queue {
		if int64(len(ids)) >= free || int64(i) >= free+64 {
			break
		}
		if l.Reserve < free {
			ids = append(ids, l.ID)
		}
	}
	return ids
}

// NextFree returns how long (µs) from now until a held permit's lease ends
// at the latest, with no release or renewal: the longest a waiter may have
// to wait for the next permit. 0 when none is held.
func (s *Set) NextFree(now int64) int64 { return firstEnd(s.Held, now) }

// NextLapse returns how long (µs) from now until the first waiter's place
// in the queue lapses, with no renewal: when a waiter that stopped (a
// paused or dead process) leaves the queue, and those behind it move up,
// with no release to tell them. 0 when nobody waits.
func (s *Set) NextLapse(now int64) int64 { return firstEnd(s.Queue, now) }

// firstEnd returns how long (µs) from now until the first of ls ends, 0
// when ls is empty or one has ended.
func firstEnd(ls []Lease, now int64) int64 {
	if len(ls) == 0 {
		return 0
	}
	first := ls[0].Expires
	for _, l := range ls[1:] {
		first = min(first, l.Expires)
	}
	return max(first-now, 0)
}

// Wait returns how long (µs) from now a take that finds no permit for it
// waits at most before things change without a word from the store: a
// held lease ends (NextFree) or a waiter's place lapses (NextLapse),
// whichever comes first; at least 1. A release, or a waiter ahead taking
// its permit, comes sooner, and a store that tells wakes the waiters it
// concerns (see fleetrate.PermitNotifier).
func (s *Set) Wait(now int64) int64 {
	d := s.NextFree(now)
	if q := s.NextLapse(now); q > 0 && (d == 0 || q < d) {
		d = q
	}
	return max(d, 1)
}

// Last returns when the last lease ends (µs), or 0 when none is held or
// queued: a store keeps the set until then.
func (s *Set) Last() int64 {
	var last int64
	for _, l := range s.Held {
		last = max(last, l.Expires)
	}
	for _, l := range s.Queue {
		last = max(last, l.Expires)
	}
	return last
}

// Clone returns a copy of s with slices of its own.
func (s *Set) Clone() Set {
	return Set{Held: slices.Clone(s.Held), Queue: slices.Clone(s.Queue)}
}
