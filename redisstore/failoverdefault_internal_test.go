package redisstore

import (
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
)

// TestFailoverDefault checks which clients get EmptyAfterFailover without
// asking: a *redis.Client, plain or Sentinel's, unless KeepAfterFailover;
// never a Cluster or a Ring.
func TestFailoverDefault(t *testing.T) {
	plain := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	sentinel := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}})
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { plain.Close(); sentinel.Close(); cluster.Close(); ring.Close() })
	for _, tc := range []struct {
		name    string
		c       Client
		opts    Options
		guarded bool
	}{
		{"plain", plain, Options{}, true},
		{"sentinel", sentinel, Options{}, true},
		{"sentinel, KeepAfterFailover", sentinel, Options{KeepAfterFailover: true}, false},
		{"plain, KeepAfterFailover", plain, Options{KeepAfterFailover: true}, false},
		{"cluster", cluster, Options{}, false},
		{"ring", ring, Options{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.c, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.fo != nil; got != tc.guarded {
				t.Errorf("guarded against failovers: %v, want %v", got, tc.guarded)
			}
		})
	}
	_, err := New(sentinel, Options{EmptyAfterFailover: true, KeepAfterFailover: true})
	if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "EmptyAfterFailover") || !strings.Contains(err.Error(), "KeepAfterFailover") {
		t.Errorf("both options: %v, want ErrInvalid naming both", err)
	}
}
