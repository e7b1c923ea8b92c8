package redisstore

import (
	"errors"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

// TestFailoverBookkeeping walks the failover state through a store's life
// on a manual clock: learning the first master, a switch, the buckets
// emptied at their first take with the bookings this process holds, a
// stale answer from the master it left, and the end of the window.
func TestFailoverBookkeeping(t *testing.T) {
	now := time.Unix(1000, 0)
	f := newFailover(time.Minute, 300*time.Millisecond)
	f.now = func() time.Time { return now }
	lim := []fleetrate.Limit{fleetrate.PerSecond(10, 10)}
	a, b := fleetrate.Bucket{Key: "a", Limits: lim}, fleetrate.Bucket{Key: "b", Limits: lim}
	keys := []string{a.StoreKey()}

	// First contact: the ID is learnt and the call is sent again at once.
	if id, err := f.expect(keys, true); id != "" || err != nil {
		t.Fatalf("expect before any call = %q, %v", id, err)
	}
	if again, err := f.observe("", "m1"); !again || err != nil {
		t.Fatalf("first master: again %v, %v", again, err)
	}
	if todo, _, _ := f.toEmpty([]fleetrate.Bucket{a}); len(todo) != 0 {
		t.Fatalf("before any switch, %d buckets to empty", len(todo))
	}
	// A take that waits books a's bucket 3 s ahead; an immediate one books
	// nothing.
	f.record([]fleetrate.Bucket{a}, fleetrate.Result{Allowed: true, Wait: 3 * time.Second})
	f.record([]fleetrate.Bucket{b}, fleetrate.Result{Allowed: true})
	if _, ok := f.booked[b.StoreKey()]; ok {
		t.Errorf("an immediate grant was recorded as a booking")
	}

	// A new master: the call fails with errSwitched, and so does any take
	// until its buckets are emptied.
	now = now.Add(time.Second)
	if again, err := f.observe("m1", "m2"); again || !errors.Is(err, errSwitched) {
		t.Fatalf("switch: again %v, %v; want errSwitched", again, err)
	}
	if _, err := f.expect(keys, true); !errors.Is(err, errSwitched) {
		t.Fatalf("take before emptying: %v, want errSwitched", err)
	}
	if id, err := f.expect(keys, false); id != "m2" || err != nil {
		t.Fatalf("drain before emptying = %q, %v; want m2", id, err)
	}
	todo, hold, epoch := f.toEmpty([]fleetrate.Bucket{a, b})
	if len(todo) != 2 || hold[0] != 2300*time.Millisecond || hold[1] != 300*time.Millisecond {
		t.Fatalf("to empty: %v, hold %v; want a until its booking (2 s from now) and b now, each with the 300 ms margin", todo, hold)
	}
	f.emptiedOn(a.StoreKey(), epoch)
	if id, err := f.expect(keys, true); id != "m2" || err != nil {
		t.Fatalf("take after emptying = %q, %v; want m2", id, err)
	}
	// Another call that met the new master after the switch was seen.
	if again, err := f.observe("m1", "m2"); again || !errors.Is(err, errSwitched) {
		t.Errorf("late report of the same switch: again %v, %v; want errSwitched", again, err)
	}
	// The old master answering on an old connection changes nothing.
	if again, err := f.observe("m2", "m1"); again || !errors.Is(err, errStaleMaster) {
		t.Errorf("old master: again %v, %v; want errStaleMaster", again, err)
	}
	if id, _ := f.expect(keys, true); id != "m2" {
		t.Errorf("after a stale answer, the store expects %q, want m2", id)
	}
	// An emptying done for an earlier switch does not count for a later one.
	if again, err := f.observe("m2", "m3"); again || !errors.Is(err, errSwitched) {
		t.Fatalf("second switch: %v, %v", again, err)
	}
	f.emptiedOn(b.StoreKey(), epoch)
	if _, err := f.expect([]string{b.StoreKey()}, true); !errors.Is(err, errSwitched) {
		t.Errorf("b emptied on m2 counts on m3: %v", err)
	}
	// After the window, takes go as before.
	now = now.Add(2 * time.Minute)
	if id, err := f.expect(keys, true); id != "m3" || err != nil {
		t.Errorf("after the window = %q, %v; want m3", id, err)
	}
	if todo, _, _ := f.toEmpty([]fleetrate.Bucket{a, b}); len(todo) != 0 {
		t.Errorf("after the window, %d buckets to empty", len(todo))
	}
}

// TestFailoverBookingsArePruned: bookings that have passed are dropped once
// the map grows, so that it holds only live ones.
func TestFailoverBookingsArePruned(t *testing.T) {
	now := time.Unix(1000, 0)
	f := newFailover(0, -1)
	f.now = func() time.Time { return now }
	lim := []fleetrate.Limit{fleetrate.PerSecond(10, 10)}
	for i := range 5000 {
		now = now.Add(time.Millisecond)
		f.record([]fleetrate.Bucket{{Key: string(rune('a'+i%26)) + time.Duration(i).String(), Limits: lim}},
			fleetrate.Result{Allowed: true, Wait: 10 * time.Millisecond})
	}
	if n := len(f.booked); n > 1100 {
		t.Errorf("%d bookings kept, most of them past; want at most about 1024", n)
	}
}

func TestGuardReply(t *testing.T) {
	for _, tc := range []struct {
		err             error
		master          string
		notMaster, isIt bool
	}{
		{nil, "", false, false},
		{errors.New("FLEETRATE_MASTER 0123abcd"), "0123abcd", false, true},
		{errors.New("READONLY FLEETRATE_NOTMASTER this server is not a master"), "", true, true},
		{errors.New("FLEETRATE_NOTMASTER this server is not a master"), "", false, false}, // the reply before READONLY led it
		{errors.New("READONLY You can't write against a read only replica."), "", false, false},
		{errors.New("ERR FLEETRATE_MASTER x"), "", false, false},
	} {
		m, nm, ok := guardReply(tc.err)
		if m != tc.master || nm != tc.notMaster || ok != tc.isIt {
			t.Errorf("guardReply(%v) = %q, %v, %v; want %q, %v, %v", tc.err, m, nm, ok, tc.master, tc.notMaster, tc.isIt)
		}
	}
}

// TestFailoverMarginDefaults: 0 is the default margin, a negative one none.
func TestFailoverMarginDefaults(t *testing.T) {
	if f := newFailover(0, 0); f.margin != DefaultFailoverMargin {
		t.Errorf("margin 0: %v, want the default %v", f.margin, DefaultFailoverMargin)
	}
	if f := newFailover(0, -1); f.margin != 0 {
		t.Errorf("margin -1: %v, want none", f.margin)
	}
}
