package statuspage

import (
	"cmp"
	"context"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetrate/fleetrate"
)

// Bounds of the denied-key window.
const (
	// DeniedWindow is how far back TopDenied looks: six slots of ten
	// seconds, so between 50 and 60 seconds.
	DeniedWindow = time.Minute
	slotSeconds  = 10
	slots        = 6
	// maxSlotKeys bounds the distinct keys one shard remembers per slot;
	// denials of further keys are counted as overflow only.
	maxSlotKeys = 512
	shards      = 8
)

// Counter counts the decisions of the stores it wraps, for a Page. A
// decision costs one or two uncontended atomic additions per bucket and a
// map lookup; a denial also a short, sharded critical section to remember
// the key for the top denied keys. Peeks (a take of 0 tokens) are not
// counted. A Counter is safe for concurrent use; the zero value is not:
// use NewCounter.
type Counter struct {
	errs atomic.Int64
	// other counts the buckets the Page does not track, striped by key
	// so that goroutines taking from different keys do not share a
	// cache line.
	other [otherStripes]counts
	// tracked maps prefix to key to the counts of each bucket the page
	// shows. It is replaced whole (copy on write) when the page's buckets
	// change, so the decision path reads it without a lock.
	tracked atomic.Pointer[map[string]map[string]*counts]
	trackMu sync.Mutex
	keys    [shards]deniedShard
	seed    maphash.Seed
	now     func() time.Time
}

// otherStripes is the number of stripes of Counter.other.
const otherStripes = 16

// counts are the decisions and denials of one bucket. extra counts the
// decisions it took part in as the second or later bucket of a take, so
// that totals count a take of several buckets once while a take of one
// bucket costs a single addition. The padding keeps two hot buckets off
// one cache line.
type counts struct {
	decisions, denied, extra atomic.Int64
	_                        [40]byte
}

type deniedShard struct {
	mu    sync.Mutex
	slots [slots]deniedSlot
	_     [40]byte
}

// deniedSlot counts denials by the 64-bit hash of prefix and key, hashed
// once per denial (two keys sharing a hash, at odds of 2^-64, would be
// counted as the first).
type deniedSlot struct {
	epoch    int64
	keys     map[uint64]*deniedCount
	overflow int64
}

type deniedCount struct {
	key storeKey
	n   int64
}

type storeKey struct{ prefix, key string }

// NewCounter returns a Counter that tracks no bucket yet.
func NewCounter() *Counter {
	c := &Counter{seed: maphash.MakeSeed(), now: time.Now}
	empty := map[string]map[string]*counts{}
	c.tracked.Store(&empty)
	return c
}

// Wrap returns store with every take it decides counted by c. The
// returned store keeps store's optional methods that Limiters use
// (fleetrate.Binder, fleetrate.MultiClock), so wrapping keeps the
// Limiter's fast path, and unwraps to store (an Unwrap() fleetrate.Store
// method), so a transport over it still finds store's Announcer.
func (c *Counter) Wrap(store fleetrate.Store) fleetrate.Store {
	s := &counted{Store: store, c: c}
	if b, ok := store.(fleetrate.Binder); ok {
		return &countedBinder{counted: s, b: b}
	}
	return s
}

// track makes c count each of buckets on its own from now on. Counts of a
// bucket already tracked are kept.
func (c *Counter) track(buckets []fleetrate.Bucket) {
	cur := *c.tracked.Load()
	missing := false
	for _, b := range buckets {
		if _, ok := cur[b.Prefix][b.Key]; !ok {
			missing = true
			break
		}
	}
	if !missing {
		return
	}
	c.trackMu.Lock()
	defer c.trackMu.Unlock()
	cur = *c.tracked.Load()
	next := make(map[string]map[string]*counts, len(cur)+1)
	for p, m := range cur {
		next[p] = make(map[string]*counts, len(m))
		for k, v := range m {
			next[p][k] = v
		}
	}
	for _, b := range buckets {
		if next[b.Prefix] == nil {
			next[b.Prefix] = map[string]*counts{}
		}
		if next[b.Prefix][b.Key] == nil {
			next[b.Prefix][b.Key] = &counts{}
		}
	}
	c.tracked.Store(&next)
}

// bucket returns the counts of a tracked bucket, or a stripe of all the
// others.
func (c *Counter) bucket(prefix, key string) *counts {
	if n, ok := (*c.tracked.Load())[prefix][key]; ok {
		return n
	}
	return &c.other[maphash.String(c.seed, key)%otherStripes]
}

// record counts one take of buckets that the store answered with res.
func (c *Counter) record(buckets []fleetrate.Bucket, res fleetrate.Result, err error) {
	if err != nil {
		c.errs.Add(1)
		return
	}
	for i := range buckets {
		n := c.bucket(buckets[i].Prefix, buckets[i].Key)
		n.decisions.Add(1)
		if i > 0 {
			n.extra.Add(1)
		}
		if !res.Allowed && i == res.Bucket {
			n.denied.Add(1)
			c.deny(buckets[i].Prefix, buckets[i].Key, res.At)
		}
	}
}

// recordKey is record for a take of one bucket through a bound taker. It
// takes the result by pointer so that the taker's frame holds no copy of
// it.
func (c *Counter) recordKey(prefix, key string, res *fleetrate.Result, err error) {
	if err != nil {
		c.errs.Add(1)
		return
	}
	n := c.bucket(prefix, key)
	n.decisions.Add(1)
	if !res.Allowed {
		n.denied.Add(1)
		c.deny(prefix, key, res.At)
	}
}

// totals sums the counts of every bucket: takes, denied takes and the
// decisions and denials of the buckets not tracked.
func (c *Counter) totals() (takes, denied, otherDecisions, otherDenied int64) {
	for i := range c.other {
		o := &c.other[i]
		takes += o.decisions.Load() - o.extra.Load()
		otherDecisions += o.decisions.Load()
		otherDenied += o.denied.Load()
	}
	denied = otherDenied
	for _, m := range *c.tracked.Load() {
		for _, n := range m {
			takes += n.decisions.Load() - n.extra.Load()
			denied += n.denied.Load()
		}
	}
	return takes, denied, otherDecisions, otherDenied
}

// deny remembers one denial of key in the ten-second slot of at, the
// store's time of the decision (the Counter's clock if the store gave
// none).
func (c *Counter) deny(prefix, key string, at time.Time) {
	if at.IsZero() {
		at = c.now()
	}
	epoch := at.Unix() / slotSeconds
	var hh maphash.Hash
	hh.SetSeed(c.seed)
	hh.WriteString(prefix)
	hh.WriteByte(0)
	hh.WriteString(key)
	h := hh.Sum64()
	sh := &c.keys[h%shards]
	sh.mu.Lock()
	s := &sh.slots[epoch%slots]
	if s.epoch != epoch || s.keys == nil {
		s.epoch, s.overflow = epoch, 0
		if s.keys == nil {
			s.keys = make(map[uint64]*deniedCount)
		} else {
			clear(s.keys)
		}
	}
	if d, ok := s.keys[h]; ok {
		d.n++
	} else if len(s.keys) < maxSlotKeys {
		s.keys[h] = &deniedCount{key: storeKey{prefix, key}, n: 1}
	} else {
		s.overflow++
	}
	sh.mu.Unlock()
}

// deniedKey is a store key and its denials over the window.
type deniedKey struct {
	key    storeKey
	denied int64
}

// topDenied returns the n keys denied most over the last DeniedWindow,
// most denied first, and how many denials were of keys past the per-slot
// bound (not attributed to a key).
func (c *Counter) topDenied(n int) ([]deniedKey, int64) {
	epoch := c.now().Unix() / slotSeconds
	sum := map[storeKey]int64{}
	var overflow int64
	for i := range c.keys {
		sh := &c.keys[i]
		sh.mu.Lock()
		for j := range sh.slots {
			s := &sh.slots[j]
			if s.keys == nil || s.epoch <= epoch-slots || s.epoch > epoch {
				continue
			}
			for _, d := range s.keys {
				sum[d.key] += d.n
			}
			overflow += s.overflow
		}
		sh.mu.Unlock()
	}
	out := make([]deniedKey, 0, len(sum))
	for k, v := range sum {
		out = append(out, deniedKey{k, v})
	}
	slices.SortFunc(out, func(a, b deniedKey) int {
		if c := cmp.Compare(b.denied, a.denied); c != 0 {
			return c
		}
		return cmp.Compare(a.key.prefix+a.key.key, b.key.prefix+b.key.key)
	})
	if len(out) > n {
		out = out[:n]
	}
	return out, overflow
}

// counted is a Store whose takes are counted.
type counted struct {
	fleetrate.Store
	c *Counter
}

// Take implements fleetrate.Store, counting every take but peeks.
func (s *counted) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	res, err := s.Store.Take(ctx, req)
	if req.N > 0 {
		s.c.record(req.Buckets, res, err)
	}
	return res, err
}

// TakeMany implements fleetrate.MultiTaker: the takes go to the wrapped
// store together (see fleetrate.TakeMany), each counted as Take counts
// it.
func (s *counted) TakeMany(ctx context.Context, reqs []fleetrate.Request, res []fleetrate.Result, errs []error) {
	if fleetrate.TakeMany(ctx, s.Store, reqs, res, errs) != nil {
		return // nothing taken; the error is in every errs[i]
	}
	for i := range reqs {
		if reqs[i].N > 0 {
			s.c.record(reqs[i].Buckets, res[i], errs[i])
		}
	}
}

// MultipleClocks reports what the wrapped store reports, false if it does
// not say.
func (s *counted) MultipleClocks() bool {
	mc, ok := s.Store.(fleetrate.MultiClock)
	return ok && mc.MultipleClocks()
}

// Unwrap returns the store whose takes are counted, so that callers can
// find what it offers beyond fleetrate.Store: a transport over a Limiter
// on a Counter's store finds the wrapped store's Announcer through it and
// keeps telling the fleet of its pauses (see transport.Announcer).
func (s *counted) Unwrap() fleetrate.Store { return s.Store }

// countedBinder is counted for a store that binds takers.
type countedBinder struct {
	*counted
	b fleetrate.Binder
}

// Bind implements fleetrate.Binder: the bound taker counts its takes.
func (s *countedBinder) Bind(prefix string, limits []fleetrate.Limit) (fleetrate.BoundTaker, error) {
	t, err := s.b.Bind(prefix, limits)
	if err != nil {
		return nil, err
	}
	return &countedTaker{t: t, prefix: prefix, c: s.c}, nil
}

type countedTaker struct {
	t      fleetrate.BoundTaker
	prefix string
	c      *Counter
}

// TakeKey implements fleetrate.BoundTaker, counting every take but peeks.
func (t *countedTaker) TakeKey(ctx context.Context, key string, n int64, maxWait time.Duration) (res fleetrate.Result, err error) {
	res, err = t.t.TakeKey(ctx, key, n, maxWait)
	if n > 0 {
		t.c.recordKey(t.prefix, key, &res, err)
	}
	return res, err
}

var (
	_ fleetrate.Store      = (*counted)(nil)
	_ fleetrate.Binder     = (*countedBinder)(nil)
	_ fleetrate.MultiClock = (*counted)(nil)
	_ fleetrate.MultiTaker = (*counted)(nil)
	_ fleetrate.BoundTaker = (*countedTaker)(nil)
)
