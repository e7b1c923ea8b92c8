package lease

import (
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

// TestLeasable pins which takes a lease may serve: a take now of 1 to
// Tokens tokens from one bucket, without a booking or a reserve.
func TestLeasable(t *testing.T) {
	t.Parallel()
	s := &Store{opts: Options{Tokens: 10}}
	b := fleetrate.Bucket{Key: "k", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}}
	reserved := b
	reserved.Reserve = 1
	for _, tt := range []struct {
		name string
		req  fleetrate.Request
		want bool
	}{
		{"one token", fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1}, true},
		{"a whole lease", fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 10}, true},
		{"more than a lease", fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 11}, false},
		{"a peek", fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 0}, false},
		{"two buckets", fleetrate.Request{Buckets: []fleetrate.Bucket{b, b}, N: 1}, false},
		{"a wait", fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1, MaxWait: time.Second}, false},
		{"a booking", fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1, Booking: &fleetrate.Booking{}}, false},
		{"a lower class", fleetrate.Request{Buckets: []fleetrate.Bucket{reserved}, N: 1}, false},
	} {
		if got := s.leasable(tt.req); got != tt.want {
			t.Errorf("%s: leasable = %v, want %v", tt.name, got, tt.want)
		}
	}
}
