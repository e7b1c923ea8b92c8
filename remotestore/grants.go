package remotestore

import (
	"encoding/binary"
	"strings"
	"sync"

	"github.com/fleetrate/fleetrate"
)

// maxGrants bounds the grants a Store remembers: beyond, the oldest is
// forgotten, and a refund or cancel of its take goes without one (the
// service then asks for the admin scope).
const maxGrants = 16384

// Kinds of grants, as the key of grantBook says.
const (
	grantRefund = 'r'
	grantCancel = 'c'
	grantSettle = 's'
)

// grantBook remembers the signed grants the service issued with takes
// (wire.Result.Grant, wire.Booking.Grant), by what a later Refund or
// Cancel names of the take: its buckets' store keys and its time or
// booking stamp. fleetrate.Store's Refund and Cancel carry no grant, and
// the service gives back only what it can see it granted.
type grantBook struct {
	mu    sync.Mutex
	byKey map[string]string
	ring  []string // keys in the order they came, for eviction
	next  int
}

func grantKey(kind byte, bs []fleetrate.Bucket, at int64) string {
	var b strings.Builder
	b.WriteByte(kind)
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(at))
	b.Write(n[:])
	for _, bk := range bs {
		binary.BigEndian.PutUint64(n[:], uint64(len(bk.Prefix)+len(bk.Key)))
		b.Write(n[:])
		b.WriteString(bk.Prefix)
		b.WriteString(bk.Key)
	}
	return b.String()
}

// put remembers grant under key, forgetting the oldest beyond maxGrants.
func (g *grantBook) put(key, grant string) {
	if grant == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.byKey == nil {
		g.byKey = make(map[string]string)
	}
	if len(g.ring) < maxGrants {
		g.ring = append(g.ring, key)
	} else {
		delete(g.byKey, g.ring[g.next])
		g.ring[g.next] = key
		g.next = (g.next + 1) % maxGrants
	}
	g.byKey[key] = grant
}

// take returns and forgets the grant under key ("" if none): the service
// honours a grant once.
func (g *grantBook) take(key string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	grant := g.byKey[key]
	delete(g.byKey, key)
	return grant
}
