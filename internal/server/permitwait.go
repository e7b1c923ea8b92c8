package server

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/server/wire"
)

// apiAcquire is the api label of /v1/acquire's decisions.
const apiAcquire = "acquire"

// decidePermit takes req from the store, each call within the store
// timeout. A take of a permit that may wait (/v1/acquire with a max
// wait) and finds none free keeps its place in the bucket's queue, first
// come first served, and takes again when the store says a permit was
// released (a PermitNotifier), when a held lease may have ended
// (RetryAfter), or at a third of its own lease to keep its place, until
// its max wait: then, when the server begins to shut down, or when the
// caller goes away, it leaves the queue and the decision is a denial. It
// is long because it is one loop, as Limiter.Acquire's is: its exits are
// easier to check together.
func (v service) decidePermit(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if req.Permit.ID == "" || req.MaxWait == 0 {
		sctx, cancel := v.storeCtx(ctx)
		defer cancel()
		return v.store.Take(sctx, req)
	}
	deadline := time.Now().Add(req.MaxWait)
	var wake <-chan struct{}
	stop, waiting := func() {}, false
	defer func() {
		stop()
		if waiting {
			v.metrics.permits.waiting.Dec()
		}
	}()
	for {
		req.MaxWait = max(time.Until(deadline), 0)
		sctx, cancel := v.storeCtx(ctx)
		res, err := v.store.Take(sctx, req)
		cancel()
		if err != nil || res.Allowed || !res.InFlight.Queued {
			if err != nil && waiting {
				v.leave(ctx, req)
			}
			return res, err
		}
		if !waiting {
			waiting = true
			v.metrics.permits.waiting.Inc()
			if n := fleetrate.NotifierOf(v.opts.Store); n != nil {
				wake, stop = n.NotifyPermit(req.Buckets[res.InFlight.Bucket].StoreKey(), req.Permit.ID)
				// A release between the take and the registration was not
				// seen: take again once, now that none can be missed.
				continue
			}
		}
		d := min(res.RetryAfter, req.Permit.TTL/3, time.Until(deadline))
		if d <= 0 {
			v.leave(ctx, req)
			res.InFlight.Queued, res.InFlight.Ahead = false, 0
			return res, nil
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			v.leave(ctx, req)
			return fleetrate.Result{}, ctx.Err()
		case <-v.stopping:
			// The server is shutting down: answer now, as if the max
			// wait had passed, so that the graceful stop is not held.
			t.Stop()
			v.leave(ctx, req)
			res.InFlight.Queued, res.InFlight.Ahead = false, 0
			return res, nil
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// leave gives up req's place in the queue.
func (v service) leave(ctx context.Context, req fleetrate.Request) {
	sctx, cancel := v.storeCtx(context.WithoutCancel(ctx))
	defer cancel()
	_, _ = v.store.Release(sctx, req.Buckets, req.Permit.ID)
}

// maxNotifyWait bounds one /v1/store/notify stream: a remotestore asks
// again after it, so that no proxy drops an idle request.
const maxNotifyWait = 30 * time.Second

// mountNotify adds /v1/store/notify, remotestore's PermitNotifier: a
// stream of JSON lines (wire.Notified). The service registers the waiter
// with its store's PermitNotifier, then answers a first line
// {"supported":true}, and a line {"supported":true,"notified":true} each
// time its store says a permit of the bucket may have been freed for the
// waiter, until the stream's wait ends (at most maxNotifyWait) or the
// client goes. A service whose store cannot tell answers
// {"supported":false} and ends: the waiter keeps to its timer.
func (s *Server) mountNotify(mux *http.ServeMux, v service) {
	mux.HandleFunc(wire.NotifyPath, s.api(http.MethodPost, ScopeStore, s.storeAPI(v.storeNotify)))
}

// storeNotify serves /v1/store/notify.
func (v service) storeNotify(w http.ResponseWriter, r *http.Request) error {
	var req wire.NotifyRequest
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	key := string(req.Key)
	if err := v.ownKey("key", key); err != nil {
		return err
	}
	if err := (fleetrate.Permit{ID: req.ID, TTL: fleetrate.MinPermitTTL}).Validate(); err != nil {
		return err
	}
	if req.WaitNS <= 0 || time.Duration(req.WaitNS) > maxNotifyWait {
		return badRequest(wire.CodeInvalid, "wait_ns: must be between 1 and %d, got %d", int64(maxNotifyWait), req.WaitNS)
	}
	n := fleetrate.NotifierOf(v.opts.Store)
	if n == nil {
		writeJSON(w, http.StatusOK, wire.Notified{})
		return nil
	}
	ch, stop := n.NotifyPermit(key, req.ID)
	defer stop()
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(time.Duration(req.WaitNS) + v.opts.WriteTimeout))
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	line := func(notified bool) bool {
		data, _ := json.Marshal(wire.Notified{Supported: true, Notified: notified})
		_, err := w.Write(append(data, '\n'))
		return err == nil && rc.Flush() == nil
	}
	if !line(false) {
		return nil
	}
	t := time.NewTimer(time.Duration(req.WaitNS))
	defer t.Stop()
	for {
		select {
		case <-ch:
			if !line(true) {
				return nil
			}
		case <-t.C:
			return nil
		case <-r.Context().Done():
			return nil
		case <-v.stopping:
			return nil // the graceful stop is not held; the client opens another
		}
	}
}
