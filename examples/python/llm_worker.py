#!/usr/bin/env python3
"""Workers that call an LLM API within a shared request rate, token rate
and bound on calls in flight, through fleetrate's in-flight permits.

Only Python's standard library is used. Each call acquires one request and
an estimate of its tokens with a permit (POST /v1/acquire, waiting first
come first served), renews the permit's lease at a third of it while the
call runs (POST /v1/renew), settles the tokens it really used (POST
/v1/settle: the estimate's unused part goes back, an overrun is owed), and
releases the permit (POST /v1/release). A worker that dies without
releasing loses its permit when the lease ends.

    go run ./cmd/fleetrate serve --config examples/python/llm.yaml &
    python3 examples/python/llm_worker.py --workers 6 --calls 12

See docs/API.md for the endpoints used here.
"""

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decide_worker import Backpressure, Fleetrate, FleetrateRefused  # noqa: E402


class Held:
    """A permit acquired with its costs, renewed until it is released."""

    def __init__(self, client, decision, ttl):
        self.client, self.decision, self.ttl = client, decision, ttl
        self.lapsed = False
        self.renewals = 0
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew, daemon=True)
        self._renewer.start()

    def _renew(self):
        while not self._stop.wait(self.ttl / 3):
            if not self.client.renew(self.decision, self.ttl):
                self.lapsed = True  # stop the work: the permit may be another's
                return
            self.renewals += 1

    def settle(self, actual):
        self.client.settle(self.decision, actual)

    def release(self):
        self._stop.set()
        self._renewer.join()
        self.client.release(self.decision)


def acquire(client, costs, ttl, max_wait):
    """Acquire, retrying while the fleet is at its bound."""
    while True:
        try:
            return Held(client, client.acquire(costs, max_wait=max_wait, ttl=ttl), ttl)
        except Backpressure as e:
            time.sleep(max(e.retry_after, 0.01))


def run(args):
    client = Fleetrate(args.url, token=args.token, timeout=args.max_wait + 5)
    lock = threading.Lock()
    state = {"next": 0, "in_flight": 0, "max_in_flight": 0, "renewals": 0, "given_back": 0}

    def worker():
        while True:
            with lock:
                if state["next"] >= args.calls:
                    return
                state["next"] += 1
            held = acquire(client, {args.requests: 1, args.tokens: args.estimate}, args.ttl, args.max_wait)
            try:
                with lock:
                    state["in_flight"] += 1
                    state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
                time.sleep(args.work)  # stands in for the LLM call
                used = args.estimate // 3  # what the answer really cost
                with lock:
                    state["in_flight"] -= 1
                held.settle({args.requests: 1, args.tokens: used})
            finally:
                held.release()
            with lock:
                state["renewals"] += held.renewals
                state["given_back"] += args.estimate - used

    start = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    print(f"done: {args.calls} calls in {elapsed:.3f}s, max in flight {state['max_in_flight']}, "
          f"renewals {state['renewals']}, tokens settled back {state['given_back']}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("FLEETRATE_URL", "http://127.0.0.1:8080"))
    p.add_argument("--token", default=os.environ.get("FLEETRATE_TOKEN"), help="bearer token, if the service needs one")
    p.add_argument("--requests", default="llm/requests", help="the bucket of requests, with in_flight")
    p.add_argument("--tokens", default="llm/tokens", help="the bucket of tokens")
    p.add_argument("--estimate", type=int, default=1200, help="tokens a call is booked for before it runs")
    p.add_argument("--workers", type=int, default=6, help="concurrent threads")
    p.add_argument("--calls", type=int, default=12)
    p.add_argument("--work", type=float, default=0.5, help="seconds each call runs")
    p.add_argument("--ttl", type=float, default=1.5, help="the permit's lease, in seconds (renewed at a third)")
    p.add_argument("--max-wait", type=float, default=5.0, help="longest wait for a permit, in seconds")
    try:
        run(p.parse_args())
    except FleetrateRefused as e:
        print(e, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
