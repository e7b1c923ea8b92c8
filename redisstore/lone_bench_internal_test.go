package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
)

// stubScripter answers every EVALSHA at once with a take script's reply
// for a full one-limit bucket, so that a benchmark measures the store's
// own work per call without the network and Redis.
type stubScripter struct {
	redis.Scripter
}

func (stubScripter) EvalSha(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetVal([]any{time.Now().UnixMicro(), int64(1), int64(0)})
	return cmd
}

func (stubScripter) Del(context.Context, ...string) *redis.IntCmd { return nil }
func (stubScripter) Get(context.Context, string) *redis.StringCmd { return nil }

// BenchmarkLoneAllowClientCost is a lone caller's Allow through the
// default (batching) store, whose client gives up at the context's
// deadline, against a stub client: the store's own cost per call.
func BenchmarkLoneAllowClientCost(b *testing.B) {
	s, err := New(stubScripter{}, Options{Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	s.direct = true // as a go-redis client with ContextTimeoutEnabled
	l, err := fleetrate.New(s, fleetrate.Config{Prefix: "fr:", Limits: []fleetrate.Limit{fleetrate.PerSecond(100, 1<<27)}})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Allow(ctx, "bench:1234"); err != nil {
			b.Fatal(err)
		}
	}
}
