package sendtime

import (
	"testing"
	"time"
)

// TestRTTFloor: the quickest answer is 0 (unknown) for the first
// RTTSamples answers, then the least of the current window and the one before;
// a window's answers stop counting two windows later, and two idle
// windows start over.
func TestRTTFloor(t *testing.T) {
	var f RTTFloor
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	for i := range RTTSamples {
		if got := f.Add(t0.Add(time.Duration(i)*ms), 5*ms); got != 0 {
			t.Fatalf("answer %d: quickest %v, want 0 for the first %d answers", i+1, got, RTTSamples)
		}
	}
	if got := f.Add(t0.Add(20*ms), 3*ms); got != 3*ms {
		t.Fatalf("answer %d: quickest %v, want 3ms", RTTSamples+1, got)
	}
	// The next window: the 3 ms answer still counts.
	if got := f.Add(t0.Add(RTTWindow+ms), 7*ms); got != 3*ms {
		t.Fatalf("next window: quickest %v, want the last window's 3ms", got)
	}
	// The one after: only the window before (7 ms) and this one count.
	if got := f.Add(t0.Add(2*RTTWindow+2*ms), 6*ms); got != 6*ms {
		t.Fatalf("two windows on: quickest %v, want 6ms", got)
	}
	// Two whole windows without an answer start over.
	if got := f.Add(t0.Add(5*RTTWindow), 2*ms); got != 0 {
		t.Fatalf("after two idle windows: quickest %v, want 0 (start over)", got)
	}
}
