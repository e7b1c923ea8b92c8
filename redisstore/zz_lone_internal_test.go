package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
)

type fakeScripter struct {
	redis.Scripter
}

func (fakeScripter) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetVal([]any{time.Now().UnixMicro(), int64(1), int64(0)})
	return cmd
}
func (fakeScripter) Del(ctx context.Context, keys ...string) *redis.IntCmd { return nil }
func (fakeScripter) Get(ctx context.Context, key string) *redis.StringCmd  { return nil }

func BenchmarkLoneAllowClientCost(b *testing.B) {
	s, err := New(fakeScripter{}, Options{Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	s.direct = true
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
