package ratecontrol

import (
	"testing"
	"time"
)

// evidence is a 429 answered at now on a request sent then, the pause to
// end two seconds on, the stretch counted from from.
func evidence(now, resumed, from time.Time, soon bool) Evidence {
	return Evidence{Now: now, Sent: now, Resume: now.Add(2 * time.Second), Resumed: resumed, From: from, Documented: 19, Soon: soon}
}

// TestFirst429CountsFromTheFirstRequest: a 429 after hundreds of admitted
// requests and no pause before it (send jitter on a strict window, the
// most common first 429 there) bounds the limit as one after a pause does:
// the rate drops half as far, not by Decrease, since the process counts
// the requests since its first; a process that sent nothing before it
// knows nothing of the limit and drops by Decrease.
func TestFirst429CountsFromTheFirstRequest(t *testing.T) {
	start := time.Unix(1000, 0)
	now := start.Add(49 * time.Second) // about 930 admitted
	_, ch, _, ok := defaults.Limited(State{}, evidence(now, time.Time{}, start, false))
	half := 1 - (1-defaults.Decrease)/2
	if !ok || ch.To < half-0.01 {
		t.Fatalf("first 429 after ~930 admitted: rate %v (ok %v), want about %v (half the drop)", ch.To, ok, half)
	}
	_, ch, _, ok = defaults.Limited(State{}, evidence(now, time.Time{}, time.Time{}, false))
	if !ok || ch.To > defaults.Decrease+0.01 {
		t.Fatalf("first 429 of a process that sent nothing before: rate %v (ok %v), want %v", ch.To, ok, defaults.Decrease)
	}
}

// TestProvenLimitOutlastsAShortStretch: a strict window drew a 429 150 ms
// after a resume (a request 13.6 ms late on the wire, the next on time),
// after a minute that had proven the limit at the rate: the few requests
// since the resume would bound the limit at two thirds of the rate. What
// the stretch before the pause proved holds for that one 429; a second
// one after another short stretch shows the limit fell.
func TestProvenLimitOutlastsAShortStretch(t *testing.T) {
	start := time.Unix(1000, 0)
	end := start.Add(30 * time.Second) // about 570 admitted
	st := defaults.EndStretch(State{}, 19, start, end)
	if st.Proven < 0.99 {
		t.Fatalf("proven after ~570 admitted = %v, want ≥ 0.99", st.Proven)
	}
	resumed := end.Add(2 * time.Second)
	// The pause ended; the first three requests go out, the third is
	// limited: a short stretch.
	sent := resumed.Add(150 * time.Millisecond)
	st, ch, _, ok := defaults.Limited(st, evidence(sent, resumed, resumed, false))
	if !ok || ch.Climb.W < 0.99 {
		t.Fatalf("429 150ms after the resume: w = %v (ok %v), want the proven %v", ch.Climb.W, ok, 0.99)
	}
	half := 1 - (1-defaults.Decrease)/2
	if ch.To < half-0.01 {
		t.Fatalf("429 150ms after the resume: rate %v, want the half drop %v", ch.To, half)
	}
	if st.Proven != 0 {
		t.Fatalf("proven after a short stretch = %v, want 0 (used once)", st.Proven)
	}
	// Another short stretch: the limit fell, and the bound from above
	// says so.
	resumed2 := sent.Add(2 * time.Second)
	sent2 := resumed2.Add(150 * time.Millisecond)
	from := defaults.Factor(st.Climb, sent2)
	_, ch, _, ok = defaults.Limited(st, evidence(sent2, resumed2, resumed2, false))
	if !ok || ch.Climb.W > 0.75*from {
		t.Fatalf("second 429 after a short stretch: w = %v (ok %v), want at most %v", ch.Climb.W, ok, 0.75*from)
	}
}

// TestEndStretch: a stretch proves the limit only when it was long enough
// to bound it; one that ended during a pause, or at once after it,
// keeps the last proof.
func TestEndStretch(t *testing.T) {
	start := time.Unix(1000, 0)
	st := State{Proven: 0.5}
	if got := defaults.EndStretch(st, 19, start, start.Add(-time.Second)); got.Proven != 0.5 {
		t.Fatalf("a stretch that ended during the pause: proven = %v, want 0.5 kept", got.Proven)
	}
	if got := defaults.EndStretch(st, 19, start, start.Add(50*time.Millisecond)); got.Proven != 0.5 {
		t.Fatalf("a stretch of one slot: proven = %v, want 0.5 kept", got.Proven)
	}
	got := defaults.EndStretch(st, 19, start, start.Add(time.Second)) // 19 sent: low = 1 − 4/18
	if want := 1 - 4.0/18; got.Proven < want-0.01 || got.Proven > want+0.01 {
		t.Fatalf("a stretch of 19 slots: proven = %v, want %v", got.Proven, want)
	}
	if got := defaults.EndStretch(State{}, 19, time.Time{}, start); got.Proven != 0 {
		t.Fatalf("no start known: proven = %v, want 0", got.Proven)
	}
}

// TestLimitedTimeline drives one bucket's state through a fixed timeline
// of 429s: a first one lowers the rate; one sent before that decrease is
// already answered; ones at once after a pause count as pauses too short
// up to MaxSoon in a row, and the next lowers the rate all the same; an
// admitted answer ends the row; at the floor, a 429 sent after the floor
// was reached reports floor.
func TestLimitedTimeline(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var st State
	st, _, _, ok := defaults.Limited(st, Evidence{Now: t0, Sent: t0, Resume: t0.Add(time.Second), Documented: 10})
	if !ok || st.Decreased != t0 {
		t.Fatalf("first 429: lowered %v, decreased %v", ok, st.Decreased)
	}
	if _, _, _, ok := defaults.Limited(st, Evidence{Now: t0.Add(time.Millisecond), Sent: t0.Add(-time.Millisecond), Resume: t0.Add(time.Second), Documented: 10}); ok {
		t.Fatalf("a 429 on a request sent before the decrease lowered the rate again")
	}
	resumed := t0.Add(time.Second)
	for i := 1; i <= MaxSoon; i++ {
		at := resumed.Add(time.Duration(i) * 10 * time.Millisecond)
		var lowered bool
		st, _, _, lowered = defaults.Limited(st, Evidence{Now: at, Sent: at, Resume: at.Add(time.Second), Resumed: resumed, From: resumed, Documented: 10, Soon: true})
		if lowered || st.Soon != i {
			t.Fatalf("soon 429 %d: lowered %v, row %d", i, lowered, st.Soon)
		}
	}
	at := resumed.Add(50 * time.Millisecond)
	st, _, _, ok = defaults.Limited(st, Evidence{Now: at, Sent: at, Resume: at.Add(time.Second), Resumed: resumed, From: resumed, Documented: 10, Soon: true})
	if !ok || st.Soon != 0 {
		t.Fatalf("soon 429 past MaxSoon: lowered %v, row %d; want lowered, row 0", ok, st.Soon)
	}
	st.Soon = 1
	if st = st.Admitted(); st.Soon != 0 {
		t.Fatalf("after an admitted answer the row is %d", st.Soon)
	}
	// Down to the floor, then one more.
	now := at
	floor := false
	for range 40 {
		now = now.Add(time.Second)
		st, _, floor, _ = defaults.Limited(st, Evidence{Now: now, Sent: now, Resume: now.Add(time.Millisecond), Documented: 10})
	}
	if st.Floored.IsZero() || !floor {
		t.Fatalf("after 40 429s: floored %v, floor %v; want both", st.Floored, floor)
	}
}

// TestRead: another process's later climb replaces this one's and ends
// its row; an older one replaces it only after refresh since this
// process's own decrease.
func TestRead(t *testing.T) {
	t0 := time.Unix(1000, 0)
	refresh := 30 * time.Second
	st := State{Climb: Climb{W: 0.8, Start: t0}, Decreased: t0, Soon: 1}
	older := Climb{W: 0.9, Start: t0.Add(-time.Minute)}
	if got := st.Read(older, t0.Add(time.Second), refresh); got.Climb != st.Climb || got.Soon != 1 {
		t.Fatalf("an older climb read just after this process's decrease replaced it: %+v", got)
	}
	if got := st.Read(older, t0.Add(time.Minute), refresh); got.Climb != older {
		t.Fatalf("an older climb read a refresh after this process's decrease did not replace it: %+v", got)
	}
	newer := Climb{W: 0.7, Start: t0.Add(time.Second)}
	if got := st.Read(newer, t0.Add(2*time.Second), refresh); got.Climb != newer || got.Soon != 0 {
		t.Fatalf("a later climb: %+v; want it, and the row ended", got)
	}
}
