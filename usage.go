package fleetrate

import (
	"context"
	"fmt"
	"time"
)

// Usage is where one bucket stands, for a customer's "my usage" page: its
// token-bucket limits and each of its calendar quotas, read in one store
// call that takes nothing (a peek), on the store's clock.
type Usage struct {
	// Bucket is the bucket's name.
	Bucket string
	// At is the store's clock when it was read.
	At time.Time
	// Limit is the bucket's token-bucket limit with the fewest tokens
	// left, Remaining how many it holds, and Full when every limit of the
	// bucket is full again.
	Limit     Limit
	Remaining int64
	Full      time.Time
	// Quotas are the bucket's calendar quotas: what each window used,
	// what remains and when it resets.
	Quotas []QuotaStatus
}

// Available returns how many takes of one token the bucket grants now,
// one after the other with no time passing: the fewest of its limits'
// tokens and its quotas' remaining.
func (u Usage) Available() int64 {
	n := u.Remaining
	for _, q := range u.Quotas {
		n = min(n, q.Remaining)
	}
	return n
}

// Usage reads where the named bucket stands (see Usage) in one store call
// that takes nothing. A store failure is an error.
func (l *Limiter) Usage(ctx context.Context, name string) (Usage, error) {
	if ctx == nil {
		return Usage{}, errNilContext
	}
	res, err := l.Peek(ctx, name)
	if err != nil {
		return Usage{}, fmt.Errorf("usage of %q: %w", name, err)
	}
	u := Usage{Bucket: name, At: res.At, Limit: res.Limit, Remaining: res.Remaining, Full: res.At.Add(res.ResetAfter), Quotas: res.Quotas}
	return u, nil
}
