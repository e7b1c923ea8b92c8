package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/storetest"
)

// fleetCommands is everything a fleetrate client runs: EVALSHA, EVAL when
// the script cache is empty, SCRIPT LOAD for LoadScripts, GET for State,
// DEL for Reset, and inside the scripts TIME, GET, MGET (batched takes),
// SET and DEL (commands a script calls are checked against the caller's
// ACL too).
var fleetCommands = []string{"+evalsha", "+eval", "+script|load", "+get", "+mget", "+set", "+del", "+time", "+info"}

// permitRules are what a store needs beyond fleetCommands for in-flight
// permits (Bucket.InFlight): the sorted sets and TTLs of the permit keys
// inside the scripts, and the channel on which Release announces freed
// permits to NotifyPermit's subscription (which Listen pings). They are
// the rules docs/OPERATIONS.md adds to the minimal ACL user for permits.
var permitRules = []string{"&fleetrate:permits", "+zadd", "+zrem", "+zrange", "+zrangebyscore", "+zremrangebyscore", "+zcard", "+zscore", "+zrank", "+pexpire", "+publish", "+subscribe", "+ping"}

// quotaRules are what a store needs beyond fleetCommands for calendar
// quotas (Bucket.Quotas): the hash of each bucket's quota use and its TTL,
// inside the take script. They are the rules docs/OPERATIONS.md adds to
// the minimal ACL user for quotas.
var quotaRules = []string{"+hget", "+hset", "+pexpire"}

// clusterCommands are fleetCommands without +info, which only the
// failover guard of a single master (Options.EmptyAfterFailover) runs.
var clusterCommands = slices.DeleteFunc(slices.Clone(fleetCommands), func(c string) bool { return c == "+info" })

// The script and key part of the ACL lines docs/OPERATIONS.md gives
// operators, for a standalone (or Sentinel) server and for every node of a
// Cluster. The documented lines also allow the announcement channel,
// PUBLISH, SUBSCRIBE, PING and INFO: internal/doccheck's TestDocumentedACL
// reads them from the doc and runs every call through them.
const (
	scriptACL = "ACL SETUSER fleet on >secret resetkeys ~fleetrate:* resetchannels -@all +evalsha +eval +script|load +get +mget +set +del +time +info"
	// A Cluster store keeps no failover guard (EmptyAfterFailover is the
	// default only on a *redis.Client), so it needs no INFO.
	scriptClusterACL = "ACL SETUSER fleet on >secret resetkeys ~fleetrate:* resetchannels -@all +evalsha +eval +script|load +get +mget +set +del +time +cluster|slots +command"
)

// aclRules are the ACL SETUSER rules of a user that may run cmds on keys
// matching pattern, with password "secret".
func aclRules(pattern string, cmds []string) []string {
	return append([]string{"on", ">secret", "resetkeys", "~" + pattern, "resetchannels", "-@all"}, cmds...)
}

func setUser(t *testing.T, srv *redistest.TLSServer, name string, rules []string) {
	t.Helper()
	args := []any{"acl", "setuser", name}
	for _, r := range rules {
		args = append(args, r)
	}
	if _, err := srv.Do(args...); err != nil {
		t.Fatal(err)
	}
}

// rediss returns a client built the way an operator would: from a
// rediss://user:password@host:port/db URL, trusting the test CA.
func rediss(t *testing.T, srv *redistest.TLSServer, user, password string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(fmt.Sprintf("rediss://%s:%s@%s/0", user, password, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	if opt.TLSConfig == nil {
		t.Fatal("redis.ParseURL gave no TLS config for rediss://")
	}
	opt.TLSConfig.RootCAs = srv.Certs().CA
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func tlsStore(t *testing.T, c redisstore.Client) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestTLSAndACL(t *testing.T) {
	srv := redistest.StartTLS(t)
	if got := "ACL SETUSER fleet " + strings.Join(aclRules("fleetrate:*", fleetCommands), " "); got != scriptACL {
		t.Fatalf("the tested ACL line\n%s\ndiffers from scriptACL\n%s", got, scriptACL)
	}
	setUser(t, srv, "fleet", aclRules("fleetrate:*", fleetCommands))
	// The conformance suite names its keys fleetrate:storetest:*.
	setUser(t, srv, "conformance", aclRules("fleetrate:storetest:*", append(append(slices.Clone(fleetCommands), permitRules...), quotaRules...)))

	t.Run("ConformanceOverTLSAsACLUser", func(t *testing.T) {
		s := tlsStore(t, rediss(t, srv, "conformance", "secret"))
		storetest.Run(t, func(*testing.T) fleetrate.Store { return s })
	})

	t.Run("LimiterThroughRedissURL", func(t *testing.T) {
		ctx := context.Background()
		s := tlsStore(t, rediss(t, srv, "fleet", "secret"))
		if err := s.LoadScripts(ctx); err != nil {
			t.Fatal(err)
		}
		lim, err := fleetrate.New(s, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.Every(time.Minute, 3)}})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if res, err := lim.Allow(ctx, "tls"); err != nil || !res.Allowed {
				t.Fatalf("take %d: %+v, %v", i, res, err)
			}
		}
		if res, err := lim.Allow(ctx, "tls"); err != nil || res.Allowed {
			t.Fatalf("fourth take: %+v, %v; want a denial", res, err)
		}
		if _, ok, err := s.State(ctx, "fleetrate:tls"); err != nil || !ok {
			t.Fatalf("State: %v, %v", ok, err)
		}
		if err := lim.RefundN(ctx, fleetrate.Result{Allowed: true, N: 3, At: time.Now()}, 3, "tls"); err != nil { // refills to full: DEL in the script
			t.Fatal(err)
		}
		if err := lim.Drain(ctx, time.Second, "tls"); err != nil {
			t.Fatal(err)
		}
		if err := lim.Reset(ctx, "tls"); err != nil {
			t.Fatal(err)
		}
		// An empty script cache makes the store fall back to EVAL.
		if _, err := srv.Do("script", "flush"); err != nil {
			t.Fatal(err)
		}
		if res, err := lim.Allow(ctx, "tls"); err != nil || !res.Allowed {
			t.Fatalf("after SCRIPT FLUSH: %+v, %v", res, err)
		}
	})

	t.Run("DeniedKeyIsAStoreError", func(t *testing.T) {
		s := tlsStore(t, rediss(t, srv, "fleet", "secret"))
		lim, err := fleetrate.New(s, fleetrate.Config{Prefix: "other:", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}})
		if err != nil {
			t.Fatal(err)
		}
		res, err := lim.Allow(context.Background(), "k")
		if !errors.Is(err, fleetrate.ErrStoreUnavailable) || !strings.Contains(err.Error(), "NOPERM") || res.Allowed {
			t.Fatalf("take on a key outside the user's pattern: %+v, %v; want ErrStoreUnavailable naming NOPERM", res, err)
		}
		t.Logf("denied: %v", err)
	})

	t.Run("EveryCommandIsNeeded", func(t *testing.T) {
		for _, missing := range append([]string{""}, fleetCommands...) {
			name := strings.TrimPrefix(missing, "+")
			if name == "" {
				name = "none"
			}
			t.Run("without_"+name, func(t *testing.T) {
				user := "min_" + strings.ReplaceAll(name, "|", "_")
				setUser(t, srv, user, aclRules("fleetrate:*", slices.DeleteFunc(slices.Clone(fleetCommands), func(c string) bool { return c == missing })))
				s := tlsStore(t, rediss(t, srv, user, "secret"))
				failed := exerciseStore(t, srv, s, "fleetrate:min/"+name)
				if missing == "" {
					if len(failed) > 0 {
						t.Fatalf("with every command allowed, these failed: %v", failed)
					}
					if logged := aclLogged(t, srv, user); len(logged) > 0 {
						t.Fatalf("with every command allowed, ACL LOG recorded refusals of %v", logged)
					}
					return
				}
				if len(failed) == 0 {
					t.Fatalf("nothing failed without %s: it is not needed", missing)
				}
				for op, err := range failed {
					// A command the client sends is refused with NOPERM; one
					// called inside a script fails the script with "can't
					// run this command", and ACL LOG names it.
					if !errors.Is(err, fleetrate.ErrStoreUnavailable) ||
						!strings.Contains(err.Error(), "NOPERM") && !strings.Contains(err.Error(), "can't run this command") {
						t.Errorf("%s without %s: %v; want ErrStoreUnavailable naming the ACL refusal", op, missing, err)
					}
				}
				if logged := aclLogged(t, srv, user); !slices.Contains(logged, strings.TrimPrefix(missing, "+")) {
					t.Errorf("ACL LOG names %v for %s, want %s", logged, user, missing)
				}
				t.Logf("without %s: %d operation(s) fail, e.g. %v", missing, len(failed), firstErr(failed))
			})
		}
	})

	t.Run("WrongPasswordIsAStoreError", func(t *testing.T) {
		s := tlsStore(t, rediss(t, srv, "fleet", "wrong"))
		_, err := s.Take(context.Background(), fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "fleetrate:pw", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}}}, N: 1})
		if !errors.Is(err, fleetrate.ErrStoreUnavailable) || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Fatalf("wrong password: %v; want ErrStoreUnavailable naming WRONGPASS", err)
		}
	})

	t.Run("PlainTCPIsRefused", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
		defer c.Close()
		if err := c.Ping(context.Background()).Err(); err == nil {
			t.Fatal("a plain-text PING to the TLS-only server succeeded")
		}
	})
}

// exerciseStore runs every operation fleetrate performs on key and returns
// the failures by operation.
func exerciseStore(t *testing.T, srv *redistest.TLSServer, s *redisstore.Store, key string) map[string]error {
	t.Helper()
	ctx := context.Background()
	lim := []fleetrate.Limit{fleetrate.Every(time.Minute, 5)}
	b := []fleetrate.Bucket{{Key: key, Limits: lim}}
	take := func() error {
		_, err := s.Take(ctx, fleetrate.Request{Buckets: b, N: 1})
		return err
	}
	failed := map[string]error{}
	for _, op := range []struct {
		name string
		fn   func() error
	}{
		{"LoadScripts", func() error { return s.LoadScripts(ctx) }},
		{"Take", take},
		{"State", func() error { _, _, err := s.State(ctx, key); return err }},
		{"Refund", func() error { return s.Refund(ctx, b, 5, time.Now()) }}, // back to full: the script deletes the key
		{"Drain", func() error { return s.Drain(ctx, b, time.Second) }},
		{"Reset", func() error { return s.Reset(ctx, key) }},
		{"ConcurrentTakes", func() error {
			// Takes made while others are in flight share a batch call.
			for range 20 {
				errs := make([]error, 16)
				var wg sync.WaitGroup
				for i := range errs {
					wg.Go(func() { errs[i] = take() })
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					return err
				}
			}
			return s.Reset(ctx, key)
		}},
		{"TakeAfterScriptFlush", func() error {
			if _, err := srv.Do("script", "flush"); err != nil {
				t.Fatal(err)
			}
			return take()
		}},
	} {
		if err := op.fn(); err != nil {
			failed[op.name] = err
		}
	}
	return failed
}

func firstErr(m map[string]error) string {
	for op, err := range m {
		return op + ": " + err.Error()
	}
	return ""
}

// aclLogged returns the objects (commands or keys) ACL LOG recorded as
// refused for user.
func aclLogged(t *testing.T, srv *redistest.TLSServer, user string) []string {
	t.Helper()
	v, err := srv.Do("acl", "log", 100)
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := v.([]any)
	var objs []string
	for _, e := range entries {
		m, _ := e.(map[any]any)
		if m["username"] == user {
			if o, ok := m["object"].(string); ok {
				objs = append(objs, o)
			}
			t.Logf("ACL LOG: reason=%v context=%v object=%v", m["reason"], m["context"], m["object"])
		}
	}
	return objs
}
