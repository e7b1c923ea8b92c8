package server

import (
	"strconv"
	"strings"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/fleetrate/fleetrate"
)

// TestRLSTakePaths checks that a take through a rule's Limiter (a key
// that can name a bucket) and one through the store's Take (a key longer
// than fleetrate.MaxNameLen) decide alike, and that both are timed as
// store takes.
func TestRLSTakePaths(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig)
	long := strings.Repeat("v", fleetrate.MaxNameLen) // the bucket key adds the domain and the entry's key
	var got [2][]string
	for i, value := range []string{"short", long} {
		for range 4 {
			r := ts.should(t, "edge", 1, desc("remote_address", value))
			st := r.Statuses[0]
			got[i] = append(got[i], r.OverallCode.String()+" "+st.Code.String()+" remaining "+strconv.Itoa(int(st.LimitRemaining))+
				" limit "+strconv.Itoa(int(st.CurrentLimit.GetRequestsPerUnit()))+"/"+st.CurrentLimit.GetUnit().String())
		}
	}
	if strings.Join(got[0], "; ") != strings.Join(got[1], "; ") {
		t.Errorf("a short key: %q\na long key:  %q", got[0], got[1])
	}
	if got[0][3][:len("OVER_LIMIT")] != rlspb.RateLimitResponse_OVER_LIMIT.String() {
		t.Errorf("the 4th hit of a limit of 3/s: %q, want OVER_LIMIT", got[0][3])
	}
	if !metricHas(t, ts, `fleetrate_store_duration_seconds_count{op="take"} 8`) {
		t.Error("the 8 takes are not all timed as store takes")
	}
}
