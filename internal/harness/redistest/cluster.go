package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterNodeTimeout is the cluster-node-timeout of the nodes StartCluster
// starts. It is long enough that a node starved of CPU on a loaded test
// machine is not failed over by mistake.
const ClusterNodeTimeout = 5 * time.Second

// Cluster is a Redis Cluster of real redis-server processes on loopback
// ports, built with redis-cli --cluster create.
type Cluster struct {
	nodes []*Node

	mu     sync.Mutex
	client *redis.ClusterClient
}

// Node is one node of a Cluster.
type Node struct {
	*Server
	// ID is the node's cluster ID.
	ID string
	// MasterID is, for a replica, the ID of its master; empty for a master.
	MasterID string
}

// IsMaster reports whether the node was a master when the cluster was
// built.
func (n *Node) IsMaster() bool { return n.MasterID == "" }

// StartCluster starts masters × (1 + replicasPerMaster) cluster-enabled
// redis-servers, joins them with redis-cli --cluster create, and waits
// until every node reports cluster_state:ok, all 16384 slots are covered,
// every node agrees on which master serves which slot, and every replica's
// link to its master is up. Everything is stopped when tb ends.
func StartCluster(tb testing.TB, masters, replicasPerMaster int) *Cluster {
	tb.Helper()
	if masters < 3 {
		tb.Fatalf("redistest: a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	Binary(tb)
	lookBinary(tb, "redis-cli")
	c := &Cluster{}
	servers := startClusterNodes(tb, masters*(1+replicasPerMaster))
	args := []string{"--cluster", "create"}
	for _, s := range servers {
		args = append(args, s.Addr())
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	if _, err := redisCLI(60*time.Second, args...); err != nil {
		tb.Fatalf("redistest: %v\nnode logs:\n%s", err, logs(servers))
	}
	for _, s := range servers {
		c.nodes = append(c.nodes, &Node{Server: s})
	}
	err := waitFor(30*time.Second, 100*time.Millisecond, func() error {
		if err := c.identify(masters); err != nil {
			return err
		}
		return c.healthy()
	})
	if err != nil {
		tb.Fatalf("redistest: cluster not healthy after create: %v\nnode logs:\n%s", err, logs(servers))
	}
	tb.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.client != nil {
			_ = c.client.Close()
		}
	})
	return c
}

// startClusterNodes starts n cluster-enabled redis-servers, not yet joined.
func startClusterNodes(tb testing.TB, n int) []*Server {
	tb.Helper()
	servers := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range servers {
		dir := tb.TempDir()
		wg.Go(func() {
			servers[i], errs[i] = launchNode(tb, dir, nil, func(port int) ([]string, error) {
				// The cluster bus gets a free port of its own: the default,
				// port + 10000, may be taken or beyond 65535.
				bus, err := freePort()
				if err != nil {
					return nil, err
				}
				return []string{
					"--cluster-enabled", "yes",
					"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", port),
					"--cluster-node-timeout", strconv.Itoa(int(ClusterNodeTimeout / time.Millisecond)),
					"--cluster-port", strconv.Itoa(bus),
					"--repl-diskless-sync-delay", "0",
				}, nil
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		tb.Fatalf("redistest: starting cluster nodes: %v", err)
	}
	return servers
}

func logs(servers []*Server) string {
	var b strings.Builder
	for _, s := range servers {
		fmt.Fprintf(&b, "== %s ==\n%s\n", s.Addr(), s.Log())
	}
	return b.String()
}

// identify fills in each node's ID and role from the "myself" line of its
// own CLUSTER NODES, which is authoritative (the others learn it by
// gossip), and checks that there are as many masters as asked for.
func (c *Cluster) identify(masters int) error {
	n := 0
	for _, node := range c.nodes {
		out, err := doString(node.Addr(), nil, "cluster", "nodes")
		if err != nil {
			return err
		}
		node.ID, node.MasterID = "", ""
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 8 || !strings.Contains(f[2], "myself") {
				continue
			}
			node.ID = f[0]
			if strings.Contains(f[2], "slave") {
				node.MasterID = f[3]
			} else {
				n++
			}
		}
		if node.ID == "" {
			return fmt.Errorf("node %s has no myself line in CLUSTER NODES:\n%s", node.Addr(), out)
		}
	}
	if n != masters {
		return fmt.Errorf("%d masters, want %d", n, masters)
	}
	return nil
}

// WaitHealthy waits until every node reports cluster_state:ok with all
// slots served, every node agrees on the master of every slot, and every
// replica's link to its master is up.
func (c *Cluster) WaitHealthy(timeout time.Duration) error {
	return waitFor(timeout, 100*time.Millisecond, c.healthy)
}

func (c *Cluster) healthy() error {
	var want string
	for _, n := range c.nodes {
		info, err := doString(n.Addr(), nil, "cluster", "info")
		if err != nil {
			return fmt.Errorf("%s: %w", n.Addr(), err)
		}
		for field, v := range map[string]string{
			"cluster_state":       "ok",
			"cluster_slots_ok":    "16384",
			"cluster_known_nodes": strconv.Itoa(len(c.nodes)),
		} {
			if got := infoField(info, field); got != v {
				return fmt.Errorf("%s: %s is %q, want %q", n.Addr(), field, got, v)
			}
		}
		view, err := slotView(n.Addr())
		if err != nil {
			return fmt.Errorf("%s: %w", n.Addr(), err)
		}
		if want == "" {
			want = view
		} else if view != want {
			return fmt.Errorf("nodes disagree on slots: %s sees %s, %s sees %s", c.nodes[0].Addr(), want, n.Addr(), view)
		}
		if !n.IsMaster() {
			repl, err := doString(n.Addr(), nil, "info", "replication")
			if err != nil {
				return fmt.Errorf("%s: %w", n.Addr(), err)
			}
			if got := infoField(repl, "master_link_status"); got != "up" {
				return fmt.Errorf("replica %s: master_link_status %q", n.Addr(), got)
			}
		}
	}
	return nil
}

// slotView returns a node's view (CLUSTER SHARDS) of which master serves
// each slot range, as a canonical string.
func slotView(addr string) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DisableIdentity: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	shards, err := c.ClusterShards(ctx).Result()
	if err != nil {
		return "", err
	}
	var parts []string
	for _, sh := range shards {
		master := ""
		for _, n := range sh.Nodes {
			if n.Role == "master" {
				master = net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
			}
		}
		for _, r := range sh.Slots {
			if master == "" {
				return "", fmt.Errorf("slots %d-%d have no master", r.Start, r.End)
			}
			parts = append(parts, fmt.Sprintf("%d-%d:%s", r.Start, r.End, master))
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ","), nil
}

// Nodes returns every node, masters and replicas.
func (c *Cluster) Nodes() []*Node { return slices.Clone(c.nodes) }

// Masters returns the nodes that were masters when the cluster was built.
func (c *Cluster) Masters() []*Node {
	var ms []*Node
	for _, n := range c.nodes {
		if n.IsMaster() {
			ms = append(ms, n)
		}
	}
	return ms
}

// Addrs returns the address of every node, the seeds for a Cluster client.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Client returns a go-redis Cluster client over the cluster, closed when
// the test ends.
func (c *Cluster) Client() *redis.ClusterClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client == nil {
		c.client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	}
	return c.client
}

// KeySlot returns the hash slot of key as the server computes it (CLUSTER
// KEYSLOT).
func (c *Cluster) KeySlot(key string) (int, error) {
	v, err := do(c.nodes[0].Addr(), nil, "cluster", "keyslot", key)
	if err != nil {
		return 0, err
	}
	n, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("CLUSTER KEYSLOT replied %T", v)
	}
	return int(n), nil
}

// SlotOwner returns the master that claims slot, asking each master about
// its own slots (a master's claim on itself is authoritative; the others
// learn of it by gossip).
func (c *Cluster) SlotOwner(slot int) (*Node, error) {
	for _, n := range c.Masters() {
		own, err := ownSlots(n.Addr())
		if err != nil {
			return nil, err
		}
		if own[slot] {
			return n, nil
		}
	}
	return nil, fmt.Errorf("no master claims slot %d", slot)
}

// ownSlots parses the "myself" line of a node's CLUSTER NODES.
func ownSlots(addr string) (map[int]bool, error) {
	out, err := doString(addr, nil, "cluster", "nodes")
	if err != nil {
		return nil, err
	}
	own := map[int]bool{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !strings.Contains(f[2], "myself") {
			continue
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being imported or migrated
			}
			lo, hi, isRange := strings.Cut(r, "-")
			a, err := strconv.Atoi(lo)
			if err != nil {
				return nil, fmt.Errorf("CLUSTER NODES slot %q: %w", r, err)
			}
			b := a
			if isRange {
				if b, err = strconv.Atoi(hi); err != nil {
					return nil, fmt.Errorf("CLUSTER NODES slot %q: %w", r, err)
				}
			}
			for s := a; s <= b; s++ {
				own[s] = true
			}
		}
	}
	return own, nil
}

// MigrateSlot moves slot, with its keys, to the master to, the way
// redis-cli --cluster reshard moves one slot: SETSLOT IMPORTING on the
// target, SETSLOT MIGRATING on the source, MIGRATE of every key, then
// SETSLOT NODE on both and on the other masters. For hold after the keys
// have moved, the slot stays in the migrating state, so clients meet ASK
// redirects; afterwards they meet MOVED until they refresh their slot map.
// It returns when the cluster is healthy again. It is safe to call from
// any goroutine; it reports failures as errors.
func (c *Cluster) MigrateSlot(slot int, to *Node, hold time.Duration) error {
	from, err := c.SlotOwner(slot)
	if err != nil {
		return err
	}
	if from == to {
		return fmt.Errorf("slot %d is already on %s", slot, to.Addr())
	}
	step := func(addr string, args ...any) error {
		if _, err := do(addr, nil, args...); err != nil {
			return fmt.Errorf("migrating slot %d from %s to %s: %s: %v: %w", slot, from.Addr(), to.Addr(), addr, args, err)
		}
		return nil
	}
	if err := step(to.Addr(), "cluster", "setslot", slot, "importing", from.ID); err != nil {
		return err
	}
	if err := step(from.Addr(), "cluster", "setslot", slot, "migrating", to.ID); err != nil {
		return err
	}
	for {
		v, err := do(from.Addr(), nil, "cluster", "getkeysinslot", slot, 100)
		if err != nil {
			return fmt.Errorf("migrating slot %d: GETKEYSINSLOT: %w", slot, err)
		}
		keys, _ := v.([]any)
		if len(keys) == 0 {
			break
		}
		args := []any{"migrate", "127.0.0.1", to.Port(), "", 0, 5000, "keys"}
		args = append(args, keys...)
		if err := step(from.Addr(), args...); err != nil {
			return err
		}
	}
	time.Sleep(hold)
	if err := step(to.Addr(), "cluster", "setslot", slot, "node", to.ID); err != nil {
		return err
	}
	if err := step(from.Addr(), "cluster", "setslot", slot, "node", to.ID); err != nil {
		return err
	}
	for _, m := range c.Masters() {
		if m != from && m != to {
			if err := step(m.Addr(), "cluster", "setslot", slot, "node", to.ID); err != nil {
				return err
			}
		}
	}
	return c.WaitHealthy(30 * time.Second)
}

// Reshard moves slots slots from one master to another with
// redis-cli --cluster reshard, keys included, and waits until the cluster
// is healthy again. It reports failures as errors.
func (c *Cluster) Reshard(from, to *Node, slots int) error {
	if _, err := redisCLI(120*time.Second, "--cluster", "reshard", from.Addr(),
		"--cluster-from", from.ID, "--cluster-to", to.ID,
		"--cluster-slots", strconv.Itoa(slots), "--cluster-yes"); err != nil {
		return err
	}
	return c.WaitHealthy(30 * time.Second)
}

// Errorstats returns a node's INFO errorstats counts by error prefix,
// such as "MOVED" and "ASK": the redirects the node answered.
func (n *Node) Errorstats() (map[string]int, error) {
	return statCounts(n.Addr(), "errorstats", "errorstat_", "count")
}

// Commandstats returns a node's INFO commandstats call counts by command,
// such as "evalsha" and "asking".
func (n *Node) Commandstats() (map[string]int, error) {
	return statCounts(n.Addr(), "commandstats", "cmdstat_", "calls")
}

func statCounts(addr, section, prefix, field string) (map[string]int, error) {
	info, err := doString(addr, nil, "info", section)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, prefix) {
			continue
		}
		for kv := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(kv, field+"="); ok {
				out[strings.TrimPrefix(name, prefix)], _ = strconv.Atoi(v)
			}
		}
	}
	return out, nil
}
