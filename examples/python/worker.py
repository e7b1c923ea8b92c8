#!/usr/bin/env python3
"""A paced fleet of asyncio workers calling an upstream API through
fleetrate's outbound protocol.

Every call is booked with `fleetrate serve` (which waits its turn: the
channel's pacing, pauses, in-flight bounds), sent, and its answer reported;
after a 429 the service pauses every worker of the channel, in every
process and language, and says when to send the request again. Run any
number of these against one service. Without --upstream, a stand-in of the
API is started in this process (strict at 25 requests per second).

    go run ./cmd/fleetrate serve --config examples/python/fleetrate.yaml &
    python3 examples/python/worker.py --workers 8 --calls 100

The fleetrate package is imported from clients/python of this repository;
the standard library is enough (--httpx sends through httpx instead).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))

import fleetrate  # noqa: E402


class StandIn:
    """A stand-in of the OTA's API, in threads: a strict limit of `rate`
    requests per second in bursts of 5 (429 beyond it, with Retry-After: 1), and a 429 to
    request number `surprise` (0: none), as a hidden limit would."""

    def __init__(self, rate: float = 25, surprise: int = 0) -> None:
        self.rate, self.surprise = rate, surprise
        self.requests = self.limited = 0
        self._tokens, self._last = 5.0, time.monotonic()
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = api.admit()
                body = b'{"available": true}' if status == 200 else b'{"error": "rate limited"}'
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", "1")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def admit(self) -> int:
        """The status of the next request."""
        with self._lock:
            self.requests += 1
            now = time.monotonic()
            self._tokens = min(5.0, self._tokens + (now - self._last) * self.rate)
            self._last = now
            if self.requests == self.surprise or self._tokens < 1:
                self.limited += 1
                return 429
            self._tokens -= 1
            return 200


def stdlib_send(url: str, body: bytes) -> Any:
    """A send function for Client.call with urllib, in a thread: it returns
    (status, headers, result), the result being (status, body)."""

    def post() -> Tuple[int, Dict[str, str], bytes]:
        req = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:  # a 429 is an answer, not a failure
            return e.code, dict(e.headers), e.read()
        except urllib.error.URLError as e:
            if isinstance(e.reason, ConnectionRefusedError):
                raise fleetrate.NotSent(str(e.reason)) from e  # never reached the API
            raise

    async def send() -> Tuple[int, Dict[str, str], Tuple[int, bytes]]:
        status, headers, answer = await asyncio.to_thread(post)
        return status, headers, (status, answer)

    return send


async def run(args: argparse.Namespace) -> None:
    stand_in = None if args.upstream else StandIn(surprise=args.surprise_429)
    upstream = args.upstream or stand_in.url  # type: ignore[union-attr]
    queue: "asyncio.Queue[int]" = asyncio.Queue()
    for i in range(args.calls):
        queue.put_nowait(i)
    counts = {"ok": 0, "gave_up": 0, "unpaced": 0}
    async with fleetrate.Client(args.url, token=args.token) as fr:
        http: Any = None
        if args.httpx:
            import httpx
            from fleetrate.httpx import PacedTransport
            http = httpx.AsyncClient(transport=PacedTransport(fr, args.channel, max_wait=args.max_wait))

        async def one(i: int) -> int:
            path = f"/v1/hotels/{i}/availability"
            body = json.dumps({"hotel": i, "rooms": 2}).encode()
            if http is not None:
                return int((await http.post(upstream + path, content=body)).status_code)
            status, _ = await fr.call(args.channel, "POST", path, stdlib_send(upstream + path, body),
                                      max_wait=args.max_wait)
            return int(status)

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                while True:
                    try:
                        await one(i)
                        counts["ok"] += 1
                    except fleetrate.Backpressure as e:
                        await asyncio.sleep(e.retry_after)  # nothing booked: try again later
                        continue
                    except fleetrate.GaveUp as e:
                        print(f"call {i}: {e}", file=sys.stderr)
                        counts["gave_up"] += 1
                    except fleetrate.Unavailable as e:
                        if args.on_error == "closed":
                            print(f"fleetrate unavailable ({e}); retrying in 1s", file=sys.stderr)
                            await asyncio.sleep(max(e.retry_after, 1.0))
                            continue
                        print(f"fleetrate unavailable ({e}); going ahead", file=sys.stderr)
                        await stdlib_send(upstream + f"/v1/hotels/{i}/availability", b"{}")()
                        counts["unpaced"] += 1
                    break

        start = time.monotonic()
        try:
            await asyncio.gather(*(worker() for _ in range(args.workers)))
        finally:
            if http is not None:
                await http.aclose()
        elapsed = time.monotonic() - start
    print(f"done: {args.calls} calls in {elapsed:.3f}s ({args.calls / elapsed:.1f}/s) on {args.channel}: "
          f"{counts['ok']} answered, {counts['gave_up']} gave up, {counts['unpaced']} unpaced")
    if stand_in is not None:
        print(f"upstream: {stand_in.requests} requests, {stand_in.limited} answered 429")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("FLEETRATE_URL", fleetrate.DEFAULT_URL),
                   help="fleetrate serve (FLEETRATE_URL)")
    p.add_argument("--token", default=os.environ.get("FLEETRATE_TOKEN"), help="bearer token, if the service needs one")
    p.add_argument("--channel", default="booking_com", help="the upstream, as in the service's upstreams:")
    p.add_argument("--upstream", default="", help="the API's base URL (default: a stand-in in this process)")
    p.add_argument("--workers", type=int, default=8, help="concurrent asyncio tasks")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--max-wait", type=float, default=5.0, help="longest wait for a turn, in seconds")
    p.add_argument("--on-error", choices=["open", "closed"], default="closed",
                   help="when the service is unavailable: go ahead unpaced (open) or back off and retry (closed)")
    p.add_argument("--surprise-429", type=int, default=0, metavar="N",
                   help="the stand-in answers its Nth request 429 with Retry-After: 1 (0: never)")
    p.add_argument("--httpx", action="store_true", help="send through httpx and fleetrate.httpx.PacedTransport")
    try:
        asyncio.run(run(p.parse_args()))
    except (fleetrate.Unauthorized, fleetrate.Invalid) as e:
        # A mistake to fix (a wrong token, an unknown channel): one line, no traceback.
        print(e, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
