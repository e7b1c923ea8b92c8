package redisstore

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/fleetrate/fleetrate/gcra"
)

// TestLuaConstantsMatchGo holds the scripts' hand copies of the Go bounds
// equal to them: MAX_ELAPSE_US is gcra.MaxElapse.
func TestLuaConstantsMatchGo(t *testing.T) {
	m := regexp.MustCompile(`(?m)^local MAX_ELAPSE_US = (\d+)`).FindStringSubmatch(commonLua)
	if m == nil {
		t.Fatal("common.lua defines no MAX_ELAPSE_US")
	}
	got, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || got != gcra.MaxElapse {
		t.Fatalf("common.lua MAX_ELAPSE_US = %s, gcra.MaxElapse = %d", m[1], gcra.MaxElapse)
	}
}
