package calendar

import (
	"strings"
	"testing"
	"time"
)

func mustLoad(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Skipf("no time zone database entry for %s: %v", name, err)
	}
	return loc
}

// TestWindows pins the boundaries the issue names: midnight in UTC and in
// a zone with daylight saving on its change days, the 31st into shorter
// months, leap years, the hour repeated when clocks go back, and a moment
// exactly at a boundary.
func TestWindows(t *testing.T) {
	ny := mustLoad(t, "America/New_York")
	utc := time.UTC
	at := func(loc *time.Location, y int, m time.Month, d, h, min int) time.Time {
		return time.Date(y, m, d, h, min, 0, 0, loc)
	}
	for _, c := range []struct {
		name       string
		p          Period
		t          time.Time
		start, end time.Time
		length     time.Duration
	}{
		{"day UTC", Period{Unit: Day}, at(utc, 2026, 12, 4, 17, 3), at(utc, 2026, 12, 4, 0, 0), at(utc, 2026, 12, 5, 0, 0), 24 * time.Hour},
		{"exactly at midnight", Period{Unit: Day}, at(utc, 2026, 12, 5, 0, 0), at(utc, 2026, 12, 5, 0, 0), at(utc, 2026, 12, 6, 0, 0), 24 * time.Hour},
		{"a nanosecond before midnight", Period{Unit: Day}, at(utc, 2026, 12, 5, 0, 0).Add(-1), at(utc, 2026, 12, 4, 0, 0), at(utc, 2026, 12, 5, 0, 0), 24 * time.Hour},
		{"spring forward day", Period{Unit: Day, Location: ny}, at(ny, 2026, 3, 8, 12, 0), at(ny, 2026, 3, 8, 0, 0), at(ny, 2026, 3, 9, 0, 0), 23 * time.Hour},
		{"fall back day", Period{Unit: Day, Location: ny}, at(ny, 2026, 11, 1, 12, 0), at(ny, 2026, 11, 1, 0, 0), at(ny, 2026, 11, 2, 0, 0), 25 * time.Hour},
		{"month anchored 31, into February", Period{Unit: Month, Day: 31}, at(utc, 2026, 2, 28, 12, 0), at(utc, 2026, 2, 28, 0, 0), at(utc, 2026, 3, 31, 0, 0), 31 * 24 * time.Hour},
		{"month anchored 31, late January", Period{Unit: Month, Day: 31}, at(utc, 2026, 2, 27, 12, 0), at(utc, 2026, 1, 31, 0, 0), at(utc, 2026, 2, 28, 0, 0), 28 * 24 * time.Hour},
		{"month anchored 31, leap February", Period{Unit: Month, Day: 31}, at(utc, 2028, 2, 29, 0, 0), at(utc, 2028, 2, 29, 0, 0), at(utc, 2028, 3, 31, 0, 0), 31 * 24 * time.Hour},
		{"month anchored 30, into April", Period{Unit: Month, Day: 30}, at(utc, 2026, 4, 30, 1, 0), at(utc, 2026, 4, 30, 0, 0), at(utc, 2026, 5, 30, 0, 0), 30 * 24 * time.Hour},
		{"month on the 1st in New York", Period{Unit: Month, Location: ny}, at(ny, 2026, 11, 15, 0, 0), at(ny, 2026, 11, 1, 0, 0), at(ny, 2026, 12, 1, 0, 0), 30*24*time.Hour + time.Hour},
		{"month across the new year", Period{Unit: Month, Day: 15}, at(utc, 2027, 1, 3, 0, 0), at(utc, 2026, 12, 15, 0, 0), at(utc, 2027, 1, 15, 0, 0), 31 * 24 * time.Hour},
		{"week from Monday", Period{Unit: Week, Weekday: time.Monday}, at(utc, 2026, 12, 6, 23, 0), at(utc, 2026, 11, 30, 0, 0), at(utc, 2026, 12, 7, 0, 0), 7 * 24 * time.Hour},
		{"leap year", Period{Unit: Year}, at(utc, 2028, 7, 1, 0, 0), at(utc, 2028, 1, 1, 0, 0), at(utc, 2029, 1, 1, 0, 0), 366 * 24 * time.Hour},
		{"hour", Period{Unit: Hour, Location: ny}, at(ny, 2026, 12, 4, 9, 59), at(ny, 2026, 12, 4, 9, 0), at(ny, 2026, 12, 4, 10, 0), time.Hour},
		{"minute", Period{Unit: Minute}, at(utc, 2026, 12, 4, 9, 59).Add(59*time.Second + 999*time.Millisecond), at(utc, 2026, 12, 4, 9, 59), at(utc, 2026, 12, 4, 10, 0), time.Minute},
		{"minute exactly at its start", Period{Unit: Minute, Location: ny}, at(ny, 2026, 11, 1, 1, 30), at(ny, 2026, 11, 1, 1, 30), at(ny, 2026, 11, 1, 1, 31), time.Minute},
	} {
		start, end := c.p.Window(c.t)
		if !start.Equal(c.start) || !end.Equal(c.end) || end.Sub(start) != c.length {
			t.Errorf("%s: Window(%v) = [%v, %v) (%v), want [%v, %v) (%v)", c.name, c.t, start, end, end.Sub(start), c.start, c.end, c.length)
		}
	}
	// The hour repeated when New York's clocks go back is two windows.
	first := time.Date(2026, 11, 1, 5, 30, 0, 0, time.UTC)  // 01:30 EDT
	second := time.Date(2026, 11, 1, 6, 30, 0, 0, time.UTC) // 01:30 EST
	s1, e1 := Period{Unit: Hour, Location: ny}.Window(first)
	s2, e2 := Period{Unit: Hour, Location: ny}.Window(second)
	if !e1.Equal(s2) || e1.Sub(s1) != time.Hour || e2.Sub(s2) != time.Hour {
		t.Errorf("the repeated hour: [%v, %v) then [%v, %v), want two adjacent hours", s1, e1, s2, e2)
	}
}

// TestParse reads periods and names what is wrong with bad ones.
func TestParse(t *testing.T) {
	p, err := Parse("month day=15 America/New_York")
	if err != nil || p.Unit != Month || p.Day != 15 || p.Location.String() != "America/New_York" {
		t.Fatalf("Parse: %+v, %v", p, err)
	}
	if q, err := Parse(p.String()); err != nil || q.String() != p.String() {
		t.Fatalf("round trip of %q: %+v, %v", p.String(), q, err)
	}
	for in, want := range map[string]string{
		"":                   "empty period",
		"fortnight":          "unit",
		"month day=0":        "day",
		"month day=32":       "day",
		"day Mars/Olympus":   "time zone",
		"day monday":         "weekday",
		"week day=3":         "only a month",
		"day UTC Asia/Tokyo": "second time zone",
	} {
		if _, err := Parse(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error naming %q", in, err, want)
		}
	}
}

// FuzzParse: any input parses or is refused, never panics; a parsed
// period prints as text that parses to the same windows, and its windows
// hold the moment they are asked about.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"day", "month day=31 Europe/Paris", "week monday UTC", "hour Asia/Kolkata", "year", "minute UTC+00:17:23", "minute"} {
		f.Add(s, int64(1_800_000_000))
	}
	f.Fuzz(func(t *testing.T, s string, sec int64) {
		p, err := Parse(s)
		if err != nil {
			return
		}
		at := time.Unix(sec%(1<<34), 0)
		start, end := p.Window(at)
		if at.Before(start) || !at.Before(end) {
			t.Fatalf("%q: Window(%v) = [%v, %v) does not hold it", s, at, start, end)
		}
		q, err := Parse(p.String())
		if err != nil {
			t.Fatalf("%q prints as %q, which does not parse: %v", s, p.String(), err)
		}
		if s2, e2 := q.Window(at); !s2.Equal(start) || !e2.Equal(end) {
			t.Fatalf("%q and its printed form %q give other windows", s, p.String())
		}
	})
}

// TestFixedZoneRoundTrips: a period in a fixed-offset zone reads back from
// its string, with the same windows; bad offsets are refused, naming them.
func TestFixedZoneRoundTrips(t *testing.T) {
	for _, off := range []time.Duration{0, 5*time.Hour + 30*time.Minute, -8 * time.Hour, 17*time.Minute + 23*time.Second, -(23*time.Hour + 59*time.Minute + 59*time.Second)} {
		loc, err := FixedZone(off)
		if err != nil {
			t.Fatal(err)
		}
		p := Period{Unit: Hour, Location: loc}
		q, err := Parse(p.String())
		if err != nil {
			t.Fatalf("%v: Parse(%q): %v", off, p.String(), err)
		}
		at := time.Date(2026, 12, 4, 20, 0, 0, 0, time.UTC)
		if s1, _ := p.Window(at); !s1.Equal(func() time.Time { s2, _ := q.Window(at); return s2 }()) || q.String() != p.String() {
			t.Errorf("%v: %q read back as %q with another window", off, p.String(), q.String())
		}
	}
	for _, bad := range []string{"hour UTC+24:00", "hour UTC+05:60", "hour UTC+5:30", "hour UTC+05:30:00:00", "hour UTC+aa:bb"} {
		if _, err := Parse(bad); err == nil || !strings.Contains(err.Error(), "zone") {
			t.Errorf("Parse(%q) = %v, want an error naming the zone", bad, err)
		}
	}
	if _, err := FixedZone(25 * time.Hour); err == nil {
		t.Error("FixedZone(25h): no error")
	}
}
