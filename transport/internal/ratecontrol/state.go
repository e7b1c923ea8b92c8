package ratecontrol

import "time"

// MaxSoon is how many 429s in a row a bucket takes as a pause too short
// (see LimitRange) before it lowers the rate all the same: an upstream
// that limits every request lowers it to the floor, and is reported. "In
// a row" is for one process: an answer other than a rate limit ends the
// row (State.Admitted), and so does a decrease by any process (State.Read).
const MaxSoon = 2

// State is what one process's controller knows of one bucket.
type State struct {
	// Climb is the bucket's climb, as this process last read or wrote it.
	Climb Climb
	// Decreased is when this process last lowered the rate; Floored when
	// it lowered it to the floor, if it did and has not climbed off since.
	Decreased, Floored time.Time
	// Soon counts the 429s in a row taken as a pause too short.
	Soon int
	// Proven is the least the upstream's limit was shown to be, as a
	// fraction of the documented rate, by the fleet's requests between its
	// last two pauses (or from this process's first request to its first
	// pause): the low bound of LimitRange, 0 when that stretch was short.
	// A 429 soon after a resume says little of the limit from below, and
	// jitter on a strict window (a request late on the wire, the next on
	// time) would otherwise cut the rate to what the few requests since
	// the resume allow; the proof is used for that one 429 (see Limited).
	Proven float64
	// Ceiling is the upstream's limit as its answers last stated it, a
	// fraction of the documented rate (see Settings.Ceiling): the
	// effective rate never exceeds it until CeilingUntil. 0: none stated.
	Ceiling      float64
	CeilingUntil time.Time
}

// Evidence is what a 429 tells the controller of one bucket.
type Evidence struct {
	// Now is when the 429 was answered, Sent when its request was sent,
	// and Resume when the pause it draws ends.
	Now, Sent, Resume time.Time
	// Resumed is when the fleet's previous pause ended (zero when the
	// process knows of none), and From when the stretch of requests the
	// 429 ends began: Resumed, or without one the process's first request
	// (zero if it sent none).
	Resumed, From time.Time
	// Documented is the bucket's documented pace, requests per second.
	Documented float64
	// Soon reports that the 429 came at once after the last pause (see
	// LimitRange).
	Soon bool
}

// Change is a decrease of a bucket's rate: the new climb, and the
// effective rates before and after it, as fractions.
type Change struct {
	Climb    Climb
	From, To float64
}

// Limited returns the state after a 429 with evidence ev: lowered reports
// that the rate is to be lowered as ch says (the caller records ch.Climb
// for the fleet), and floor that the rate was at its floor already, where
// lowering it further does not help.
func (s Settings) Limited(st State, ev Evidence) (next State, ch Change, floor, lowered bool) {
	from := s.Effective(st, ev.Now)
	// With no pause yet, the fleet has sent at its rate at least since
	// this process's first request, so a first 429 after hundreds of
	// admitted ones bounds the limit from below as closely as one after a
	// pause. Not from above: the upstream's bucket need not have been
	// full at the start (another client, the fleet's last run).
	low, high, _ := LimitRange(from, from*ev.Documented, ev.Sent, ev.From)
	if ev.Resumed.IsZero() {
		high = from
	}
	// What the stretch before the last pause proved holds unless this
	// 429 shows the limit fell: the next one, after a short stretch
	// again, does (this stretch's proof replaces it below).
	proven := max(low, st.Proven)
	// Under a stated ceiling the 429 was drawn at the ceiling, not at the
	// climb's rate: it is lowered from there.
	c := s.Lowered(s.capped(st, ev.Now), ev.Now, ev.Resume, proven, max(high, proven))
	to := s.Effective(State{Climb: c, Ceiling: st.Ceiling, CeilingUntil: st.CeilingUntil}, ev.Resume)
	if to == s.Floor && !st.Floored.IsZero() && ev.Sent.After(st.Floored) {
		// Sent after a 429 had brought the rate to its floor, and
		// limited all the same.
		floor = true
	}
	if ev.Sent.Before(st.Decreased) || ev.Sent.Before(st.Climb.Start) {
		// Sent before the fleet's last 429 lowered the rate (or during
		// its pause): the lowered rate has answered it already.
		return st, ch, floor, false
	}
	if ev.Soon && st.Soon < MaxSoon {
		// Limited at once after a pause: the pause was too short (the
		// next one is longer), the rate is not to blame.
		st.Soon++
		return st, ch, floor, false
	}
	st.Soon = 0
	switch {
	case to > s.Floor:
		st.Floored = time.Time{} // climbed off the floor since
	case st.Floored.IsZero():
		st.Floored = ev.Now
	}
	st.Climb, st.Decreased, st.Proven = c, ev.Now, low
	return st, Change{Climb: c, From: from, To: to}, floor, true
}

// EndStretch returns the state once the fleet's stretch of requests from
// since to end (the start of a pause) is over, the fleet pacing until then
// at its effective rate, the climb's factor of documented (the bucket's
// pace, requests per second): Proven becomes what the stretch proves of
// the upstream's limit. A stretch that ended at once after a pause (the
// pause was too short) or during it proves nothing new and keeps the last
// proof.
func (s Settings) EndStretch(st State, documented float64, since, end time.Time) State {
	if since.IsZero() || !since.Before(end) {
		return st
	}
	f := s.Effective(st, end)
	if low, _, soon := LimitRange(f, f*documented, end, since); !soon {
		st.Proven = low
	}
	return st
}

// Read returns the state once the climb c was read from the store at now,
// refresh after the last read: another process's later climb replaces this
// process's and ends its row of 429s blamed on pauses; an older one
// replaces it only if this process has not lowered the rate itself within
// refresh (its own write is newer than what it read).
func (st State) Read(c Climb, now time.Time, refresh time.Duration) State {
	newer := c.Start.After(st.Climb.Start)
	if newer {
		st.Soon = 0
	}
	if newer || now.Sub(st.Decreased) > refresh {
		st.Climb = c
	}
	return st
}

// Admitted returns the state after an answer that was not a rate limit:
// the row of 429s taken as pauses too short ends.
func (st State) Admitted() State {
	st.Soon = 0
	return st
}
