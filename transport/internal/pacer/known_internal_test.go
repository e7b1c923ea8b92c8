package pacer

import (
	"testing"

	"github.com/fleetrate/fleetrate/transport/internal/ratecontrol"
)

// TestAdmittedEndsTheRow: an answer other than a rate limit ends a row of
// 429s taken as pauses too short, so the next row may again blame the
// pause (a 429 by another process lowered the rate in between; this
// process's count would otherwise carry over and lower it once more).
func TestAdmittedEndsTheRow(t *testing.T) {
	tr := &Pacer{}
	key := "ota/avail"
	tg := Target{Channel: "ota", Endpoint: "avail", EndpointKey: key, Drained: []string{key}}
	tr.known.setRate(tr.known.get(key), ratecontrol.State{Soon: ratecontrol.MaxSoon})
	tr.Admitted(tg)
	if n := tr.known.get(key).rate.st.Soon; n != 0 {
		t.Fatalf("after an admitted request the row is %d long, want 0", n)
	}
	if n := tr.known.inRow.Load(); n != 0 {
		t.Fatalf("after the row ended %d buckets count as in a row, want 0", n)
	}
}
