package redisstore

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/gcra"
)

// TestLuaConstantsMatchGo holds the scripts' hand copies of the Go bounds
// equal to them: MAX_ELAPSE_US is gcra.MaxElapse, in every script that
// defines it.
func TestLuaConstantsMatchGo(t *testing.T) {
	for name, src := range map[string]string{"common.lua": commonLua, "take_one.lua": takeOneLua} {
		m := regexp.MustCompile(`(?m)^local MAX_ELAPSE_US = (\d+)`).FindStringSubmatch(src)
		if m == nil {
			t.Fatalf("%s defines no MAX_ELAPSE_US", name)
		}
		got, err := strconv.ParseInt(m[1], 10, 64)
		if err != nil || got != gcra.MaxElapse {
			t.Fatalf("%s MAX_ELAPSE_US = %s, gcra.MaxElapse = %d", name, m[1], gcra.MaxElapse)
		}
		if !regexp.MustCompile(`(?m)^local TTL_SLACK_MS = 1000$`).MatchString(src) {
			t.Fatalf("%s: TTL_SLACK_MS is not 1000 ms", name)
		}
	}
	for name, want := range map[string]int64{
		"REFUND_HORIZON_US": int64(fleetrate.MaxFillTime/time.Microsecond) + 1,
		"MAX_WAIT_NS":       int64(fleetrate.MaxWaitCap),
	} {
		m := regexp.MustCompile(`(?m)^local ` + name + ` = (\d+)`).FindStringSubmatch(commonLua)
		if got, err := strconv.ParseInt(m[1], 10, 64); m == nil || err != nil || got != want {
			t.Fatalf("common.lua %s = %v, want %d", name, m, want)
		}
	}
}
