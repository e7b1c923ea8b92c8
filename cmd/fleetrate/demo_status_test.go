package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/harness/logbuf"
	"github.com/fleetrate/fleetrate/statuspage"
)

// TestDemoPrintsALiveStatusPage runs the demo, reads the status page's
// address from its output, and polls the page during the shared run until
// it shows the fleet's decisions and the OTA's endpoints.
func TestDemoPrintsALiveStatusPage(t *testing.T) {
	var out logbuf.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"demo", "--duration", "3s", "--progress=false"}, func(string) string { return "" }, &out, io.Discard)
	}()
	addrRE := regexp.MustCompile(`status page: (http://127\.0\.0\.1:\d+/)`)
	var st statuspage.Status
	for {
		select {
		case err := <-done:
			t.Fatalf("the demo ended (%v) before its status page showed the shared run; last status %+v\n%s", err, st, out.String())
		case <-time.After(100 * time.Millisecond):
		}
		m := addrRE.FindStringSubmatch(out.String())
		if m == nil {
			continue
		}
		resp, err := http.Get(m[1] + "status.json")
		if err != nil {
			continue
		}
		st = statuspage.Status{}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err == nil && st.Totals.Decisions > 0 && len(st.Buckets) == 4 && len(st.Upstreams) == 3 {
			break
		}
	}
	for _, b := range st.Buckets {
		if b.Error != "" {
			t.Errorf("bucket %s: %s", b.Name, b.Error)
		}
	}
	if st.Upstreams[0].Channel != "booking_com" || st.Upstreams[0].DocumentedRate <= 0 || st.Upstreams[0].RateLimited < 0 {
		t.Errorf("upstream row = %+v, want booking_com with its documented rate and 429 count", st.Upstreams[0])
	}
	// The demo's transports adapt (the default): every row has an
	// effective rate, at most the documented one, and the page shows it.
	for _, u := range st.Upstreams {
		if u.EffectiveRate <= 0 || u.EffectiveRate > u.DocumentedRate || !st.HasEffectiveRate {
			t.Errorf("upstream %s: effective rate %v of documented %v (column shown %v), want in (0, documented], shown",
				u.Endpoint, u.EffectiveRate, u.DocumentedRate, st.HasEffectiveRate)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
}
