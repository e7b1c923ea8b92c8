package mockota

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// TestReportIsTruthful: on a fixed timeline, what each form reports of the
// hidden limit (12/s, burst 2) never overstates what the bucket admits
// in the second to come, nor the limit; misleading, it claims the
// documented rate and every other answer more remaining than the limit.
func TestReportIsTruthful(t *testing.T) {
	t.Parallel()
	for _, f := range []ReportForm{ReportXRateLimit, ReportDraft, ReportOpenAI, ReportAnthropic} {
		t.Run(f.String(), func(t *testing.T) {
			t.Parallel()
			now := time.Unix(1000, 0)
			a, err := NewAdversary(AdversaryConfig{Rate: 20, Burst: 2, HiddenRate: 12, HiddenBurst: 2, Report: f, Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 5 {
				rec := httptest.NewRecorder()
				a.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
				h := rec.Header()
				if len(h) < 2 {
					t.Fatalf("answer %d carries no %v fields: %v", i, f, h)
				}
				if f == ReportXRateLimit {
					lim, _ := strconv.Atoi(h.Get("X-RateLimit-Limit"))
					rem, _ := strconv.Atoi(h.Get("X-RateLimit-Remaining"))
					if lim != 12 || rem > lim || rem < 0 {
						t.Errorf("answer %d: limit %d remaining %d, want 12 and at most 12", i, lim, rem)
					}
				}
				now = now.Add(10 * time.Millisecond)
			}
		})
	}
	t.Run("misleading", func(t *testing.T) {
		t.Parallel()
		a, err := NewAdversary(AdversaryConfig{Rate: 20, Burst: 2, HiddenRate: 12, HiddenBurst: 2, Report: ReportXRateLimit, Misleading: true})
		if err != nil {
			t.Fatal(err)
		}
		var above int
		for range 4 {
			rec := httptest.NewRecorder()
			a.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			lim, _ := strconv.Atoi(rec.Header().Get("X-RateLimit-Limit"))
			rem, _ := strconv.Atoi(rec.Header().Get("X-RateLimit-Remaining"))
			if lim != 20 {
				t.Errorf("misleading limit %d, want the documented 20", lim)
			}
			if rem > lim {
				above++
			}
		}
		if above != 2 {
			t.Errorf("%d of 4 answers contradict themselves, want 2", above)
		}
	})
}
