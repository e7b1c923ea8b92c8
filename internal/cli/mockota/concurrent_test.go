package mockota

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// TestConcurrentRefusesBeyondItsBound: with 2 requests in flight a third
// is answered 429, and the timeline shows the peak.
func TestConcurrentRefusesBeyondItsBound(t *testing.T) {
	c := &Concurrent{Bound: 2, MinLatency: 200 * time.Millisecond, MaxLatency: 200 * time.Millisecond}
	srv := httptest.NewServer(c)
	defer srv.Close()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			resp, err := http.Get(srv.URL)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("a request within the bound: %v %v", resp, err)
			}
		})
	}
	for c.Stats().Peak < 2 {
		time.Sleep(time.Millisecond)
	}
	resp, err := http.Get(srv.URL)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a third request in flight: %v %v, want 429", resp, err)
	}
	wg.Wait()
	st := c.Stats()
	if st.Peak != 3 || st.Served != 2 || st.Refused != 1 {
		t.Fatalf("stats %+v, want peak 3 (the refused one counted), 2 served, 1 refused", st)
	}
	tl := c.Timeline()
	if m := MeanInFlight(tl, tl[0].At, tl[len(tl)-1].At); m < 1 || m > 3 {
		t.Fatalf("mean in flight %.2f, want between 1 and 3", m)
	}
}
