package redisstore

import (
	"strconv"
	"strings"
	"time"

	"github.com/fleetrate/fleetrate"
)

// maxFold bounds one folded call, so that one script never runs long.
const maxFold = 512

// newFolder returns the batcher of Options.FoldHotKeys, which folds
// concurrent identical takes on one bucket into one script call. One key
// can execute only so many scripts a second on one Redis core; a hot key
// shared by a big fleet needs more. Takes queue by identity, with one call
// in flight per queue: while a call for a bucket is in flight, the takes
// that arrive for it queue up, and when it returns the whole queue goes
// out as one take with a count. Each caller gets the decision the script
// made for it, exactly as if the takes had run one after the other at the
// same instant.
func newFolder(s *Store) sharer {
	return newQueues(s, maxFold, 1, fold)
}

// fold names the queue of takes that fold with a take (see foldRoute and
// batcher.route).
func fold(key string, n int64, wait time.Duration, req *fleetrate.Request) foldRoute {
	if req == nil {
		return foldRoute{key: key, n: n, wait: wait}
	}
	return foldRoute{key: identity(*req), several: true}
}

// identity names the buckets, cost and max wait of a request; takes with
// the same identity and the same limits fold together.
// Each key is length-prefixed, so that keys holding any bytes (a NUL
// included) can never make two different requests look the same.
func identity(req fleetrate.Request) string {
	var sb strings.Builder
	for _, b := range req.Buckets {
		sb.WriteString(strconv.Itoa(len(b.Prefix) + len(b.Key)))
		sb.WriteByte(':')
		sb.WriteString(b.Prefix)
		sb.WriteString(b.Key)
	}
	sb.WriteString(strconv.FormatInt(req.N, 10))
	sb.WriteByte(0)
	sb.WriteString(strconv.FormatInt(int64(req.MaxWait), 10))
	return sb.String()
}

// sameLimits reports whether two requests on the same buckets carry the
// same limits and reserves, so that their takes may fold.
func sameLimits(a, b fleetrate.Request) bool {
	if len(a.Buckets) != len(b.Buckets) {
		return false
	}
	for i := range a.Buckets {
		x, y := a.Buckets[i].Limits, b.Buckets[i].Limits
		if len(x) != len(y) || a.Buckets[i].Reserve != b.Buckets[i].Reserve {
			return false
		}
		for j := range x {
			if x[j].Rate != y[j].Rate || x[j].Burst != y[j].Burst || x[j].Name != y[j].Name {
				return false
			}
		}
	}
	return true
}

// cloneRequest copies the slices of req, which belong to the caller and
// may be reused once its call returns, while the take may still be queued
// or in flight.
func cloneRequest(req fleetrate.Request) fleetrate.Request {
	bs := make([]fleetrate.Bucket, len(req.Buckets))
	for i, b := range req.Buckets {
		b.Limits = append([]fleetrate.Limit(nil), b.Limits...)
		bs[i] = b
	}
	req.Buckets = bs
	return req
}
