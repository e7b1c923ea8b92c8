package simulate

// This file is the month scenario: a month of customers' traffic, on a
// simulated clock, through a calendar quota with a smoothing bucket, a bare
// fixed window of the month, a bare token bucket refilled at the month's
// average rate, and the calendar quota alone. Nothing sleeps: the stores
// read the simulation's clock.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
	"github.com/fleetrate/fleetrate/memstore"
)

// Defaults of MonthConfig, applied by RunMonth when a field is zero: a plan
// of 10,000 a month resetting on the 1st, smoothed by a bucket of 30 a
// minute with a burst of 30.
const (
	DefaultMonthQuota        = 10_000
	DefaultMonthRate         = 0.5 // a second: 30 a minute
	DefaultMonthBurst        = 30
	DefaultMonthDays         = 31
	DefaultMonthBoundarySpan = 10 * time.Minute
	DefaultMonthPeriod       = "month day=1"
	DefaultMonth             = "2026-02"
)

// MonthConfig describes the month scenario. The zero value of each field
// means its default.
type MonthConfig struct {
	// Period is the calendar quota's period, a month with its anchor day
	// and time zone. The default is "month day=1" in UTC.
	Period calendar.Period
	// Quota is the count of the calendar quota and of the fixed window,
	// per window. The default is 10,000; at most 1,000,000.
	Quota int64
	// Rate and Burst are the smoothing token bucket beside the quota:
	// tokens per second and capacity. The defaults are 0.5 (30 a minute)
	// and 30.
	Rate  float64
	Burst int64
	// BareBurst is the bare token bucket's capacity; it refills Quota per
	// 30 days, the month a duration-based limit reads. The default is
	// Quota.
	BareBurst int64
	// Month, as "2006-01", is the month whose window start the run is
	// centred on: the boundary client straddles it. The default is
	// "2026-02".
	Month string
	// Days is how many days the run covers, from midnight in the period's
	// zone, half of them before the boundary's day. The default is 31;
	// 2 to 62.
	Days int
	// BoundarySpan is how long before and after the boundary the boundary
	// client sends a whole quota each. The default is 10 minutes; 1 s to
	// 1 h.
	BoundarySpan time.Duration
}

// nominalMonth is a month as a duration-based limit reads it.
const nominalMonth = 30 * 24 * time.Hour

// aroundBoundary is the span centred on the boundary whose admitted
// requests MonthStats counts.
const aroundBoundary = 24 * time.Hour

func (c MonthConfig) withDefaults() MonthConfig {
	if c.Period.Unit == 0 {
		c.Period, _ = calendar.Parse(DefaultMonthPeriod)
	}
	if c.Quota == 0 {
		c.Quota = DefaultMonthQuota
	}
	if c.Rate == 0 {
		c.Rate = DefaultMonthRate
	}
	if c.Burst == 0 {
		c.Burst = DefaultMonthBurst
	}
	if c.BareBurst == 0 {
		c.BareBurst = c.Quota
	}
	if c.Month == "" {
		c.Month = DefaultMonth
	}
	if c.Days == 0 {
		c.Days = DefaultMonthDays
	}
	if c.BoundarySpan == 0 {
		c.BoundarySpan = DefaultMonthBoundarySpan
	}
	return c
}

// Validate checks the configuration after defaults, naming the offending
// field and value.
func (c MonthConfig) Validate() error {
	c = c.withDefaults()
	if err := c.Period.Validate(); err != nil {
		return fmt.Errorf("simulate month: period: %w", err)
	}
	switch {
	case c.Period.Unit != calendar.Month:
		return fmt.Errorf("simulate month: period must be a month (the traffic is a month's), got %q", c.Period.String())
	case c.Quota < 1 || c.Quota > 1_000_000:
		return fmt.Errorf("simulate month: quota must be between 1 and 1000000, got %d", c.Quota)
	case c.Days < 2 || c.Days > 62:
		return fmt.Errorf("simulate month: days must be between 2 and 62, got %d", c.Days)
	case c.BoundarySpan < time.Second || c.BoundarySpan > time.Hour:
		return fmt.Errorf("simulate month: boundary span must be between 1s and 1h, got %v", c.BoundarySpan)
	}
	if _, err := time.Parse("2006-01", c.Month); err != nil {
		return fmt.Errorf("simulate month: month %q: want a year and month such as 2026-02", c.Month)
	}
	if n := c.requests(); n > MaxMonthRequests {
		return fmt.Errorf("simulate month: %d requests, more than %d; use a smaller quota or fewer days", n, MaxMonthRequests)
	}
	if err := fleetrate.PerSecond(c.Rate, c.Burst).Validate(); err != nil {
		return fmt.Errorf("simulate month: smoothing bucket: %w", err)
	}
	if err := c.bareLimit().Validate(); err != nil {
		return fmt.Errorf("simulate month: bare bucket (quota per 30 days, burst %d): %w", c.BareBurst, err)
	}
	return nil
}

// MaxMonthRequests bounds the requests of a month run, each decided by
// four limiters, so that no configuration runs for long: about 5 s at
// most, the default run being 50,000 requests in 0.3 s.
const MaxMonthRequests = 1_000_000

// requests returns how many requests the run sends: every customer's
// weekday count every day at most, plus the boundary customer's two
// quotas.
func (c MonthConfig) requests() int64 {
	var n int64
	for _, cu := range monthCustomers(c) {
		n += int64(c.Days) * max(cu.Weekday, cu.Weekend)
		if cu.Straddles {
			n += 2 * c.Quota
		}
	}
	return n
}

// bareLimit is the bare token bucket: Quota per 30 days, burst BareBurst.
func (c MonthConfig) bareLimit() fleetrate.Limit {
	return fleetrate.Limit{Rate: float64(c.Quota) / nominalMonth.Seconds(), Burst: c.BareBurst}
}

// span returns the run's first instant, its boundary and its end, in the
// period's zone.
func (c MonthConfig) span() (from, boundary, end time.Time) {
	loc := c.Period.Location
	if loc == nil {
		loc = time.UTC
	}
	m, _ := time.Parse("2006-01", c.Month)
	// The window holding the month's last instant starts in the month.
	boundary, _ = c.Period.Window(time.Date(m.Year(), m.Month()+1, 1, 0, 0, 0, 0, loc).Add(-time.Nanosecond))
	y, mo, d := boundary.In(loc).Date()
	before := (c.Days + 1) / 2
	return time.Date(y, mo, d-before, 0, 0, 0, 0, loc), boundary, time.Date(y, mo, d-before+c.Days, 0, 0, 0, 0, loc)
}

// CustomerStats is one customer's outcome under one limiter. Times are
// offsets from MonthReport.From.
type CustomerStats struct {
	// Admits and Denials are when requests were admitted and refused, in
	// order.
	Admits, Denials []time.Duration
	// QuotaDenied counts the refusals a calendar quota decided.
	QuotaDenied int
	// PerDay[i] is the number admitted on day i of the run.
	PerDay []int
	// MaxInMinute is the most admitted in any 60 s.
	MaxInMinute int
	// AroundBoundary is the number admitted in the 24 h centred on the
	// boundary.
	AroundBoundary int
}

// MonthStats are one limiter's results.
type MonthStats struct {
	// Name is the limiter's name, e.g. "quota+bucket".
	Name string
	// Customers are in the order of MonthReport.Customers.
	Customers []CustomerStats
	// PerDay and DeniedPerDay count all customers' requests day by day.
	PerDay, DeniedPerDay []int
	// MaxInMinute is the most admitted to one customer in any 60 s.
	MaxInMinute int
}

// Admitted totals the customers' admitted requests.
func (s MonthStats) Admitted() (n int) {
	for _, c := range s.Customers {
		n += len(c.Admits)
	}
	return n
}

// Denied totals the customers' refused requests.
func (s MonthStats) Denied() (n int) {
	for _, c := range s.Customers {
		n += len(c.Denials)
	}
	return n
}

// MonthReport is the outcome of RunMonth.
type MonthReport struct {
	// Config is the configuration with defaults applied.
	Config MonthConfig
	// From, Boundary and End are the run's first instant, the quota
	// window start it is centred on, and its end.
	From, Boundary, End time.Time
	// Customers describe the traffic, one key each.
	Customers []Customer
	// Limiters are, in order, quota+bucket, fixed window, bare bucket and
	// quota alone.
	Limiters []MonthStats
}

// Limiter names, in the order of MonthReport.Limiters.
const (
	QuotaBucket = iota
	FixedWindow
	BareBucket
	QuotaAlone
)

// RunMonth plays the month scenario through the four limiters.
func RunMonth(cfg MonthConfig) (*MonthReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	from, boundary, end := cfg.span()
	rep := &MonthReport{Config: cfg, From: from, Boundary: boundary, End: end, Customers: monthCustomers(cfg)}
	traffic := monthTraffic(cfg, rep.Customers, from, boundary)
	sides, err := monthSides(cfg, from)
	if err != nil {
		return nil, err
	}
	for _, s := range sides {
		st, err := rep.play(s, traffic)
		if err != nil {
			return nil, err
		}
		rep.Limiters = append(rep.Limiters, st)
	}
	return rep, nil
}

// monthSide is one limiter of the month: it decides a customer's request
// at a moment of the simulated clock.
type monthSide struct {
	name   string
	decide func(customer string, at time.Time) (ok, quotaDenied bool, err error)
}

// monthSides returns the four limiters, each over its own state.
func monthSides(c MonthConfig, from time.Time) ([]monthSide, error) {
	quota := fleetrate.Quota{Name: "plan", Count: c.Quota, Period: c.Period}
	smooth := fleetrate.PerSecond(c.Rate, c.Burst).Named("smoothing")
	// The quota alone still needs a limit; this one never binds: its burst
	// is the quota's count and it refills a million a second.
	unbound := fleetrate.PerSecond(1e6, c.Quota)
	var named, alone []fleetrate.BucketConfig
	for _, cu := range monthCustomers(c) {
		named = append(named, fleetrate.BucketConfig{Name: cu.Name, Limits: []fleetrate.Limit{smooth}, Quotas: []fleetrate.Quota{quota}})
		alone = append(alone, fleetrate.BucketConfig{Name: cu.Name, Limits: []fleetrate.Limit{unbound}, Quotas: []fleetrate.Quota{quota}})
	}
	qb, err := storeSide("quota+bucket", from, fleetrate.Config{Buckets: named})
	if err != nil {
		return nil, err
	}
	bare, err := storeSide("bare bucket", from, fleetrate.Config{Limits: []fleetrate.Limit{c.bareLimit()}})
	if err != nil {
		return nil, err
	}
	qa, err := storeSide("quota alone", from, fleetrate.Config{Buckets: alone})
	if err != nil {
		return nil, err
	}
	return []monthSide{qb, fixedMonthSide(c.Period, c.Quota), bare, qa}, nil
}

// storeSide is a fleetrate.Limiter of cfg over a memstore whose clock is
// the simulation's.
func storeSide(name string, from time.Time, cfg fleetrate.Config) (monthSide, error) {
	now := from
	store := memstore.New(memstore.Options{Clock: func() time.Time { return now }, Shards: 1})
	cfg.Prefix = "simulate:"
	lim, err := fleetrate.New(store, cfg)
	if err != nil {
		return monthSide{}, fmt.Errorf("simulate month: %s: %w", name, err)
	}
	return monthSide{name: name, decide: func(customer string, at time.Time) (bool, bool, error) {
		now = at
		res, err := lim.Allow(context.Background(), customer)
		return res.Allowed, res.QuotaDenied, err
	}}, nil
}

// fixedMonthSide is the baseline, a counter per customer reset at each
// window start of the period and nothing else: not a fleetrate feature.
func fixedMonthSide(p calendar.Period, quota int64) monthSide {
	type count struct {
		start time.Time
		n     int64
	}
	counts := map[string]*count{}
	return monthSide{name: "fixed window", decide: func(customer string, at time.Time) (bool, bool, error) {
		start, _ := p.Window(at)
		c := counts[customer]
		if c == nil || !c.start.Equal(start) {
			c = &count{start: start}
			counts[customer] = c
		}
		if c.n >= quota {
			return false, true, nil
		}
		c.n++
		return true, false, nil
	}}
}

// play runs the traffic through one limiter. A refused request is not
// retried: it counts as denied.
func (r *MonthReport) play(s monthSide, traffic []monthRequest) (MonthStats, error) {
	days := r.Config.Days
	st := MonthStats{Name: s.name, Customers: make([]CustomerStats, len(r.Customers)), PerDay: make([]int, days), DeniedPerDay: make([]int, days)}
	for _, q := range traffic {
		ok, byQuota, err := s.decide(r.Customers[q.customer].Name, q.at)
		if err != nil {
			return st, fmt.Errorf("simulate month: %s: %w", s.name, err)
		}
		cs := &st.Customers[q.customer]
		off, day := q.at.Sub(r.From), r.day(q.at)
		if !ok {
			cs.Denials = append(cs.Denials, off)
			st.DeniedPerDay[day]++
			if byQuota {
				cs.QuotaDenied++
			}
			continue
		}
		cs.Admits = append(cs.Admits, off)
		st.PerDay[day]++
	}
	lo, hi := r.Boundary.Add(-aroundBoundary/2).Sub(r.From), r.Boundary.Add(aroundBoundary/2).Sub(r.From)
	for i := range st.Customers {
		cs := &st.Customers[i]
		cs.PerDay = make([]int, days)
		for _, a := range cs.Admits {
			cs.PerDay[r.day(r.From.Add(a))]++
			if a >= lo && a < hi {
				cs.AroundBoundary++
			}
		}
		cs.MaxInMinute, _ = maxInSpan(cs.Admits, time.Minute)
		st.MaxInMinute = max(st.MaxInMinute, cs.MaxInMinute)
	}
	return st, nil
}

// day returns the index of the run's day, in the period's zone, that t
// falls on.
func (r *MonthReport) day(t time.Time) int {
	loc := r.From.Location()
	y, m, d := t.In(loc).Date()
	fy, fm, fd := r.From.Date()
	// Whole days between two UTC dates: immune to DST's 23 and 25 hours.
	n := int(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Sub(time.Date(fy, fm, fd, 0, 0, 0, 0, time.UTC)) / (24 * time.Hour))
	return min(max(n, 0), r.Config.Days-1)
}

// DayStart returns the first instant of day i of the run.
func (r *MonthReport) DayStart(i int) time.Time {
	y, m, d := r.From.Date()
	return time.Date(y, m, d+i, 0, 0, 0, 0, r.From.Location())
}

// WindowCounts returns, for a customer under a limiter, how many requests
// were admitted in each window of the period, by window start.
func (r *MonthReport) WindowCounts(limiter, customer int) map[time.Time]int {
	out := map[time.Time]int{}
	for _, a := range r.Limiters[limiter].Customers[customer].Admits {
		start, _ := r.Config.Period.Window(r.From.Add(a))
		out[start]++
	}
	return out
}

// CustomerIndex returns the index of the named customer, or -1.
func (r *MonthReport) CustomerIndex(name string) int {
	return slices.IndexFunc(r.Customers, func(c Customer) bool { return c.Name == name })
}
