package failsafe_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/failsafe"
	"github.com/fleetrate/fleetrate/memstore"
)

// TestTakeManyPolicies: the takes of one TakeMany reach a failed store
// together and count as one failure towards the breaker; each is then
// answered by the policy as Take answers it, and a bad one keeps its own
// error under every policy. While the breaker is open they never reach
// the store.
func TestTakeManyPolicies(t *testing.T) {
	t.Parallel()
	for _, p := range []failsafe.Policy{failsafe.FailOpen, failsafe.FailClosed, failsafe.LocalFallback} {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			primary := &flaky{Store: memstore.New(memstore.Options{})}
			primary.down.Store(true)
			s, err := failsafe.New(primary, failsafe.Options{Policy: p, FailureThreshold: 2})
			if err != nil {
				t.Fatal(err)
			}
			reqs := []fleetrate.Request{req("a", 1), req("b", 21), req("c", 2)} // b exceeds its burst of 20
			for call := range 3 {
				res, errs := make([]fleetrate.Result, 3), make([]error, 3)
				before := primary.calls.Load()
				if err := fleetrate.TakeMany(context.Background(), s, reqs, res, errs); err != nil {
					t.Fatal(err)
				}
				reached := primary.calls.Load() - before
				if want := map[bool]int64{true: 3, false: 0}[call < 2]; reached != want {
					t.Errorf("call %d: %d takes reached the store, want %d (the breaker opens after 2 failed calls)", call, reached, want)
				}
				if !errors.Is(errs[1], fleetrate.ErrBurstExceeded) {
					t.Errorf("call %d: take beyond the burst: %v, want ErrBurstExceeded", call, errs[1])
				}
				for _, i := range []int{0, 2} {
					switch p {
					case failsafe.FailClosed:
						if !errors.Is(errs[i], fleetrate.ErrStoreUnavailable) || res[i].Allowed {
							t.Errorf("call %d, take %d: %+v, %v; want ErrStoreUnavailable, never a denial", call, i, res[i], errs[i])
						}
					default:
						if errs[i] != nil || !res[i].Allowed || !res[i].Degraded {
							t.Errorf("call %d, take %d: %+v, %v; want allowed and degraded", call, i, res[i], errs[i])
						}
					}
				}
			}
			if !s.Open() {
				t.Error("breaker closed after 3 failed TakeMany calls")
			}
		})
	}
}
