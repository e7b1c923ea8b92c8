package remotestore

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/server/wire"
)

// slot is a grant's slot in µs as fleetrate.Settlement.At gives it: the
// answer's time plus its wait.
func slot(res wire.Result) int64 {
	return time.UnixMicro(res.AtUnixMicro).Add(time.Duration(res.WaitNS)).UnixMicro()
}

// Settle implements fleetrate.Store. It presents the settle grant the
// service issued with the take through this Store (found by its buckets
// and slot, s.At), once: the service settles a grant once, and refuses a
// second settle of it, or a refund after it (403 grant_refused, "already
// settled or given back", returned as an error wrapping
// ErrStoreUnavailable as every refusal of the service is). Without a
// grant (a second settle, a take through another Store, or too long ago),
// the service settles only for a token with the admin scope.
func (s *Store) Settle(ctx context.Context, buckets []fleetrate.Bucket, st fleetrate.Settlement) error {
	if err := fleetrate.ValidateSettle(buckets, st); err != nil {
		return err
	}
	at := st.At.UnixMicro()
	key := grantKey(grantSettle, buckets, at)
	grant := s.grants.take(key)
	body := wire.SettleRequest{Buckets: wire.FromBuckets(buckets), Costs: st.Costs, Actual: st.Actual, AtUnixMicro: at, Grant: grant}
	err := s.call(ctx, wire.SettlePath, body, &wire.OK{})
	if err != nil && errors.Is(err, fleetrate.ErrStoreUnavailable) {
		s.grants.put(key, grant) // the service gives it back on a store failure
	}
	return err
}

// Release implements fleetrate.Store. The service releases a permit for
// whoever names its id: a Limiter draws 96 random bits for each.
func (s *Store) Release(ctx context.Context, buckets []fleetrate.Bucket, id string) (int, error) {
	if err := fleetrate.ValidateRelease(buckets, id); err != nil {
		return 0, err
	}
	var out wire.Held
	err := s.call(ctx, wire.ReleasePath, wire.ReleaseRequest{Buckets: wire.FromBuckets(buckets), ID: id}, &out)
	return out.Held, err
}

// Renew implements fleetrate.Store.
func (s *Store) Renew(ctx context.Context, buckets []fleetrate.Bucket, p fleetrate.Permit) (int, error) {
	if err := fleetrate.ValidateRenew(buckets, p); err != nil {
		return 0, err
	}
	var out wire.Held
	err := s.call(ctx, wire.RenewPath, wire.RenewRequest{Buckets: wire.FromBuckets(buckets), ID: p.ID, TTLNS: int64(p.TTL)}, &out)
	return out.Held, err
}

// notifyWait is how long one stream of /v1/store/notify lasts before the
// Store opens another.
const notifyWait = 25 * time.Second

// NotifyPermit implements fleetrate.PermitNotifier without polling: it
// opens a stream to the service's /v1/store/notify, which registers the
// waiter with the service's own store and answers a line each time that
// store says a permit of key may have been freed for id; the channel
// receives on each. NotifyPermit returns once the service has registered
// the waiter (or failed to), so that a release after it is not missed; a
// goroutine reads the stream and opens the next one every notifyWait,
// until stop. Each time a stream opens the channel receives once: a
// release between the waiter's queued take and its registration would
// otherwise be missed, so the waiter takes again once (one store call
// per notifyWait at most, not a poll). When the service's store cannot tell, or the service fails,
// the goroutine ends and the channel stays silent: the waiter keeps to
// its timer (a third of its lease, or when a held lease ends), as over a
// store without notices.
func (s *Store) NotifyPermit(key, id string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	body, err := json.Marshal(wire.NotifyRequest{Key: wire.Bytes(key), ID: id, WaitNS: int64(notifyWait)})
	if err != nil {
		return ch, cancel
	}
	stream := s.openNotify(ctx, body)
	go func() {
		for stream != nil {
			// A release between the waiter's queued take and the
			// registration (a round trip later) was not seen: one notice
			// as soon as the waiter is registered makes it take again
			// once, so that such a release is never missed.
			select {
			case ch <- struct{}{}:
			default:
			}
			sc := bufio.NewScanner(stream)
			for sc.Scan() {
				var n wire.Notified
				if json.Unmarshal(sc.Bytes(), &n) == nil && n.Notified {
					select {
					case ch <- struct{}{}:
					default:
					}
				}
			}
			stream.Close()
			stream = s.openNotify(ctx, body)
		}
	}()
	return ch, cancel
}

// openNotify opens a stream of /v1/store/notify and reads its first line,
// returning the rest of the stream, or nil when the service's store
// cannot tell, the service failed or ctx ended.
func (s *Store) openNotify(ctx context.Context, body []byte) io.ReadCloser {
	if ctx.Err() != nil {
		return nil
	}
	sctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(sctx, http.MethodPost, s.base+wire.NotifyPath, bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil
	}
	req.Header.Set("Content-Type", "application/json")
	if s.auth != "" {
		req.Header.Set("Authorization", s.auth)
	}
	// The first line comes as soon as the service registered the waiter:
	// bound the wait for it as any call, not the stream.
	first := time.AfterFunc(max(s.timeout, time.Second), cancel)
	resp, err := s.client.Do(req)
	if err != nil {
		cancel()
		return nil
	}
	r := bufio.NewReader(resp.Body)
	line, err := r.ReadBytes('\n')
	var n wire.Notified
	if !first.Stop() || resp.StatusCode != http.StatusOK || err != nil || json.Unmarshal(line, &n) != nil || !n.Supported {
		resp.Body.Close()
		cancel()
		return nil
	}
	return struct {
		io.Reader
		io.Closer
	}{r, closer(func() error { cancel(); return resp.Body.Close() })}
}

// closer is an io.Closer of a function.
type closer func() error

// Close implements io.Closer.
func (c closer) Close() error { return c() }
