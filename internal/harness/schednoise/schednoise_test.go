package schednoise

import (
	"testing"
	"time"
)

func TestWatch(t *testing.T) {
	w := Start()
	time.Sleep(20 * time.Millisecond)
	worst := w.Stop()
	if worst < 0 {
		t.Fatalf("worst lateness %v is negative", worst)
	}
	if got := w.Worst(); got != worst {
		t.Errorf("Worst() = %v after Stop returned %v", got, worst)
	}
	if got, want := Allowance(10*time.Millisecond, 5*time.Millisecond), 25*time.Millisecond; got != want {
		t.Errorf("Allowance = %v, want %v", got, want)
	}
}
