// Package doccheck holds tests that hold the documentation to the code:
// the ACL line docs/OPERATIONS.md gives operators, the packages
// docs/ARCHITECTURE.md names, and the Go examples of the docs.
package doccheck

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/transport"
)

// refRoot is the module's root, seen from this package's directory.
const refRoot = "../.."

// readRefDoc returns the text of the repository file at rel.
func readRefDoc(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(refRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// documentedACLs returns the standalone and the Cluster ACL lines of
// docs/OPERATIONS.md, "The minimal ACL user".
func documentedACLs(t *testing.T) (standalone, cluster string) {
	t.Helper()
	doc := readRefDoc(t, "docs/OPERATIONS.md")
	i := strings.Index(doc, "#### The minimal ACL user")
	if i < 0 {
		t.Fatal(`docs/OPERATIONS.md has no "#### The minimal ACL user" section`)
	}
	end := strings.Index(doc[i+1:], "\n#### ")
	if end < 0 {
		end = len(doc) - i - 1
	}
	lines := regexp.MustCompile(`(?m)^ACL SETUSER fleet .*$`).FindAllString(doc[i:i+1+end], -1)
	if len(lines) != 2 {
		t.Fatalf("want two ACL SETUSER lines (standalone, Cluster) in the section, got %d: %q", len(lines), lines)
	}
	return lines[0], lines[1]
}

// TestDocumentedACL creates the user of the documented ACL line on a real
// redis-server and makes, as that user, every call the library makes:
// each must succeed, Redis must refuse nothing (ACL LOG stays empty), and
// each command the line allows must have been run, so that the line holds
// neither too little nor too much.
func TestDocumentedACL(t *testing.T) {
	line, clusterLine := documentedACLs(t)
	if want := line + " +cluster|slots +command"; clusterLine != want {
		t.Errorf("the Cluster ACL line\n%s\nis not the standalone one plus +cluster|slots +command:\n%s", clusterLine, want)
	}
	fields := strings.Fields(line)
	if len(fields) < 4 || fields[2] != "fleet" {
		t.Fatalf("unexpected ACL line %q", line)
	}
	rules := fields[3:]
	var cmds []string
	channel := ""
	for _, r := range rules {
		switch {
		case strings.HasPrefix(r, "+"):
			cmds = append(cmds, r[1:])
		case strings.HasPrefix(r, "&"):
			channel = r[1:]
		}
	}
	if channel != transport.AnnounceTopic {
		t.Errorf("the ACL line allows channel %q; transports announce on %q", channel, transport.AnnounceTopic)
	}

	srv := redistest.Start(t)
	args := []any{"acl", "setuser", "fleet"}
	for _, r := range rules {
		args = append(args, r)
	}
	if _, err := srv.Do(args...); err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	password := ""
	for _, r := range rules {
		if strings.HasPrefix(r, ">") {
			password = r[1:]
		}
	}
	if _, err := srv.Do("config", "resetstat"); err != nil {
		t.Fatal(err)
	}
	opt, err := redis.ParseURL(fmt.Sprintf("redis://fleet:%s@%s/0", password, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(redisstore.ClientOptions(opt))
	t.Cleanup(func() { _ = c.Close() })
	// EmptyAfterFailover puts the failover guard, and its INFO, in front
	// of every script; fleetrate serve turns it on for Sentinel URLs.
	s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second, EmptyAfterFailover: true, ListenCheck: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stats := &aclCommandStats{srv: srv}
	aclCalls(t, srv, s, stats)
	announceAndListen(t, srv, s)

	if refused := aclRefusals(t, srv); len(refused) > 0 {
		t.Errorf("Redis refused the documented user %v (ACL LOG)", refused)
	}
	ran := stats.read(t)
	for _, cmd := range cmds {
		if ran[cmd] == 0 {
			t.Errorf("the ACL line allows +%s, but no call ran it (commandstats %v)", cmd, ran)
		}
	}
}

// aclCalls makes, through s, every call of a Limiter's store but the
// announcements, and fails t on any error.
func aclCalls(t *testing.T, srv *redistest.Server, s *redisstore.Store, stats *aclCommandStats) {
	t.Helper()
	ctx := context.Background()
	b := []fleetrate.Bucket{{Prefix: "fleetrate:", Key: "doc/acl", Limits: []fleetrate.Limit{fleetrate.PerSecond(100, 50)}}}
	must := func(op string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s as the documented ACL user: %v", op, err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	must("Warm", s.Warm(wctx))
	cancel()
	must("LoadScripts", s.LoadScripts(ctx))
	res, err := s.Take(ctx, fleetrate.Request{Buckets: b, N: 1})
	must("Take", err)
	must("Refund", s.Refund(ctx, b, 1, res.At))
	var bk fleetrate.Booking
	_, err = s.Take(ctx, fleetrate.Request{Buckets: b, N: 40, MaxWait: time.Second, Booking: &bk})
	must("Take with a booking", err)
	must("Cancel", s.Cancel(ctx, b, 40, bk))
	must("Drain", s.Drain(ctx, b, time.Millisecond))
	_, _, err = s.State(ctx, b[0].StoreKey())
	must("State", err)
	must("Reset", s.Reset(ctx, b[0].StoreKey()))
	// Takes made while others are in flight share a call of the batch
	// script, which reads its buckets with MGET.
	for round := 0; stats.read(t)["mget"] == 0; round++ {
		if round == 200 {
			t.Fatal("200 rounds of 16 concurrent takes never shared a batch call")
		}
		errs := make([]error, 16)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() {
				_, errs[i] = s.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{{Prefix: "fleetrate:", Key: "doc/batch/" + strconv.Itoa(i%4), Limits: b[0].Limits}}, N: 1})
			})
		}
		wg.Wait()
		must("concurrent takes", errors.Join(errs...))
	}
	// An empty script cache makes the store fall back to EVAL.
	if _, err := srv.Do("script", "flush"); err != nil {
		t.Fatal(err)
	}
	_, err = s.Take(ctx, fleetrate.Request{Buckets: b, N: 1})
	must("Take after SCRIPT FLUSH", err)
}

// announceAndListen listens on the transports' channel through s, as a
// transport does, announces on it, and waits for the message and for
// Listen's ping of its quiet subscription.
func announceAndListen(t *testing.T, srv *redistest.Server, s *redisstore.Store) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	heard := make(chan string, 1)
	on := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- s.Listen(ctx, transport.AnnounceTopic, func(msg string) {
			select {
			case heard <- msg:
			default:
			}
		}, func(listening bool) {
			if listening {
				select {
				case on <- struct{}{}:
				default:
				}
			}
		})
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Listen: %v", err)
		}
	}()
	deadline := time.After(10 * time.Second)
	select {
	case <-on:
	case <-deadline:
		t.Fatalf("Listen never subscribed as the documented ACL user; ACL LOG: %v", aclRefusals(t, srv))
	}
	if err := s.Announce(ctx, transport.AnnounceTopic, "p doc 1"); err != nil {
		t.Fatalf("Announce as the documented ACL user: %v", err)
	}
	select {
	case msg := <-heard:
		if msg != "p doc 1" {
			t.Fatalf("heard %q, want %q", msg, "p doc 1")
		}
	case <-deadline:
		t.Fatal("the announcement was never heard")
	}
	// A quiet subscription is pinged every ListenCheck: wait until the
	// subscriber's connection has sent its PING.
	for {
		v, err := srv.Do("client", "list", "type", "pubsub")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(fmt.Sprint(v), "cmd=ping") {
			return
		}
		select {
		case <-deadline:
			t.Fatalf("Listen never pinged its quiet subscription; CLIENT LIST: %v; ACL LOG: %v", v, aclRefusals(t, srv))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// aclCommandStats reads the server's INFO commandstats, less the INFO
// commands it sent itself.
type aclCommandStats struct {
	srv   *redistest.Server
	reads int
}

var aclCmdstat = regexp.MustCompile(`(?m)^cmdstat_([a-z|]+):calls=(\d+)`)

// read returns the calls of each command since the test's CONFIG
// RESETSTAT (subcommands as "script|load").
func (c *aclCommandStats) read(t *testing.T) map[string]int {
	t.Helper()
	v, err := c.srv.Do("info", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	for _, m := range aclCmdstat.FindAllStringSubmatch(fmt.Sprint(v), -1) {
		n, _ := strconv.Atoi(m[2])
		calls[m[1]] = n
	}
	// Redis counts an INFO once it has answered, so this read is not in
	// its own answer: the earlier ones are.
	calls["info"] -= c.reads
	c.reads++
	return calls
}

// aclRefusals returns what ACL LOG recorded as refused: the command, key or
// channel, with its context.
func aclRefusals(t *testing.T, srv *redistest.Server) []string {
	t.Helper()
	v, err := srv.Do("acl", "log", 100)
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := v.([]any)
	var refused []string
	for _, e := range entries {
		m, _ := e.(map[any]any)
		refused = append(refused, fmt.Sprintf("%v %v (%v, %v)", m["username"], m["object"], m["reason"], m["context"]))
	}
	return refused
}
