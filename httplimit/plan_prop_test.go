package httplimit

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
	"github.com/fleetrate/fleetrate/internal/harness/manualclock"
	"github.com/fleetrate/fleetrate/internal/headers"
	"github.com/fleetrate/fleetrate/memstore"
)

// This file extends the header property test (quota_test.go) to plans:
// policies whose bucket carries calendar quotas. The middleware runs on
// memstore with a manual clock placed just before a window boundary, on
// daylight-saving days too, and every response is checked against an
// independent model of the quotas (what each window granted) and against
// the requests that follow it.

// planCase is one random plan under test.
type planCase struct {
	t      *testing.T
	clock  *manualclock.Clock
	h      http.Handler
	limit  fleetrate.Limit
	quotas []fleetrate.Quota
	items  []string
	// used and start are the model: what quota i's window starting at
	// start[i] granted.
	used  []int64
	start []time.Time
	log   []string // what happened, for a failure's message
}

var planZones = []string{"UTC", "Asia/Tokyo", "Europe/Paris", "America/New_York", "Asia/Kolkata", "UTC+05:45", "Australia/Lord_Howe", "America/Sao_Paulo"}

// planDays are days that start at awkward moments: daylight saving
// changes in New York, Paris and Lord Howe, month ends, a leap day.
var planDays = []time.Time{
	time.Date(2026, 3, 8, 7, 0, 0, 0, time.UTC), time.Date(2026, 11, 1, 6, 0, 0, 0, time.UTC),
	time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC), time.Date(2026, 10, 25, 1, 0, 0, 0, time.UTC),
	time.Date(2026, 4, 4, 15, 0, 0, 0, time.UTC), time.Date(2026, 1, 31, 23, 0, 0, 0, time.UTC),
	time.Date(2028, 2, 29, 12, 0, 0, 0, time.UTC), time.Date(2026, 12, 31, 23, 0, 0, 0, time.UTC),
}

func newPlanCase(t *testing.T, rng *rand.Rand) *planCase {
	units := []string{"hour", "day", "week", "month", "year"}
	rng.Shuffle(len(units), func(i, j int) { units[i], units[j] = units[j], units[i] })
	pc := &planCase{t: t}
	for _, u := range units[:1+rng.IntN(2)] {
		spec := u
		switch u {
		case "week":
			spec += " " + time.Weekday(rng.IntN(7)).String()
		case "month":
			spec += " day=" + strconv.Itoa(1+rng.IntN(31))
		}
		spec += " " + planZones[rng.IntN(len(planZones))]
		p, err := calendar.Parse(spec)
		if err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		pc.quotas = append(pc.quotas, fleetrate.Quota{Count: 1 + rng.Int64N(12), Period: p})
	}
	rates := []float64{0.5, 1, 10, 1000}
	pc.limit = fleetrate.PerSecond(rates[rng.IntN(len(rates))], 1+rng.Int64N(20))
	// Just before the first quota's window ends, on an awkward day or any
	// day, in whole microseconds as the store reads its clock.
	at := planDays[rng.IntN(len(planDays))]
	if rng.IntN(3) == 0 {
		at = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(rng.Int64N(int64(365 * 24 * time.Hour))))
	}
	_, end := pc.quotas[0].Period.Window(at)
	pc.clock = manualclock.New(end.Add(-time.Duration(rng.Int64N(int64(5*time.Second))/1000) * time.Microsecond))
	m, err := New(Config{
		Store:         memstore.New(memstore.Options{Clock: pc.clock.Now, Shards: 1}),
		Key:           APIKey("X-API-Key"),
		Logger:        slog.New(slog.DiscardHandler),
		LegacyHeaders: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := m.Limit(Policy{
		Name: "p", Limits: []fleetrate.Limit{pc.limit}, Quotas: pc.quotas,
		Cost: func(r *http.Request) (int64, error) { return strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64) },
	})
	if err != nil {
		t.Fatalf("Limit: %v", err)
	}
	pc.h = mw(&okHandler{})
	pc.used, pc.start = make([]int64, len(pc.quotas)), make([]time.Time, len(pc.quotas))
	for _, q := range pc.quotas {
		pc.items = append(pc.items, quotaItem("p", q))
	}
	return pc
}

func (pc *planCase) fatalf(format string, args ...any) {
	pc.t.Helper()
	pc.t.Fatalf("limit %v, quotas %v, at %v: %s\nhistory: %v", pc.limit, pc.quotas, pc.clock.Now(), fmt.Sprintf(format, args...), pc.log)
}

// remaining returns what the model says quota i has left now, and when its
// window ends.
func (pc *planCase) remaining(i int) (int64, time.Time) {
	start, end := pc.quotas[i].Period.Window(pc.clock.Now())
	if !start.Equal(pc.start[i]) {
		pc.start[i], pc.used[i] = start, 0
	}
	return pc.quotas[i].Count - pc.used[i], end
}

// send makes one request of cost tokens and checks its headers against
// the model: a grant is counted in every quota's window; a refusal is by
// a quota exactly when the model says one has less left than the cost.
// It returns the response and the RateLimit item.
func (pc *planCase) send(cost int64) (*httptest.ResponseRecorder, headers.Limit) {
	pc.t.Helper()
	now := pc.clock.Now()
	short := -1 // the refusing quota whose window ends last
	var shortEnd time.Time
	for i := range pc.quotas {
		rem, end := pc.remaining(i)
		if rem < cost && (short < 0 || end.After(shortEnd)) {
			short, shortEnd = i, end
		}
	}
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("X-API-Key", "k")
	r.Header.Set("X-Cost", strconv.FormatInt(cost, 10))
	w := httptest.NewRecorder()
	pc.h.ServeHTTP(w, r)
	l := rateLimit(pc.t, w)
	pc.log = append(pc.log, fmt.Sprintf("%s cost %d: %d %s", now.Format("15:04:05.000000"), cost, w.Code, w.Header().Get(HeaderRateLimit)))
	if w.Code == http.StatusOK {
		if short >= 0 {
			pc.fatalf("granted, but quota %s has less than %d left", pc.items[short], cost)
		}
		for i := range pc.quotas {
			pc.used[i] += cost
		}
	} else if w.Code != http.StatusTooManyRequests {
		pc.fatalf("status %d", w.Code)
	}
	if w.Code == http.StatusTooManyRequests && short >= 0 {
		// A quota refused: the headers state the one that keeps the
		// client out longest, with its exact end.
		rem, end := pc.remaining(short)
		retry, _ := strconv.ParseInt(w.Header().Get(HeaderRetryAfter), 10, 64)
		if l.Name != pc.items[short] || l.Remaining != rem || retry < headers.DelaySeconds(end.Sub(now)) ||
			l.Reset != min(end.Sub(now).Truncate(time.Second), time.Duration(retry)*time.Second) {
			pc.fatalf("refused: RateLimit %+v, Retry-After %d; want %s r=%d reset in %v", l, retry, pc.items[short], rem, end.Sub(now))
		}
		pc.checkLegacy(w, short)
		return w, l
	}
	// Otherwise the item is the tightest: a quota with no more left than
	// any other, or the bucket, with every quota holding more.
	for i := range pc.quotas {
		rem, end := pc.remaining(i)
		switch {
		case l.Name == pc.items[i]:
			if l.Remaining != rem || l.Reset != end.Sub(now).Truncate(time.Second) {
				pc.fatalf("RateLimit %+v; want r=%d t=%v", l, rem, end.Sub(now).Truncate(time.Second))
			}
			pc.checkLegacy(w, i)
		case l.Name == "p" && w.Code == http.StatusOK && rem <= l.Remaining:
			pc.fatalf("RateLimit %+v reports the bucket, but quota %s has only %d left", l, pc.items[i], rem)
		}
	}
	for i := range pc.quotas {
		if rem, _ := pc.remaining(i); l.Name == pc.items[i] {
			for j := range pc.quotas {
				if other, _ := pc.remaining(j); other < rem {
					pc.fatalf("RateLimit %+v reports %s, but %s has only %d left", l, pc.items[i], pc.items[j], other)
				}
			}
		}
	}
	return w, l
}

// checkLegacy checks the X-RateLimit-* fields of a response reporting
// quota i: its count, what the model says is left, its window's end.
func (pc *planCase) checkLegacy(w *httptest.ResponseRecorder, i int) {
	pc.t.Helper()
	rem, end := pc.remaining(i)
	want := []string{strconv.FormatInt(pc.quotas[i].Count, 10), strconv.FormatInt(rem, 10), strconv.FormatInt(end.Unix(), 10)}
	got := []string{w.Header().Get(HeaderXRateLimitLimit), w.Header().Get(HeaderXRateLimitRemaining), w.Header().Get(HeaderXRateLimitReset)}
	if got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || end.Nanosecond() != 0 {
		pc.fatalf("X-RateLimit-Limit, -Remaining, -Reset = %v, want %v", got, want)
	}
}

// burst checks "r": r requests of one token at the same instant are all
// admitted, and the next is refused.
func (pc *planCase) burst(l headers.Limit) {
	pc.t.Helper()
	for k := range l.Remaining {
		if w, _ := pc.send(1); w.Code != http.StatusOK {
			pc.fatalf("RateLimit said r=%d, but request %d at the same instant was refused", l.Remaining, k+1)
		}
	}
	if w, _ := pc.send(1); w.Code != http.StatusTooManyRequests {
		pc.fatalf("RateLimit said r=%d, but one more at the same instant was admitted", l.Remaining)
	}
}

// obey checks a refusal's Retry-After: the same request is still refused
// just before the window it waits for ends (when a quota refused), and is
// admitted once the client has waited it.
func (pc *planCase) obey(w *httptest.ResponseRecorder, l headers.Limit, cost int64) {
	pc.t.Helper()
	retry, err := strconv.ParseInt(w.Header().Get(HeaderRetryAfter), 10, 64)
	if err != nil || retry < 1 {
		pc.fatalf("Retry-After %q", w.Header().Get(HeaderRetryAfter))
	}
	due := pc.clock.Now().Add(time.Duration(retry) * time.Second)
	for i, item := range pc.items {
		if item != l.Name {
			continue
		}
		if _, end := pc.remaining(i); end.Sub(pc.clock.Now()) > time.Microsecond {
			pc.clock.Advance(end.Sub(pc.clock.Now()) - time.Microsecond)
			if w, _ := pc.send(cost); w.Code != http.StatusTooManyRequests {
				pc.fatalf("admitted a microsecond before %s's window ends", item)
			}
		}
	}
	pc.clock.Advance(due.Sub(pc.clock.Now()))
	if w, _ := pc.send(cost); w.Code != http.StatusOK {
		pc.fatalf("refused after waiting the Retry-After of %d s", retry)
	}
}

// TestPlanHeadersKeepTheirPromises is the header property test for
// plans: for random plans (a bucket of any rate and burst, one or two
// calendar quotas of random periods in zones with and without daylight
// saving) and random traffic across window boundaries, every response's
// RateLimit item is the tightest of the bucket and the quotas, its "r" is
// exactly what requests at the same instant get, a quota's "t" and
// X-RateLimit-Reset are its window's end, and a quota's refusal lasts
// until that end and no longer than its Retry-After.
func TestPlanHeadersKeepTheirPromises(t *testing.T) {
	t.Parallel()
	cases := 400
	if testing.Short() {
		cases = 100
	}
	rng := rand.New(rand.NewPCG(40, 2026))
	for n := range cases {
		seed := rng.Uint64()
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			pc := newPlanCase(t, rng)
			maxCost := pc.limit.Burst
			for _, q := range pc.quotas {
				maxCost = min(maxCost, q.Count)
			}
			for range 40 {
				switch rng.IntN(6) {
				case 0: // to a quota's window end, or just before it
					_, end := pc.quotas[rng.IntN(len(pc.quotas))].Period.Window(pc.clock.Now())
					pc.clock.Advance(end.Sub(pc.clock.Now()) - time.Duration(rng.IntN(2))*time.Microsecond)
				case 1:
					pc.clock.Advance(time.Duration(rng.Int64N(int64(3*time.Second))/1000) * time.Microsecond)
				}
				cost := 1 + rng.Int64N(maxCost)
				w, l := pc.send(cost)
				switch {
				case w.Code == http.StatusOK && rng.IntN(3) == 0:
					pc.burst(l)
				case w.Code == http.StatusTooManyRequests && rng.IntN(2) == 0:
					pc.obey(w, l, cost)
				}
			}
		})
	}
}
