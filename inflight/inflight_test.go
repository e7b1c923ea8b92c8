package inflight

import "testing"

// TestTimeline walks one bucket of bound 2 through a fixed timeline (µs):
// grants, a queue served first come first served, a take that may not
// wait never jumping the queue, renewals, releases and leases that end.
func TestTimeline(t *testing.T) {
	var s Set
	admit := func(now int64, id string, want bool, wantAhead int) {
		t.Helper()
		s.Expire(now)
		ok, ahead := s.Admit(id, 2)
		if ok != want || ahead != wantAhead {
			t.Fatalf("t=%d Admit(%s) = %v, %d ahead; want %v, %d", now, id, ok, ahead, want, wantAhead)
		}
	}
	admit(0, "a", true, 0)
	s.Grant("a", 100)
	admit(0, "b", true, 0)
	s.Grant("b", 50)
	admit(10, "c", false, 0)
	if ahead := s.Enqueue("c", 80); ahead != 0 {
		t.Fatalf("first waiter has %d ahead", ahead)
	}
	if ahead := s.Enqueue("d", 90); ahead != 1 {
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
	if s.Head() != "d" || len(s.Queue) != 1 {
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
	s := Set{Held: []Lease{{"a", 1}}, Queue: []Lease{{"b", 2}}}
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
