package failsafe

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

// TestOptionsWithDefaults checks that each zero field gets its documented
// default, that a given value is kept, and that a negative or unknown one
// is refused with fleetrate.ErrInvalid.
func TestOptionsWithDefaults(t *testing.T) {
	t.Parallel()
	got, err := Options{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "store" || got.FleetSize != 1 || got.FailureThreshold != DefaultFailureThreshold ||
		got.CoolOff != DefaultCoolOff || got.RecoveryWindow != DefaultRecoveryWindow || got.Logger == nil || got.Clock == nil {
		t.Errorf("defaults: got %+v", got)
	}
	set := Options{Name: "redis", FleetSize: 4, FailureThreshold: 2, CoolOff: time.Second, RecoveryWindow: time.Hour}
	if got, err := set.withDefaults(); err != nil || got.Name != "redis" || got.FleetSize != 4 || got.FailureThreshold != 2 ||
		got.CoolOff != time.Second || got.RecoveryWindow != time.Hour {
		t.Errorf("given values: got %+v, %v", got, err)
	}
	for _, bad := range []struct {
		o     Options
		field string
	}{
		{Options{Policy: LocalFallback + 1}, "policy"}, {Options{Policy: -1}, "policy"}, {Options{FleetSize: -1}, "fleet size"},
		{Options{FailureThreshold: -1}, "failure threshold"}, {Options{CoolOff: -1}, "cool-off"}, {Options{RecoveryWindow: -1}, "recovery window"},
	} {
		if _, err := bad.o.withDefaults(); !errors.Is(err, fleetrate.ErrInvalid) || !strings.HasPrefix(strings.TrimPrefix(err.Error(), fleetrate.ErrInvalid.Error()+": failsafe: "), bad.field) {
			t.Errorf("%+v: err %v, want ErrInvalid naming the %s first", bad.o, err, bad.field)
		}
	}
}
