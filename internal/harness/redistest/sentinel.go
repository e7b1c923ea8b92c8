package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel timings of StartSentinel: short, so that a forced failover
// completes in about a second, and long enough that a loaded test machine
// does not trigger one by mistake.
const (
	SentinelDownAfter       = 3 * time.Second
	SentinelFailoverTimeout = 6 * time.Second
)

// Sentinel is a Redis master, its replica and three Sentinels watching
// them, all real processes on loopback ports.
type Sentinel struct {
	name      string
	data      []*Server // the master and the replica as started
	sentinels []*Server

	mu      sync.Mutex
	clients []*redis.Client
}

// StartSentinel starts a master, a replica of it (--replicaof) and three
// Sentinels (redis-server <conf> --sentinel, each with its own writable
// config) monitoring the master with quorum 2. It returns once every
// Sentinel knows the master, the replica and the two other Sentinels.
// Everything is stopped when tb ends.
func StartSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	Binary(tb)
	s := &Sentinel{name: "mymaster"}
	common := []string{"--repl-diskless-sync-delay", "0"}
	master, err := launchNode(tb, tb.TempDir(), nil, func(int) ([]string, error) { return common, nil })
	if err != nil {
		tb.Fatalf("redistest: master: %v", err)
	}
	replica, err := launchNode(tb, tb.TempDir(), nil, func(int) ([]string, error) {
		return append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port())}, common...), nil
	})
	if err != nil {
		tb.Fatalf("redistest: replica: %v", err)
	}
	s.data = []*Server{master, replica}
	if err := waitFor(20*time.Second, 50*time.Millisecond, func() error { return linkUp(replica) }); err != nil {
		tb.Fatalf("redistest: replica never synced: %v\nmaster log:\n%s\nreplica log:\n%s", err, master.Log(), replica.Log())
	}
	errs := make([]error, 3)
	s.sentinels = make([]*Server, 3)
	var wg sync.WaitGroup
	for i := range s.sentinels {
		dir := tb.TempDir()
		wg.Go(func() {
			s.sentinels[i], errs[i] = launchNode(tb, dir, nil, func(port int) ([]string, error) {
				// Sentinel rewrites its config, so each has its own file,
				// written afresh for each attempt.
				conf := filepath.Join(dir, "sentinel.conf")
				err := os.WriteFile(conf, []byte(strings.Join([]string{
					"port " + strconv.Itoa(port),
					fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2", s.name, master.Port()),
					fmt.Sprintf("sentinel down-after-milliseconds %s %d", s.name, SentinelDownAfter.Milliseconds()),
					fmt.Sprintf("sentinel failover-timeout %s %d", s.name, SentinelFailoverTimeout.Milliseconds()),
					fmt.Sprintf("sentinel parallel-syncs %s 1", s.name),
				}, "\n")+"\n"), 0o600)
				return []string{conf, "--sentinel"}, err
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		tb.Fatalf("redistest: starting sentinels: %v", err)
	}
	if err := waitFor(30*time.Second, 100*time.Millisecond, s.known); err != nil {
		tb.Fatalf("redistest: sentinels never found each other: %v\n%s", err, logs(append(s.data, s.sentinels...)))
	}
	// Registered last, so it runs first: clients close before the
	// servers stop.
	tb.Cleanup(s.closeClients)
	return s
}

// linkUp checks that replica's link to its master is up.
func linkUp(replica *Server) error {
	repl, err := doString(replica.Addr(), nil, "info", "replication")
	if err != nil {
		return err
	}
	if got := infoField(repl, "master_link_status"); got != "up" {
		return fmt.Errorf("replica %s: master_link_status %q", replica.Addr(), got)
	}
	return nil
}

// known checks that every Sentinel sees the master up with one replica and
// two other Sentinels.
func (s *Sentinel) known() error {
	for _, sn := range s.sentinels {
		m, err := s.sentinelMaster(sn.Addr())
		if err != nil {
			return err
		}
		if m["flags"] != "master" || m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" {
			return fmt.Errorf("sentinel %s sees flags=%s num-slaves=%s num-other-sentinels=%s",
				sn.Addr(), m["flags"], m["num-slaves"], m["num-other-sentinels"])
		}
	}
	return nil
}

func (s *Sentinel) sentinelMaster(addr string) (map[string]string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1, DisableIdentity: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Master(ctx, s.name).Result()
}

// SentinelAddrs returns the Sentinels' addresses.
func (s *Sentinel) SentinelAddrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, sn := range s.sentinels {
		addrs[i] = sn.Addr()
	}
	return addrs
}

// Sentinels returns the Sentinel processes.
func (s *Sentinel) Sentinels() []*Server { return append([]*Server(nil), s.sentinels...) }

// MasterName returns the name the Sentinels monitor the master under.
func (s *Sentinel) MasterName() string { return s.name }

// FailoverOptions returns options for a go-redis failover client.
func (s *Sentinel) FailoverOptions() *redis.FailoverOptions {
	return &redis.FailoverOptions{MasterName: s.name, SentinelAddrs: s.SentinelAddrs()}
}

// FailoverClient returns a new go-redis failover client (redis.NewFailoverClient)
// that follows the Sentinels to the current master; it is closed when the
// test ends. Each call returns a distinct client, as distinct processes of
// a fleet would have.
func (s *Sentinel) FailoverClient() *redis.Client {
	c := redis.NewFailoverClient(s.FailoverOptions())
	s.mu.Lock()
	s.clients = append(s.clients, c)
	s.mu.Unlock()
	return c
}

func (s *Sentinel) closeClients() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.clients {
		_ = c.Close()
	}
	s.clients = nil
}

// MasterAddr returns the master's address as the first Sentinel reports it.
func (s *Sentinel) MasterAddr() (string, error) {
	return s.masterAddrFrom(s.sentinels[0].Addr())
}

func (s *Sentinel) masterAddrFrom(addr string) (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1, DisableIdentity: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hp, err := c.GetMasterAddrByName(ctx, s.name).Result()
	if err != nil {
		return "", err
	}
	if len(hp) != 2 {
		return "", fmt.Errorf("sentinel %s: GET-MASTER-ADDR-BY-NAME replied %v", addr, hp)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// Server returns the data server (master or replica) at addr, or nil.
func (s *Sentinel) Server(addr string) *Server {
	for _, d := range s.data {
		if d.Addr() == addr {
			return d
		}
	}
	return nil
}

// Servers returns the master and the replica as they were started.
func (s *Sentinel) Servers() []*Server { return append([]*Server(nil), s.data...) }

// Failover forces a failover with SENTINEL FAILOVER and returns the new
// master's address once every Sentinel reports it and it answers as a
// master. The old master is reconfigured as a replica by the Sentinels a
// few seconds later. It reports failures as errors, so it may run on any
// goroutine.
func (s *Sentinel) Failover() (string, error) {
	old, err := s.MasterAddr()
	if err != nil {
		return "", err
	}
	// The Sentinel refuses while it deems the replica unfit (NOGOODSLAVE),
	// for example just after startup; retry for a while.
	err = waitFor(20*time.Second, 200*time.Millisecond, func() error {
		_, err := do(s.sentinels[0].Addr(), nil, "sentinel", "failover", s.name)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("SENTINEL FAILOVER: %w", err)
	}
	var addr string
	err = waitFor(30*time.Second, 20*time.Millisecond, func() error {
		for _, sn := range s.sentinels {
			a, err := s.masterAddrFrom(sn.Addr())
			if err != nil {
				return err
			}
			if a == old {
				return fmt.Errorf("sentinel %s still reports master %s", sn.Addr(), old)
			}
			addr = a
		}
		role, err := do(addr, nil, "role")
		if err != nil {
			return err
		}
		if r, _ := role.([]any); len(r) == 0 || r[0] != "master" {
			return fmt.Errorf("new master %s reports role %v", addr, role)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("failover from %s: %w\n%s", old, err, logs(append(s.Servers(), s.sentinels...)))
	}
	return addr, nil
}
