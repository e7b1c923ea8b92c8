package redistest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// ScriptCounter is a go-redis hook that counts the script calls a client
// sends (EVALSHA, EVAL on a cache miss, and their read-only forms), alone
// or in pipelines, into N. When Only is set, it counts only the calls whose
// context Only accepts. Connection handshakes are never counted.
type ScriptCounter struct {
	N    *atomic.Int64
	Only func(ctx context.Context) bool
}

// DialHook implements redis.Hook; dials are not counted.
func (h ScriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h ScriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.counts(ctx) && isScriptCall(cmd) {
			h.N.Add(1)
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (h ScriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.counts(ctx) {
			for _, cmd := range cmds {
				if isScriptCall(cmd) {
					h.N.Add(1)
				}
			}
		}
		return next(ctx, cmds)
	}
}

func (h ScriptCounter) counts(ctx context.Context) bool { return h.Only == nil || h.Only(ctx) }

func isScriptCall(cmd redis.Cmder) bool {
	switch strings.ToLower(cmd.Name()) {
	case "evalsha", "eval", "evalsha_ro", "eval_ro":
		return true
	}
	return false
}

// ScriptCalls returns the script calls (EVAL, EVALSHA and their read-only
// forms) the server at addr has served, from INFO commandstats: what the
// server saw, not what a client hook counted.
func ScriptCalls(addr string) (int64, error) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO commandstats on %s: %w", addr, err)
	}
	var total int64
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !slices.Contains([]string{"cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro"}, name) {
			continue
		}
		for kv := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				total += n
			}
		}
	}
	return total, nil
}
