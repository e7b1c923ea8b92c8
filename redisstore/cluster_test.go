package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/storetest"
)

// TestCluster runs the store on a Redis Cluster of 3 masters with one
// replica each, built with redis-cli --cluster create. The subtests share
// the cluster and run in order: the last ones reshard it.
func TestCluster(t *testing.T) {
	start := time.Now()
	cl := redistest.StartCluster(t, 3, 1)
	t.Logf("cluster of %d nodes up in %v", len(cl.Nodes()), time.Since(start).Round(time.Millisecond))
	s, err := redisstore.New(cl.Client(), redisstore.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	hour := []fleetrate.Limit{fleetrate.Every(time.Hour, 10)}
	spread := make([]string, 600)
	for i := range spread {
		spread[i] = fmt.Sprintf("spread/%d", i)
	}

	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, func(*testing.T) fleetrate.Store { return s })
	})

	t.Run("KeysSpreadAcrossMasters", func(t *testing.T) {
		lim, err := fleetrate.New(s, fleetrate.Config{Limits: hour})
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range spread {
			if res, err := lim.AllowN(ctx, 3, name); err != nil || !res.Allowed {
				t.Fatalf("%s: %+v, %v", name, res, err)
			}
		}
		keys := storeKeys(spread)
		// fleetrate computes the slot as the server does.
		slots := map[int]bool{}
		for _, k := range keys {
			want, err := cl.Client().ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got := redisstore.Slot(k); got != int(want) {
				t.Fatalf("Slot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
			}
			slots[int(want)] = true
		}
		perMaster := keysPerMaster(t, cl, keys)
		total := 0
		for addr, n := range perMaster {
			if n == 0 {
				t.Errorf("master %s holds none of the %d keys", addr, len(keys))
			}
			total += n
		}
		if total != len(keys) {
			t.Fatalf("masters hold %d of the %d keys", total, len(keys))
		}
		t.Logf("%d keys on %d slots; per master: %v", len(keys), len(slots), perMaster)
	})

	t.Run("Batch", func(t *testing.T) {
		bs, err := redisstore.New(cl.Client(), redisstore.Options{Timeout: 5 * time.Second, Batch: true})
		if err != nil {
			t.Fatal(err)
		}
		storetest.Run(t, func(*testing.T) fleetrate.Store { return bs })
		// Concurrent takes on keys of every slot: each batch holds one
		// slot's keys, so none fails with CROSSSLOT, and every key gets
		// exactly its own tokens.
		lim, err := fleetrate.New(bs, fleetrate.Config{Prefix: "batch:", Limits: hour})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var granted atomic.Int64
		for g := range 32 {
			wg.Go(func() {
				for i := g; i < len(spread); i += 32 {
					for range 11 {
						res, err := lim.Allow(ctx, spread[i])
						if err != nil {
							t.Error(err)
							return
						}
						if res.Allowed {
							granted.Add(1)
						}
					}
				}
			})
		}
		wg.Wait()
		if want := int64(10 * len(spread)); granted.Load() != want {
			t.Fatalf("granted %d, want %d (10 per key)", granted.Load(), want)
		}
	})

	t.Run("PermitKeysShareTheSlot", func(t *testing.T) { permitKeysShareTheSlot(t, cl, s) })
	t.Run("PermitNoticeWakesOnlyItsWaiter", func(t *testing.T) { clusterNotices(t, cl) })

	t.Run("CredentialPlusEndpointIsAtomic", func(t *testing.T) {
		lim, err := fleetrate.New(s, fleetrate.Config{Buckets: []fleetrate.BucketConfig{
			{Name: "{booking_com}/availability", Limits: []fleetrate.Limit{fleetrate.Every(time.Hour, 6)}},
			{Name: "{booking_com}/search", Limits: []fleetrate.Limit{fleetrate.Every(time.Hour, 6)}},
			{Name: "{booking_com}", Limits: []fleetrate.Limit{fleetrate.Every(time.Hour, 8)}},
			{Name: "{expedia}/availability", Limits: []fleetrate.Limit{fleetrate.Every(time.Hour, 2)}},
			{Name: "{expedia}", Limits: []fleetrate.Limit{fleetrate.Every(time.Hour, 10)}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		slot := redisstore.Slot("fleetrate:{booking_com}")
		for _, k := range []string{"fleetrate:{booking_com}/availability", "fleetrate:{booking_com}/search"} {
			if got, _ := cl.Client().ClusterKeySlot(ctx, k).Result(); int(got) != slot {
				t.Fatalf("%s is on slot %d, the credential on %d", k, got, slot)
			}
		}
		// 32 goroutines race for the credential's 8 tokens through two
		// endpoints of 6 each: exactly 8 are granted, and a take the
		// credential denies takes nothing from its endpoint.
		endpoints := []string{"{booking_com}/availability", "{booking_com}/search"}
		var granted [2]atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for g := range 32 {
			wg.Go(func() {
				e := g % 2
				res, err := lim.AllowN(ctx, 1, endpoints[e], "{booking_com}")
				if err != nil {
					errs <- err
					return
				}
				if res.Allowed {
					granted[e].Add(1)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if got := granted[0].Load() + granted[1].Load(); got != 8 {
			t.Fatalf("%d takes granted, want exactly the credential's 8", got)
		}
		for e, name := range endpoints {
			res, err := lim.Peek(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if want := 6 - granted[e].Load(); res.Remaining != want {
				t.Fatalf("%s has %d left after %d grants, want %d: a denied take consumed from it", name, res.Remaining, granted[e].Load(), want)
			}
		}
		// The other way round: the endpoint denies, the credential keeps
		// its tokens.
		for range 5 {
			if _, err := lim.AllowN(ctx, 1, "{expedia}/availability", "{expedia}"); err != nil {
				t.Fatal(err)
			}
		}
		if res, err := lim.Peek(ctx, "{expedia}"); err != nil || res.Remaining != 8 {
			t.Fatalf("credential after 2 grants and 3 endpoint denials: %+v, %v; want 8 left", res, err)
		}
		t.Logf("credential-plus-endpoint: %d + %d grants of 32 racing takes", granted[0].Load(), granted[1].Load())
	})

	t.Run("CrossSlotIsInvalid", func(t *testing.T) {
		a, b := "cross/a", "cross/b"
		if redisstore.Slot("fleetrate:"+a) == redisstore.Slot("fleetrate:"+b) {
			t.Fatal("pick names on different slots")
		}
		lim, err := fleetrate.New(s, fleetrate.Config{Limits: hour})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lim.AllowN(ctx, 1, a, b); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "hash tag") {
			t.Fatalf("take across slots: %v; want ErrInvalid suggesting a hash tag", err)
		}
		if err := lim.Refund(ctx, fleetrate.Result{Allowed: true, N: 1, At: time.Now()}, a, b); !errors.Is(err, fleetrate.ErrInvalid) {
			t.Fatalf("refund across slots: %v", err)
		}
		if err := lim.Drain(ctx, time.Second, a, b); !errors.Is(err, fleetrate.ErrInvalid) {
			t.Fatalf("drain across slots: %v", err)
		}
		if n, err := cl.Client().Exists(ctx, "fleetrate:"+a).Result(); err != nil || n != 0 {
			t.Fatalf("a refused call wrote a key: %d, %v", n, err)
		}
		// Reset deletes key by key, so it works across slots.
		if _, err := lim.Allow(ctx, a); err != nil {
			t.Fatal(err)
		}
		if err := lim.Reset(ctx, a, b); err != nil {
			t.Fatalf("reset across slots: %v", err)
		}
	})

	t.Run("ACLUser", func(t *testing.T) {
		// ACL users are per node, so every node gets them. A Cluster
		// client also runs CLUSTER SLOTS, to learn which master serves
		// which slot, and COMMAND, to learn where commands keep their
		// keys; refused, it retries COMMAND before every call.
		users := []struct {
			name string
			cmds []string
		}{
			{"fleet", append(slices.Clone(clusterCommands), "+cluster|slots", "+command")},
			{"no_slots", append(slices.Clone(clusterCommands), "+command")},
			{"no_command", append(slices.Clone(clusterCommands), "+cluster|slots")},
		}
		if got := "ACL SETUSER fleet " + strings.Join(aclRules("fleetrate:*", users[0].cmds), " "); got != scriptClusterACL {
			t.Fatalf("the tested ACL line\n%s\ndiffers from scriptClusterACL\n%s", got, scriptClusterACL)
		}
		for _, n := range cl.Nodes() {
			for _, u := range users {
				args := []any{"acl", "setuser", u.name}
				for _, r := range aclRules("fleetrate:*", u.cmds) {
					args = append(args, r)
				}
				if _, err := n.Do(args...); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, u := range users {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), Username: u.name, Password: "secret"})
			us, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			lim, err := fleetrate.New(us, fleetrate.Config{Limits: hour})
			if err != nil {
				t.Fatal(err)
			}
			err = us.LoadScripts(ctx)
			const calls = 10
			for i := 0; err == nil && i < calls; i++ {
				_, err = lim.Allow(ctx, fmt.Sprintf("acl/%s/%d", u.name, i))
			}
			if err == nil {
				_, err = lim.AllowN(ctx, 1, "{acl}/endpoint/"+u.name, "{acl}/"+u.name)
			}
			_ = c.Close()
			refused := map[string]int{}
			for _, n := range cl.Nodes() {
				v, err := n.Do("acl", "log", 100)
				if err != nil {
					t.Fatal(err)
				}
				entries, _ := v.([]any)
				for _, e := range entries {
					if m, _ := e.(map[any]any); m["username"] == u.name {
						cnt, _ := m["count"].(int64)
						refused[fmt.Sprint(m["object"])] += int(cnt)
					}
				}
			}
			switch u.name {
			case "fleet":
				if err != nil || len(refused) > 0 {
					t.Fatalf("user with %s: %v; ACL LOG refusals %v", strings.Join(u.cmds, " "), err, refused)
				}
			case "no_slots":
				if !errors.Is(err, fleetrate.ErrStoreUnavailable) || !strings.Contains(err.Error(), "NOPERM") {
					t.Fatalf("without +cluster|slots: %v; want ErrStoreUnavailable naming NOPERM", err)
				}
				t.Logf("without +cluster|slots: %v", err)
			case "no_command":
				if err != nil {
					t.Fatalf("without +command: %v", err)
				}
				if refused["command"] < calls {
					t.Fatalf("without +command, %d COMMAND refusals for %d calls; want one per call", refused["command"], calls)
				}
				t.Logf("without +command the store works, but the client retried COMMAND %d times for %d calls", refused["command"], calls+2)
			}
		}
	})

	t.Run("ReshardingMovesBucketState", func(t *testing.T) {
		lim, err := fleetrate.New(s, fleetrate.Config{Limits: hour})
		if err != nil {
			t.Fatal(err)
		}
		const reshardSlots = 500
		ms := cl.Masters()
		keys := storeKeys(spread)
		before := keyOwners(t, cl, keys)
		start := time.Now()
		if err := cl.Reshard(ms[0], ms[1], reshardSlots); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		after := keyOwners(t, cl, keys) // its MOVED replies are counted before the reads
		movedBefore := errorstat(t, ms[0], "MOVED")
		// Read first the buckets that moved: the client still has the old
		// slot map, so the first of them meets MOVED.
		var order, movedKeys []string
		for i, k := range keys {
			if before[k] != after[k] {
				movedKeys = append(movedKeys, k)
				order = append([]string{spread[i]}, order...)
			} else {
				order = append(order, spread[i])
			}
		}
		if len(movedKeys) == 0 {
			t.Fatalf("resharding %d slots moved none of the %d buckets", reshardSlots, len(keys))
		}
		// Every bucket kept its 3 taken tokens.
		for _, name := range order {
			res, err := lim.Peek(ctx, name)
			if err != nil {
				t.Fatalf("%s after resharding: %v", name, err)
			}
			if res.Remaining != 7 {
				t.Fatalf("%s has %d left after resharding, want 7", name, res.Remaining)
			}
		}
		moved := errorstat(t, ms[0], "MOVED") - movedBefore
		if moved == 0 {
			t.Error("no MOVED was answered for a bucket whose slot moved")
		}
		t.Logf("redis-cli --cluster reshard of %d slots took %v and moved %d buckets, which kept their state; %d MOVED redirect(s) answered (go-redis reloads its slot map on the first)",
			reshardSlots, took.Round(time.Millisecond), len(movedKeys), moved)
	})

	t.Run("PipelinesAreGroupedPerNode", func(t *testing.T) {
		// fleetrate has no batch API; this pins down the go-redis
		// behaviour a batching caller relies on: a Cluster pipeline is
		// one round trip per master, not one per slot or key.
		var mu sync.Mutex
		perNode := map[string]int{}
		c := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: cl.Addrs(),
			NewClient: func(opt *redis.Options) *redis.Client {
				nc := redis.NewClient(opt)
				nc.AddHook(pipelineCounter(func() {
					mu.Lock()
					perNode[opt.Addr]++
					mu.Unlock()
				}))
				return nc
			},
		})
		defer c.Close()
		c.ReloadState(ctx)
		cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range storeKeys(spread) {
				p.PTTL(ctx, k)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, cmd := range cmds {
			if ttl := cmd.(*redis.DurationCmd).Val(); ttl <= 0 {
				t.Fatalf("%v: every bucket key must have a TTL", cmd)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(perNode) != len(cl.Masters()) {
			t.Fatalf("pipeline of %d commands went to %v, want one round trip to each of %d masters", len(cmds), perNode, len(cl.Masters()))
		}
		for addr, n := range perNode {
			if n != 1 {
				t.Fatalf("pipeline took %d round trips to %s, want 1: %v", n, addr, perNode)
			}
		}
		t.Logf("a pipeline of %d commands over %d masters: round trips per node %v", len(cmds), len(cl.Masters()), perNode)
	})
}

func storeKeys(names []string) []string {
	keys := make([]string, len(names))
	for i, n := range names {
		keys[i] = fleetrate.DefaultPrefix + n
	}
	return keys
}

// keysPerMaster counts the keys each master holds.
func keysPerMaster(t *testing.T, cl *redistest.Cluster, keys []string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range cl.Masters() {
		out[m.Addr()] = 0
	}
	for _, addr := range keyOwners(t, cl, keys) {
		out[addr]++
	}
	return out
}

// keyOwners asks each master directly which of keys it holds: a master
// answers EXISTS for its own slots and MOVED for the others. It returns
// each key's master and fails if a key is on none or on two.
func keyOwners(t *testing.T, cl *redistest.Cluster, keys []string) map[string]string {
	t.Helper()
	ctx := context.Background()
	owner := map[string]string{}
	for _, m := range cl.Masters() {
		c := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
		cmds, _ := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				p.Exists(ctx, k)
			}
			return nil
		})
		_ = c.Close()
		for i, cmd := range cmds {
			v, err := cmd.(*redis.IntCmd).Result()
			switch {
			case err != nil && strings.HasPrefix(err.Error(), "MOVED"):
			case err != nil:
				t.Fatalf("EXISTS %s on %s: %v", keys[i], m.Addr(), err)
			case v != 1:
				t.Fatalf("%s: its master %s does not hold it", keys[i], m.Addr())
			case owner[keys[i]] != "":
				t.Fatalf("%s is on %s and %s", keys[i], owner[keys[i]], m.Addr())
			default:
				owner[keys[i]] = m.Addr()
			}
		}
	}
	for _, k := range keys {
		if owner[k] == "" {
			t.Fatalf("%s is on no master", k)
		}
	}
	return owner
}

func errorstat(t *testing.T, n *redistest.Node, name string) int {
	t.Helper()
	st, err := n.Errorstats()
	if err != nil {
		t.Fatal(err)
	}
	return st[name]
}

// pipelineCounter is a go-redis hook that counts round trips of PTTL
// pipelines.
type pipelineCounter func()

func (f pipelineCounter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (f pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (f pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		// Connection setup pipelines (HELLO, CLIENT SETINFO) don't count.
		if len(cmds) > 0 && cmds[0].Name() == "pttl" {
			f()
		}
		return next(ctx, cmds)
	}
}
