package main

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// answers is a rate limit service that answers by the call's order:
// OK, OVER_LIMIT, RESOURCE_EXHAUSTED from its tap (as fleetrate sheds),
// and one that answers after the caller's deadline.
type answers struct {
	rlspb.UnimplementedRateLimitServiceServer
	n atomic.Int64
}

func (a *answers) ShouldRateLimit(ctx context.Context, _ *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	switch a.n.Add(1) % 3 {
	case 0:
		return &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK}, nil
	case 1:
		return &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OVER_LIMIT}, nil
	}
	<-ctx.Done() // late: past the 20 ms the generator waits
	time.Sleep(10 * time.Millisecond)
	return &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK}, nil
}

// TestH2Loop checks the overload's hand-written HTTP/2 client against a
// grpc-go server: every call it sends comes back with the code the
// server gave it (trailers-only sheds from the tap included), a call
// unanswered after 20 ms is DEADLINE_EXCEEDED, and OVER_LIMIT is read
// from the answer.
func TestH2Loop(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var taps atomic.Int64
	srv := grpc.NewServer(grpc.InTapHandle(func(ctx context.Context, _ *tap.Info) (context.Context, error) {
		if taps.Add(1)%4 == 0 {
			return ctx, status.Error(codes.ResourceExhausted, "shed")
		}
		return ctx, nil
	}))
	a := &answers{}
	rlspb.RegisterRateLimitServiceServer(srv, a)
	go srv.Serve(ln)
	defer srv.Stop()

	var inFlight atomic.Int64
	stop, err := h2Loop(ln.Addr().String(), 2, 400, &inFlight)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	calls := stop()
	got := map[codes.Code]int{}
	over := 0
	for _, c := range calls {
		got[c.code]++
		if c.over {
			over++
		}
		if c.code == codes.DeadlineExceeded && (c.took < envoyDeadline || c.took > envoyDeadline+100*time.Millisecond) {
			t.Errorf("a call given up after %v, want just past %v", c.took, envoyDeadline)
		}
	}
	sent := int(taps.Load())
	if len(calls) != sent || sent < 100 {
		t.Fatalf("%d calls recorded, %d reached the server; want the same, at least 100 (400/s for 0.5 s)", len(calls), sent)
	}
	// Under load an answer may come after 20 ms too: every count but the
	// late third's is an upper bound.
	decided, late := int(a.n.Load()), int(a.n.Load())/3
	if n := got[codes.ResourceExhausted]; n == 0 || n > sent-decided {
		t.Errorf("%d RESOURCE_EXHAUSTED, want 1 to the %d the tap shed (%v)", n, sent-decided, got)
	}
	if n := got[codes.DeadlineExceeded]; n < late-1 {
		t.Errorf("%d DEADLINE_EXCEEDED, want at least the %d answered late (%v)", n, late, got)
	}
	if ok := got[codes.OK]; ok == 0 || ok > decided-late+1 || over == 0 || over > ok {
		t.Errorf("%d OK of which %d OVER_LIMIT, of %d decided; want 1 to %d, some OVER_LIMIT (%v)", ok, over, decided, decided-late, got)
	}
	if n := got[codes.OK] + got[codes.ResourceExhausted] + got[codes.DeadlineExceeded]; n != sent {
		t.Errorf("%d calls answered OK, RESOURCE_EXHAUSTED or DEADLINE_EXCEEDED of %d: %v", n, sent, got)
	}
}
