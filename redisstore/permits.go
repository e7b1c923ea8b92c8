package redisstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
)

// The permits of a bucket with an in-flight bound live in three sorted
// sets of their own beside the bucket's key (see scripts/permits.lua),
// named by the bucket's key and these suffixes.
const (
	heldSuffix   = ":in-flight:held"
	queueSuffix  = ":in-flight:queue"
	leasesSuffix = ":in-flight:leases"
)

// permitChannel is the Redis channel on which Release announces the
// waiters a permit was freed for (see NotifyPermit).
const permitChannel = "fleetrate:permits"

// permitKeys returns the three keys of the permits of the bucket whose
// store key is key: on the key's own hash slot (Cluster) or shard (Ring),
// so that a script updates the bucket and its permits atomically, and
// starting as the key does, so that an ACL key pattern of its prefix
// (~fleetrate:*) covers them. A key with a {hash tag} keeps it (the
// suffixes are appended); a key without a "}" is also made the tag of its
// permit keys: "a:b" has "a:b{a:b}" and a suffix, which hash as "a:b"
// does. A key with a "}" but no valid tag can be neither: on a Cluster or
// a Ring it is refused, naming the key; elsewhere the suffixes are
// appended.
func (s *Store) permitKeys(key string) (h, q, w string, err error) {
	base, err := permitBase(key, s.cluster || s.MultipleClocks())
	if err != nil {
		return "", "", "", err
	}
	return base + heldSuffix, base + queueSuffix, base + leasesSuffix, nil
}

// permitBase returns the start of the names of key's permit keys (see
// permitKeys); sharded is set for a client whose keys hash to shards.
func permitBase(key string, sharded bool) (string, error) {
	i := strings.IndexByte(key, '{')
	if i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key, nil // a valid hash tag
		}
	}
	if key != "" && !strings.Contains(key, "}") {
		// The first "{" opens the tag, which the key's own "{", if any,
		// must not: the tag goes there, and holds the whole key.
		if i < 0 {
			i = len(key)
		}
		return key[:i] + "{" + key + "}", nil
	}
	if sharded {
		return "", fmt.Errorf("%w: bucket key %q bounds in-flight takes but cannot have its permits on its Redis Cluster slot (it has a \"}\" and no valid {hash tag}): give it a hash tag, such as {%s}", fleetrate.ErrInvalid, key, strings.NewReplacer("{", "", "}", "").Replace(key))
	}
	return key, nil
}

// appendPermitKeys appends to keys the three permit keys of each bucket
// with an in-flight bound, preceded by the bucket's own key when withKey
// is set, and returns them with the bounds in order.
func (s *Store) appendPermitKeys(keys []string, buckets []fleetrate.Bucket, withKey bool) ([]string, []any, error) {
	var bounds []any
	for _, b := range buckets {
		if b.InFlight == 0 {
			continue
		}
		h, q, w, err := s.permitKeys(b.StoreKey())
		if err != nil {
			return nil, nil, err
		}
		if withKey {
			keys = append(keys, b.StoreKey())
		}
		keys = append(keys, h, q, w)
		bounds = append(bounds, b.InFlight)
	}
	return keys, bounds, nil
}

// Settle implements fleetrate.Store.
func (s *Store) Settle(ctx context.Context, buckets []fleetrate.Bucket, st fleetrate.Settlement) error {
	if err := fleetrate.ValidateSettle(buckets, st); err != nil {
		return err
	}
	args := make([]any, 1, 1+len(buckets)*6)
	args[0] = st.At.UnixMicro()
	for i := range buckets {
		args = appendTakeLimits(args, buckets[i:i+1])
		args = append(args, st.Costs[i], st.Actual[i])
	}
	return s.run(ctx, "settle", settleScript, buckets, args)
}

// Release implements fleetrate.Store. It publishes, for the processes that
// wait (see NotifyPermit), which waiters a permit was freed for.
func (s *Store) Release(ctx context.Context, buckets []fleetrate.Bucket, id string) (int, error) {
	if err := fleetrate.ValidateRelease(buckets, id); err != nil {
		return 0, err
	}
	keys, bounds, err := s.appendPermitKeys(nil, buckets, true)
	if err != nil {
		return 0, err
	}
	return s.permitCall(ctx, "release", releaseScript, keys, append([]any{permitChannel, id}, bounds...))
}

// Renew implements fleetrate.Store.
func (s *Store) Renew(ctx context.Context, buckets []fleetrate.Bucket, p fleetrate.Permit) (int, error) {
	if err := fleetrate.ValidateRenew(buckets, p); err != nil {
		return 0, err
	}
	keys, bounds, err := s.appendPermitKeys(nil, buckets, false)
	if err != nil {
		return 0, err
	}
	if s.fo != nil {
		s.fo.leased(p.TTL)
	}
	return s.permitCall(ctx, "renew", renewScript, keys, append([]any{p.ID, microseconds(p.TTL)}, bounds...))
}

// permitCall runs a script of permits on keys (their buckets share a
// slot) within the store's timeout and returns its integer reply.
func (s *Store) permitCall(ctx context.Context, op string, script *redis.Script, keys []string, args []any) (int, error) {
	if err := s.sameSlot(keys); err != nil {
		return 0, err
	}
	sctx, cancel := s.ctx(ctx)
	defer cancel()
	var n int64
	err := s.bounded(sctx, func(ctx context.Context) (err error) {
		n, err = s.eval(ctx, script, keys, args...).Int64()
		return err
	})
	if err != nil {
		return 0, s.explain(failed(ctx, op, err))
	}
	return int(n), nil
}

// microseconds returns d in whole µs, as the scripts count leases.
func microseconds(d time.Duration) int64 { return int64(d / time.Microsecond) }
