// Package calendar is the calendar period of a quota that resets on the
// calendar ("10,000 a month, resetting on the 1st"; "1,000 a day,
// resetting at midnight in the customer's time zone"): which window of
// time a moment falls in, in a time zone, across daylight-saving changes
// and month ends. Everything here is pure: the moment comes in as an
// argument (a store passes its own clock), the window goes out.
package calendar

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Unit is the length of a calendar period.
type Unit int

// The units of a period.
const (
	Hour Unit = iota + 1
	Day
	Week
	Month
	Year
	// Minute is last so that the values above keep their numbers.
	Minute
)

var unitNames = map[Unit]string{Minute: "minute", Hour: "hour", Day: "day", Week: "week", Month: "month", Year: "year"}

// String returns the unit's name, as Parse reads it.
func (u Unit) String() string {
	if n, ok := unitNames[u]; ok {
		return n
	}
	return fmt.Sprintf("Unit(%d)", int(u))
}

// Period is a calendar period in a time zone: the windows a quota resets
// at the start of.
type Period struct {
	// Unit is the period's length. Required.
	Unit Unit
	// Location is the time zone whose calendar the windows follow; nil
	// is UTC.
	Location *time.Location
	// Weekday is, for Week, the day a week starts on (the zero value is
	// Sunday).
	Weekday time.Weekday
	// Day is, for Month, the day of the month a window starts on, 1 to
	// 31 (0 means 1): a month shorter than Day starts its window on its
	// last day, and the next window starts on Day again. Only a month has
	// one.
	Day int
}

// Validate checks the period, naming the failing field.
func (p Period) Validate() error {
	if _, ok := unitNames[p.Unit]; !ok {
		return fmt.Errorf("calendar: unit: want minute, hour, day, week, month or year, got %v", p.Unit)
	}
	if p.Weekday < time.Sunday || p.Weekday > time.Saturday {
		return fmt.Errorf("calendar: weekday: want 0 (Sunday) to 6 (Saturday), got %d", p.Weekday)
	}
	if p.Day < 0 || p.Day > 31 {
		return fmt.Errorf("calendar: day: want 1 to 31, got %d", p.Day)
	}
	if p.Day > 1 && p.Unit != Month {
		return fmt.Errorf("calendar: day: only a month has an anchor day, got day %d for a %v", p.Day, p.Unit)
	}
	return nil
}

// Window returns the window of the period that t falls in: start <= t <
// end. Windows follow the wall clock of the period's location: a day is
// 23 or 25 hours on the days daylight saving starts or ends; an hour (and
// a minute) is always 60 minutes (seconds), and the hour repeated when
// clocks go back is two windows.
func (p Period) Window(t time.Time) (start, end time.Time) {
	loc := p.Location
	if loc == nil {
		loc = time.UTC
	}
	t = t.In(loc)
	switch p.Unit {
	case Minute, Hour:
		d := time.Hour
		if p.Unit == Minute {
			d = time.Minute
		}
		_, off := t.Zone()
		shift := time.Duration(off) * time.Second
		start = t.Add(shift).Truncate(d).Add(-shift)
		return start, start.Add(d)
	case Day:
		y, m, d := t.Date()
		start = midnight(y, m, d, loc)
		return start, midnight(y, m, d+1, loc)
	case Week:
		y, m, d := t.Date()
		back := (int(t.Weekday()) - int(p.Weekday) + 7) % 7
		start = midnight(y, m, d-back, loc)
		return start, midnight(y, m, d-back+7, loc)
	case Month:
		return p.month(t, loc)
	default: // Year
		y := t.Year()
		return midnight(y, time.January, 1, loc), midnight(y+1, time.January, 1, loc)
	}
}

// month is Window for a month anchored on p.Day.
func (p Period) month(t time.Time, loc *time.Location) (start, end time.Time) {
	y, m, _ := t.Date()
	start = p.anchor(y, m, loc)
	if t.Before(start) {
		start, end = p.anchor(y, m-1, loc), start
		return start, end
	}
	return start, p.anchor(y, m+1, loc)
}

// anchor returns the start of the month window that begins in month m of
// year y (normalised): midnight of p.Day, or of the month's last day when
// it is shorter.
func (p Period) anchor(y int, m time.Month, loc *time.Location) time.Time {
	first := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC) // normalises m
	y, m = first.Year(), first.Month()
	day := max(p.Day, 1)
	last := time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
	return midnight(y, m, min(day, last), loc)
}

// midnight returns the first instant of day d of month m of year y in loc
// (normalised): midnight, or where daylight saving skips midnight (clocks
// going forward at 00:00), the instant the clocks jump to, as time.Date
// normalises it.
func midnight(y int, m time.Month, d int, loc *time.Location) time.Time {
	return time.Date(y, m, d, 0, 0, 0, 0, loc)
}

// Parse reads a period: a unit, then options separated by spaces: a time
// zone name ("Europe/Paris"; UTC by default) or a fixed offset
// ("UTC+05:30", as FixedZone names it), for a week the weekday it
// starts on ("monday"), for a month its anchor day ("day=15"). For
// example "month day=1 America/New_York", "week monday", "day Asia/Tokyo".
func Parse(s string) (Period, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return Period{}, errors.New("calendar: empty period: want a unit (minute, hour, day, week, month, year)")
	}
	var p Period
	for u, n := range unitNames {
		if strings.EqualFold(f[0], n) {
			p.Unit = u
		}
	}
	if p.Unit == 0 {
		return Period{}, fmt.Errorf("calendar: unit %q: want minute, hour, day, week, month or year", f[0])
	}
	for _, o := range f[1:] {
		if err := p.option(o); err != nil {
			return Period{}, err
		}
	}
	return p, p.Validate()
}

// option applies one option of Parse.
func (p *Period) option(o string) error {
	if v, ok := strings.CutPrefix(strings.ToLower(o), "day="); ok {
		d, err := strconv.Atoi(v)
		if err != nil || d < 1 || d > 31 {
			return fmt.Errorf("calendar: day %q: want 1 to 31", v)
		}
		p.Day = d
		return nil
	}
	for wd := time.Sunday; wd <= time.Saturday; wd++ {
		if strings.EqualFold(o, wd.String()) {
			if p.Unit != Week {
				return fmt.Errorf("calendar: weekday %q: only a week starts on a weekday", o)
			}
			p.Weekday = wd
			return nil
		}
	}
	if p.Location != nil {
		return fmt.Errorf("calendar: %q: a second time zone, or an unknown option", o)
	}
	if loc, ok, err := fixedZone(o); ok {
		if err != nil {
			return err
		}
		p.Location = loc
		return nil
	}
	loc, err := time.LoadLocation(o)
	if err != nil || o == "" || strings.EqualFold(o, "local") {
		return fmt.Errorf("calendar: time zone %q: unknown (want an IANA name such as Europe/Paris, or UTC)", o)
	}
	p.Location = loc
	return nil
}

// FixedZone returns a zone at a fixed offset from UTC (east positive),
// named as Parse reads it back: "UTC+05:30", "UTC-08:00", "UTC+00:17:23".
// The offset must be within ±24 hours, whole seconds.
func FixedZone(offset time.Duration) (*time.Location, error) {
	if offset%time.Second != 0 || offset <= -24*time.Hour || offset >= 24*time.Hour {
		return nil, fmt.Errorf("calendar: zone offset %v: want whole seconds within ±24h", offset)
	}
	sign, off := "+", offset
	if off < 0 {
		sign, off = "-", -off
	}
	secs := int(off / time.Second)
	name := fmt.Sprintf("UTC%s%02d:%02d", sign, secs/3600, secs/60%60)
	if secs%60 != 0 {
		name += fmt.Sprintf(":%02d", secs%60)
	}
	return time.FixedZone(name, int(offset/time.Second)), nil
}

// fixedZone reads a zone named as FixedZone names it; ok is false when o
// is no such name.
func fixedZone(o string) (loc *time.Location, ok bool, err error) {
	rest, found := strings.CutPrefix(o, "UTC")
	if !found || len(rest) < 6 || rest[0] != '+' && rest[0] != '-' {
		return nil, false, nil
	}
	parts := strings.Split(rest[1:], ":")
	if len(parts) > 3 || len(parts) < 2 {
		return nil, true, fmt.Errorf("calendar: zone %q: want UTC+hh:mm or UTC+hh:mm:ss", o)
	}
	var secs int
	for i, part := range parts {
		n, err := strconv.Atoi(part)
		if err != nil || len(part) != 2 || n < 0 || i > 0 && n > 59 || i == 0 && n > 23 {
			return nil, true, fmt.Errorf("calendar: zone %q: want UTC+hh:mm or UTC+hh:mm:ss, hours below 24", o)
		}
		secs = secs*60 + n
	}
	if len(parts) == 2 {
		secs *= 60
	}
	if rest[0] == '-' {
		secs = -secs
	}
	loc, err = FixedZone(time.Duration(secs) * time.Second)
	return loc, true, err
}

// String returns the period as Parse reads it.
func (p Period) String() string {
	s := p.Unit.String()
	if p.Unit == Week {
		s += " " + strings.ToLower(p.Weekday.String())
	}
	if p.Unit == Month && p.Day > 1 {
		s += " day=" + strconv.Itoa(p.Day)
	}
	if p.Location != nil && p.Location != time.UTC {
		s += " " + p.Location.String()
	}
	return s
}
