package storetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

func refund(t *testing.T, s fleetrate.Store, key func(string) string) {
	lim := fleetrate.Every(time.Minute, 5)
	k := key("f")
	got := mustTake(t, s, one(k, 3, 0, lim))
	b := []fleetrate.Bucket{{Key: k, Limits: []fleetrate.Limit{lim}}}
	if err := s.Refund(context.Background(), b, 2, got.At); err != nil {
		t.Fatal(err)
	}
	// A minute a token: within a test's run, time has refilled none of
	// the grant's tokens, so they all go back.
	if res := mustTake(t, s, one(k, 0, 0, lim)); res.Remaining != 4 {
		t.Fatalf("after refund of 2: %d left, want 4", res.Remaining)
	}
	if err := s.Refund(context.Background(), b, 5, got.At); err != nil {
		t.Fatal(err)
	}
	if res := mustTake(t, s, one(k, 0, 0, lim)); res.Remaining != 5 || res.ResetAfter != 0 {
		t.Fatalf("refund overfilled or underfilled: %+v", res)
	}

	// A grant made long ago, whose tokens time has refilled since: they
	// are not given back twice (the bucket would otherwise grant them
	// again on top of what refilled).
	k2 := key("f2")
	b2 := []fleetrate.Bucket{{Key: k2, Limits: []fleetrate.Limit{lim}}}
	mustTake(t, s, one(k2, 5, 0, lim))
	old := mustTake(t, s, one(k2, 0, 0, lim)).At.Add(-3 * time.Minute)
	if err := s.Refund(context.Background(), b2, 5, old); err != nil {
		t.Fatal(err)
	}
	if res := mustTake(t, s, one(k2, 0, 0, lim)); res.Remaining != 2 {
		t.Fatalf("refund of 5 tokens granted 3 minutes ago (3 refilled since): %d left, want 2", res.Remaining)
	}

	// Nothing goes back while a slot is booked ahead: a later take would
	// be granted a slot before the booked one.
	k3 := key("f3")
	b3 := []fleetrate.Bucket{{Key: k3, Limits: []fleetrate.Limit{lim}}}
	first := mustTake(t, s, one(k3, 5, 0, lim))
	if res := mustTake(t, s, one(k3, 1, 2*time.Minute, lim)); !res.Allowed || res.Wait <= 0 {
		t.Fatalf("booking ahead: %+v", res)
	}
	if err := s.Refund(context.Background(), b3, 5, first.At); err != nil {
		t.Fatal(err)
	}
	if res := mustTake(t, s, one(k3, 1, 0, lim)); res.Allowed {
		t.Fatalf("a refund with a slot booked ahead let a take through before it: %+v", res)
	}
}

// cancelBooking checks that a cancelled booking gives its tokens back only
// when no later booking relies on them, as x/time/rate's Cancel does:
// otherwise a later reservation's slot would be granted twice.
func cancelBooking(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	lim := fleetrate.Every(10*time.Second, 2) // slow, so the store's clock barely moves the slots
	b := []fleetrate.Bucket{{Key: key("cancel"), Limits: []fleetrate.Limit{lim}}}
	reserve := func(n int64) (fleetrate.Result, fleetrate.Booking) {
		t.Helper()
		var bk fleetrate.Booking
		res := mustTake(t, s, fleetrate.Request{Buckets: b, N: n, MaxWait: time.Minute, Booking: &bk})
		if !res.Allowed || len(bk.Debts) != 1 {
			t.Fatalf("reserve %d: %+v, booking %+v", n, res, bk)
		}
		return res, bk
	}
	slot := func(r fleetrate.Result) time.Time { return r.At.Add(r.Wait) }
	iv := time.Duration(lim.Interval())

	_, first := reserve(2) // the whole burst, now
	second, secondBk := reserve(1)
	// first has a booking after it: cancelling it must give nothing back.
	if err := s.Cancel(ctx, b, 2, first); err != nil {
		t.Fatal(err)
	}
	third, thirdBk := reserve(1)
	if got, want := slot(third), slot(second).Add(iv); !got.Equal(want) {
		t.Fatalf("after cancelling a booking that a later one relies on, the next slot is %v, want %v (one interval after the later one)", got, want)
	}
	// third is the latest: cancelling it frees its slot for the next one.
	if err := s.Cancel(ctx, b, 1, thirdBk); err != nil {
		t.Fatal(err)
	}
	fourth, _ := reserve(1)
	if !slot(fourth).Equal(slot(third)) {
		t.Fatalf("after cancelling the latest booking the next slot is %v, want its slot %v", slot(fourth), slot(third))
	}
	// Cancelling second now gives nothing back (fourth relies on it).
	if err := s.Cancel(ctx, b, 1, secondBk); err != nil {
		t.Fatal(err)
	}
	fifth, _ := reserve(1)
	if got, want := slot(fifth), slot(fourth).Add(iv); !got.Equal(want) {
		t.Fatalf("after cancelling a relied-on booking the next slot is %v, want %v", got, want)
	}
}

// cancelBegun checks that a booking whose slot has begun gives nothing
// back, as x/time/rate's Cancel restores nothing after its time to act:
// its caller may have acted on it.
func cancelBegun(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	lim := fleetrate.Every(10*time.Second, 2)
	nb := []fleetrate.Bucket{{Key: key("cancel-begun"), Limits: []fleetrate.Limit{lim}}}
	var nowBk fleetrate.Booking
	if res := mustTake(t, s, fleetrate.Request{Buckets: nb, N: 1, MaxWait: time.Minute, Booking: &nowBk}); !res.Allowed || res.Wait != 0 {
		t.Fatalf("reserve now: %+v", res)
	}
	time.Sleep(2 * time.Millisecond) // past the slot on the store's clock
	if err := s.Cancel(ctx, nb, 1, nowBk); err != nil {
		t.Fatal(err)
	}
	if res := mustTake(t, s, one(nb[0].Key, 0, 0, lim)); res.Remaining != 1 {
		t.Fatalf("a cancel after the slot began gave the token back: %d left, want 1", res.Remaining)
	}
}

// cancelInvalid checks that a cancel whose booking does not match its
// buckets, or of a number of tokens no take booked, is an ErrInvalid.
func cancelInvalid(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	lim := fleetrate.Every(10*time.Second, 2)
	b := []fleetrate.Bucket{{Key: key("cancel-invalid"), Limits: []fleetrate.Limit{lim}}}
	var bk fleetrate.Booking
	if res := mustTake(t, s, fleetrate.Request{Buckets: b, N: 1, MaxWait: time.Minute, Booking: &bk}); !res.Allowed || len(bk.Debts) != 1 {
		t.Fatalf("reserve 1: %+v, booking %+v", res, bk)
	}
	// A booking that does not match the buckets is an error, not a guess.
	if err := s.Cancel(ctx, b, 1, fleetrate.Booking{Stamp: 1}); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Fatalf("cancel with an empty booking: %v, want ErrInvalid", err)
	}
	if err := s.Cancel(ctx, b, -1, bk); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Fatalf("cancel of -1 tokens: %v, want ErrInvalid", err)
	}
	// More tokens than a burst: no take booked them (and n × interval
	// overflowed into a lockout of centuries in memstore).
	if err := s.Cancel(ctx, b, fleetrate.MaxBurst, bk); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "cancel n") {
		t.Fatalf("cancel of MaxBurst tokens: %v, want ErrInvalid naming n", err)
	}
}

// cancelSeveralBuckets checks that each bucket of a cancelled booking is
// handled on its own: the one booked again since keeps the tokens, the
// other gets them back.
func cancelSeveralBuckets(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	lim := fleetrate.Every(10*time.Second, 1)
	ep := fleetrate.Bucket{Key: key("{cs}/endpoint"), Limits: []fleetrate.Limit{lim}}
	cred := fleetrate.Bucket{Key: key("{cs}"), Limits: []fleetrate.Limit{lim}}
	var bk fleetrate.Booking
	both := []fleetrate.Bucket{ep, cred}
	// Both buckets empty now, then a booking of both, 10 s ahead: a
	// booking whose slot has not begun.
	mustTake(t, s, fleetrate.Request{Buckets: both, N: 1})
	booked := mustTake(t, s, fleetrate.Request{Buckets: both, N: 1, MaxWait: time.Minute, Booking: &bk})
	if !booked.Allowed || booked.Wait <= 0 || len(bk.Debts) != 2 {
		t.Fatalf("booking of both: %+v, booking %+v", booked, bk)
	}
	// A later booking on the credential alone relies on the first one.
	later := mustTake(t, s, one(cred.Key, 1, time.Minute, lim))
	if !later.Allowed {
		t.Fatalf("later booking: %+v", later)
	}
	if err := s.Cancel(ctx, both, 1, bk); err != nil {
		t.Fatal(err)
	}
	if res := mustTake(t, s, one(ep.Key, 1, time.Minute, lim)); !res.Allowed || !res.At.Add(res.Wait).Equal(booked.At.Add(booked.Wait)) {
		t.Fatalf("the endpoint had no later booking and should have its slot back (%v): %+v", booked.At.Add(booked.Wait), res)
	}
	next := mustTake(t, s, one(cred.Key, 1, time.Minute, lim))
	if got, want := next.At.Add(next.Wait), later.At.Add(later.Wait).Add(time.Duration(lim.Interval())); !got.Equal(want) {
		t.Fatalf("the credential gave back a token a later booking relies on: next slot %v, want %v", got, want)
	}
}
