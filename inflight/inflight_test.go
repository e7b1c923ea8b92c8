package inflight

import (
	"slices"
	"testing"
)

// TestTimeline walks one bucket of bound 2 through a fixed timeline (µs):
// grants, a queue served first come first served, a take that may not
// wait never jumping the queue, renewals, releases and leases that end.
func TestTimeline(t *testing.T) {
	var s Set
	admit := func(now int64, id string, want bool, wantAhead int) {
		t.Helper()
		s.Expire(now)
		ok, ahead := s.Admit(id, 2, 0)
		if ok != want || ahead != wantAhead {
			t.Fatalf("t=%d Admit(%s) = %v, %d ahead; want %v, %d", now, id, ok, ahead, want, wantAhead)
		}
	}
	admit(0, "a", true, 0)
	s.Grant("a", 100)
	admit(0, "b", true, 0)
	s.Grant("b", 50)
	admit(10, "c", false, 0)
	if ahead := s.Enqueue("c", 80, 0); ahead != 0 {
		t.Fatalf("first waiter has %d ahead", ahead)
	}
	if ahead := s.Enqueue("d", 90, 0); ahead != 1 {
		t.Fatalf("second waiter has %d ahead", ahead)
	}
	admit(10, "a", true, 0) // a holder's retried acquire
	admit(20, "late", false, 2)
	if s.NextFree(20) != 30 {
		t.Fatalf("NextFree(20) = %d, want 30 (b's lease ends at 50)", s.NextFree(20))
	}
	// b's lease ends at 50: c, first in line, is admitted; d is not.
	admit(50, "d", false, 1)
	admit(50, "c", true, 0)
	s.Grant("c", 150)
	if len(s.Queue) != 1 || s.Queue[0].ID != "d" || len(s.Woken(2)) != 0 {
		t.Fatalf("after c's grant the queue is %v, want d alone", s.Queue)
	}
	if !s.Renew("d", 200) || s.Renew("b", 200) {
		t.Fatal("Renew: want true for a waiter, false for a lapsed holder")
	}
	if !s.Release("a") || s.Release("a") {
		t.Fatal("Release(a): want true once, then false")
	}
	admit(60, "d", true, 0)
	s.Grant("d", 160)
	admit(60, "e", false, 0)
	if s.Last() != 160 {
		t.Fatalf("Last() = %d, want 160", s.Last())
	}
	s.Expire(160)
	if !s.Empty() {
		t.Fatalf("every lease ended at 160, set is %+v", s)
	}
}

// TestCloneIsIndependent: a clone shares no slice with its original.
func TestCloneIsIndependent(t *testing.T) {
	s := Set{Held: []Lease{{ID: "a", Expires: 1}}, Queue: []Lease{{ID: "b", Expires: 2}}}
	c := s.Clone()
	c.Held[0].Expires, c.Queue[0].Expires = 9, 9
	if s.Held[0].Expires != 1 || s.Queue[0].Expires != 2 {
		t.Fatal("Clone shares memory with the original")
	}
}

// TestWait: a take that finds no permit waits until a held lease ends or
// a waiter's place lapses, whichever is first, and at least 1 µs.
func TestWait(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Set
		want int64
	}{
		{"nothing", Set{}, 1},
		{"held", Set{Held: []Lease{{ID: "a", Expires: 150}, {ID: "b", Expires: 120}}}, 20},
		{"a waiter first", Set{Held: []Lease{{ID: "a", Expires: 150}}, Queue: []Lease{{ID: "q", Expires: 130}}}, 30},
		{"waiters alone", Set{Queue: []Lease{{ID: "q", Expires: 180}, {ID: "r", Expires: 140}}}, 40},
		{"ended", Set{Held: []Lease{{ID: "a", Expires: 90}}}, 1},
	} {
		if got := tc.s.Wait(100); got != tc.want {
			t.Errorf("%s: Wait(100) = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestPriorityClasses: a take of a lower class leaves its reserve free,
// and a waiter of a lower class never holds back a take of a higher one.
func TestPriorityClasses(t *testing.T) {
	var s Set
	s.Grant("a", 100)
	// Bound 3: a low take (reserve 1) fits with 1 held, not with 2.
	if ok, _ := s.Admit("low", 3, 1); !ok {
		t.Fatal("a low take with 1 of 3 held and a reserve of 1: refused")
	}
	s.Grant("b", 100)
	if ok, _ := s.Admit("low", 3, 1); ok {
		t.Fatal("a low take with 2 of 3 held and a reserve of 1: admitted")
	}
	if ahead := s.Enqueue("low", 100, 1); ahead != 0 {
		t.Fatalf("the low waiter has %d ahead, want 0", ahead)
	}
	// The top class passes the low waiter and takes the last permit.
	if ok, ahead := s.Admit("top", 3, 0); !ok || ahead != 0 {
		t.Fatalf("a top take behind a low waiter: ok %v, %d ahead; want admitted, 0", ok, ahead)
	}
	// A top waiter ahead holds back a low take, and one of its class.
	s.Grant("top", 100)
	s.Release("a")
	s.Enqueue("top2", 100, 0)
	if ok, ahead := s.Admit("low2", 3, 1); ok || ahead != 2 {
		t.Fatalf("a low take behind a low and a top waiter: ok %v, %d ahead; want refused, 2", ok, ahead)
	}
	if ok, ahead := s.Admit("top3", 3, 0); ok || ahead != 1 {
		t.Fatalf("a top take behind a top waiter, 1 free: ok %v, %d ahead; want refused, 1", ok, ahead)
	}
}

// TestWoken: after a release a store wakes the first waiters a permit is
// free for, passing over those whose reserve leaves them none.
func TestWoken(t *testing.T) {
	s := Set{
		Held:  []Lease{{ID: "h", Expires: 100}},
		Queue: []Lease{{ID: "low", Expires: 100, Reserve: 2}, {ID: "top", Expires: 100}, {ID: "mid", Expires: 100, Reserve: 1}, {ID: "top2", Expires: 100}},
	}
	// Bound 3, 1 held: 2 free; low (reserve 2) cannot take one.
	if got := s.Woken(3); !slices.Equal(got, []string{"top", "mid"}) {
		t.Fatalf("Woken(3) = %v, want [top mid]", got)
	}
}
