package transport

import (
	"testing"
	"time"
)

// TestRTTFloor: the quickest answer is 0 (unknown) for the first
// rttSamples answers, then the least of the current window and the one before;
// a window's answers stop counting two windows later, and two idle
// windows start over.
func TestRTTFloor(t *testing.T) {
	var f rttFloor
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	for i := range rttSamples {
		if got := f.add(t0.Add(time.Duration(i)*ms), 5*ms); got != 0 {
			t.Fatalf("answer %d: quickest %v, want 0 for the first %d answers", i+1, got, rttSamples)
		}
	}
	if got := f.add(t0.Add(20*ms), 3*ms); got != 3*ms {
		t.Fatalf("answer %d: quickest %v, want 3ms", rttSamples+1, got)
	}
	// The next window: the 3 ms answer still counts.
	if got := f.add(t0.Add(rttWindow+ms), 7*ms); got != 3*ms {
		t.Fatalf("next window: quickest %v, want the last window's 3ms", got)
	}
	// The one after: only the window before (7 ms) and this one count.
	if got := f.add(t0.Add(2*rttWindow+2*ms), 6*ms); got != 6*ms {
		t.Fatalf("two windows on: quickest %v, want 6ms", got)
	}
	// Two whole windows without an answer start over.
	if got := f.add(t0.Add(5*rttWindow), 2*ms); got != 0 {
		t.Fatalf("after two idle windows: quickest %v, want 0 (start over)", got)
	}
}
