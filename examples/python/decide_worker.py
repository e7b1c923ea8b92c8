#!/usr/bin/env python3
"""A fleet worker that paces its calls to an upstream API on a fleetrate bucket.

This is the decide API (/v1/wait, /v1/take, /v1/acquire, ...), the
building blocks; worker.py beside it uses the whole outbound protocol
through the fleetrate package (clients/python) instead: pauses after a
429, adaptive pacing and the rest done by the service. Only Python's
standard library is used. Run any number of these, in any
number of processes or machines, against one `fleetrate serve`: together
they stay within the bucket's rate, because every call first books a token
from the shared bucket through POST /v1/wait and then sleeps exactly the
wait the service returns. Booking first makes waiting fair (first come,
first served) and free of a thundering herd: nobody polls.

    go run ./cmd/fleetrate serve --config examples/fleetrate.yaml &
    python3 examples/python/decide_worker.py --bucket booking_com/availability \\
        --workers 8 --calls 100

See docs/API.md for the endpoints used here.
"""

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.request


class FleetrateUnavailable(Exception):
    """The service could not decide: it is unreachable or its store is down.

    This is never a denial. The caller chooses to fail open (go ahead) or
    closed (back off and retry); see Pacer.on_error.
    """


class FleetrateRefused(Exception):
    """The service refused the call itself: a wrong or missing token (401),
    a forbidden API (403), a bad request (400, 404).

    This is a mistake in the worker's setup, not an outage: retrying or
    going ahead unpaced would hide it, so it is raised to the caller.
    """


class Backpressure(Exception):
    """The wait for a token would exceed max_wait. Nothing was booked."""

    def __init__(self, retry_after):
        super().__init__(f"no token within max_wait; retry after {retry_after:.3f}s")
        self.retry_after = retry_after


class Fleetrate:
    """A small client for fleetrate's HTTP API."""

    def __init__(self, url="http://127.0.0.1:8080", token=None, timeout=2.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _post(self, path, body):
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:
            try:
                err = json.load(e)
            except ValueError:
                err = {"error": e.reason, "code": str(e.code)}
            if 400 <= e.code < 500 and e.code != 429:
                # Our request or our token is wrong (unknown bucket, n above
                # the burst, 401 for a bad token): retrying will not help, and
                # the service is not down, so --on-error open must not apply.
                raise FleetrateRefused(f"fleetrate: HTTP {e.code}: {err.get('code')}: {err.get('error')}") from None
            raise FleetrateUnavailable(f"HTTP {e.code}: {err.get('error')}") from None
        except (urllib.error.URLError, OSError) as e:
            raise FleetrateUnavailable(str(e)) from None

    def take(self, bucket, n=1):
        """Take n tokens now if they are there; returns the decision."""
        return self._post("/v1/take", {"bucket": bucket, "n": n})

    def reserve(self, bucket, n=1, max_wait=5.0):
        """Book n tokens; return how many seconds to wait before using them,
        and the booking that cancel needs to give them back.

        Raises Backpressure when the wait would exceed max_wait (the service
        also caps it at its own max wait).
        """
        d = self._post("/v1/wait", {"bucket": bucket, "n": n, "max_wait_ms": max_wait * 1000})
        if not d["allowed"]:
            raise Backpressure(d["retry_after_ms"] / 1000)
        return d["wait_ms"] / 1000, d.get("booking")

    def cancel(self, bucket, n, booking):
        """Give back a booking that will not be used, before its slot: the
        tokens go back unless a later booking relies on them."""
        self._post("/v1/cancel", {"bucket": bucket, "n": n, "booking": booking})

    def refund(self, bucket, decision):
        """Give back the tokens of a take (/v1/take) whose work was not done,
        as far as the bucket has not refilled since. The decision's grant
        (signed by the service, for this token, good once) proves the take;
        without one, only a token with the admin scope may refund."""
        body = {"bucket": bucket, "n": decision["n"], "at_unix_micro": decision["at_unix_micro"]}
        if decision.get("grant"):
            body["grant"] = decision["grant"]
        self._post("/v1/refund", body)

    def acquire(self, costs, max_wait=5.0, ttl=15.0):
        """Take costs by bucket name ({"llm/requests": 1, "llm/tokens": 1200})
        with a permit of every bucket that bounds work in flight (in_flight in
        the service's configuration), waiting up to max_wait seconds for one,
        first come first served. Returns the decision: when allowed, its
        "permit" (renew it within ttl seconds, release it when the work is
        done) and its "settle_grant"; when not, Backpressure is raised."""
        d = self._post("/v1/acquire", {"costs": costs, "max_wait_ms": max_wait * 1000, "ttl_ms": ttl * 1000})
        if not d["allowed"]:
            raise Backpressure(d["retry_after_ms"] / 1000)
        return d

    def renew(self, decision, ttl=15.0):
        """Extend an acquired permit's lease to ttl seconds from now. Returns
        False when a lease had lapsed: the permit may be another's now."""
        a = self._post("/v1/renew", {"buckets": decision["buckets"], "permit_id": decision["permit"]["id"], "ttl_ms": ttl * 1000})
        return not a.get("lapsed", False)

    def release(self, decision):
        """Give an acquired permit back (twice, or after its lease, is harmless)."""
        self._post("/v1/release", {"buckets": decision["buckets"], "permit_id": decision["permit"]["id"]})

    def settle(self, decision, actual):
        """Adjust a grant of costs by bucket to what the work really cost
        ({"llm/tokens": 312, ...}, every bucket of the take): less gives the
        difference back, more is owed at once. Once per grant: a second
        settle is refused (FleetrateRefused, code grant_refused)."""
        self._post("/v1/settle", {"costs": dict(zip(decision["buckets"], decision["costs"])),
                                  "actual": actual, "grant": decision["settle_grant"]})

    def drain(self, bucket, seconds):
        """Pause the whole fleet on this bucket, e.g. after an upstream 429.
        Needs a token with the admin scope (or, without tokens, a client on
        the service's host)."""
        self._post("/v1/drain", {"bucket": bucket, "pause_ms": seconds * 1000})


class Pacer:
    """Paces asyncio tasks on one shared bucket."""

    def __init__(self, client, bucket, max_wait=5.0, on_error="closed", error_backoff=1.0):
        self.client = client
        self.bucket = bucket
        self.max_wait = max_wait
        self.on_error = on_error  # "closed": back off and retry; "open": go ahead
        self.error_backoff = error_backoff

    async def wait(self, n=1):
        """Return once n tokens are ours to use."""
        while True:
            try:
                # The HTTP call blocks, so it runs in a thread; the wait
                # itself is an asyncio sleep that blocks nobody.
                delay, booking = await asyncio.to_thread(self.client.reserve, self.bucket, n, self.max_wait)
            except Backpressure as e:
                await asyncio.sleep(e.retry_after)
                continue
            except FleetrateUnavailable as e:
                if self.on_error == "open":
                    print(f"fleetrate unavailable ({e}); going ahead", file=sys.stderr)
                    return
                print(f"fleetrate unavailable ({e}); retrying in {self.error_backoff}s", file=sys.stderr)
                await asyncio.sleep(self.error_backoff)
                continue
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                # The booked tokens will not be used: give them back.
                if booking is not None:
                    await asyncio.to_thread(self.client.cancel, self.bucket, n, booking)
                raise
            return


async def call_upstream(i):
    """Stands in for the real API call."""
    await asyncio.sleep(0.001)
    return i


async def run(args):
    client = Fleetrate(args.url, token=args.token)
    pacer = Pacer(client, args.bucket, max_wait=args.max_wait, on_error=args.on_error)
    queue = asyncio.Queue()
    for i in range(args.calls):
        queue.put_nowait(i)

    async def worker():
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await pacer.wait()
            await call_upstream(i)

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(args.workers)))
    elapsed = time.monotonic() - start
    print(f"done: {args.calls} calls in {elapsed:.3f}s ({args.calls / elapsed:.1f}/s) on {args.bucket}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("FLEETRATE_URL", "http://127.0.0.1:8080"))
    p.add_argument("--token", default=os.environ.get("FLEETRATE_TOKEN"), help="bearer token, if the service needs one")
    p.add_argument("--bucket", default="booking_com/availability")
    p.add_argument("--workers", type=int, default=8, help="concurrent asyncio tasks")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--max-wait", type=float, default=5.0, help="longest wait to book, in seconds")
    p.add_argument("--on-error", choices=["open", "closed"], default="closed",
                   help="when the service is unavailable: go ahead (open) or back off and retry (closed)")
    try:
        asyncio.run(run(p.parse_args()))
    except FleetrateRefused as e:
        # A mistake to fix (an unknown bucket, a missing token): one line, no traceback.
        print(e, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
