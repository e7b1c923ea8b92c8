"""Fixtures of the fleetrate client's tests: a real `fleetrate serve`
(built once per session from this repository, or FLEETRATE_BIN) and an
adversarial upstream in a thread (strict limits, 429 with and without
Retry-After, rate-limit headers, slow answers)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # import fleetrate from the source tree
REPO = HERE.parent.parent.parent

# Channels used by the tests, one per test so that their pauses and
# rates do not meet.
SERVICE_CONFIG = """
upstreams:
  - channel: pace
    fixed: true
    endpoints:
      - name: items
        pattern: "GET /items/{id}"
        rate_limit: {unit: second, requests_per_unit: 20, burst: 1}
  - channel: pause
    fixed: true
    endpoints:
      - name: all
        pattern: "/"
        rate_limit: {unit: second, requests_per_unit: 40, burst: 1}
  - channel: bare
    fixed: true
    endpoints:
      - name: all
        pattern: "/"
        rate_limit: {unit: second, requests_per_unit: 40, burst: 1}
  - channel: gaveup
    max_attempts: 2
    endpoints:
      - name: all
        pattern: "/"
        rate_limit: {unit: second, requests_per_unit: 50, burst: 5}
  - channel: slow
    fixed: true
    endpoints:
      - name: slow
        pattern: "GET /slow"
        rate_limit: {unit: second, requests_per_unit: 1, burst: 1}
  - channel: inflight
    fixed: true
    endpoints:
      - name: work
        pattern: "/work"
        rate_limit: {unit: second, requests_per_unit: 200, burst: 20}
        in_flight: 3
  - channel: meter
    fixed: true
    meters:
      - name: tokens
        rate_limit: {unit: second, requests_per_unit: 1000}
    endpoints:
      - name: complete
        pattern: "POST /complete"
        rate_limit: {unit: second, requests_per_unit: 100, burst: 10}
        costs: {tokens: 1000}
  - channel: web
    fixed: true
    endpoints:
      - name: echo
        pattern: "POST /echo"
        rate_limit: {unit: second, requests_per_unit: 50, burst: 5}
      - name: items
        pattern: "GET /items/{id}"
        rate_limit: {unit: second, requests_per_unit: 50, burst: 5}
  - channel: hdr
    fixed: true
    headers: {forms: [x-ratelimit]}
    endpoints:
      - name: all
        pattern: "/"
        rate_limit: {unit: second, requests_per_unit: 40, burst: 1}
  - channel: bench
    fixed: true
    endpoints:
      - name: items
        pattern: "GET /items/{id}"
        rate_limit: {unit: second, requests_per_unit: 50, burst: 5}
  - channel: strict
    fixed: true
    priorities: [{name: bulk, reserve: 5, horizon: 2s}]
    endpoints:
      - name: only
        pattern: "GET /only"
        rate_limit: {unit: second, requests_per_unit: 100, burst: 10}
"""


def _require_tools() -> bool:
    return bool(os.environ.get("FLEETRATE_REQUIRE_TOOLS") or os.environ.get("CI"))


@pytest.fixture(scope="session")
def fleetrate_bin(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The fleetrate binary: FLEETRATE_BIN, or built from this repository."""
    given = os.environ.get("FLEETRATE_BIN")
    if given:
        return given
    go = shutil.which("go")
    if go is None:
        msg = "go is not installed: cannot build fleetrate (or set FLEETRATE_BIN)"
        if _require_tools():
            pytest.fail(msg)
        pytest.skip(msg)
    out = tmp_path_factory.mktemp("bin") / "fleetrate"
    subprocess.run([go, "build", "-o", str(out), "./cmd/fleetrate"], cwd=REPO, check=True, timeout=900)
    return str(out)


class Service:
    """A running `fleetrate serve` on a free loopback port."""

    def __init__(self, binary: str, config: Path, args: List[str]) -> None:
        cmd = [binary, "serve", "--config", str(config), "--http-addr", "127.0.0.1:0",
               "--grpc-addr", "off", "--log-format", "json", "--log-level", "info",
               # As cmd/fleetrate's tests: a loaded machine is not an outage.
               "--store-timeout", "1s", "--latency-target", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: List[str] = []
        self.url = ""
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.lines.append(line)
                try:
                    m = json.loads(line)
                except ValueError:
                    continue
                if m.get("msg") == "fleetrate serving" and m.get("http"):
                    self.url = "http://" + str(m["http"])
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(30) or not self.url:
            self.stop()
            raise RuntimeError("fleetrate serve did not start:\n" + "".join(self.lines[-30:]))

    def stop(self) -> None:
        """Stop the service and reap it."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def start_service(fleetrate_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Service]]:
    """Starts a `fleetrate serve` with a configuration and flags; every one
    started is stopped at the end of the session."""
    started: List[Service] = []

    def start(config: str, *args: str) -> Service:
        d = tmp_path_factory.mktemp("serve")
        path = d / "fleetrate.yaml"
        path.write_text(config)
        s = Service(fleetrate_bin, path, list(args))
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def service(start_service: Callable[..., Service]) -> Service:
    """The session's service, with every channel of SERVICE_CONFIG."""
    return start_service(SERVICE_CONFIG)


Answer = Tuple[int, Dict[str, str], bytes]


class Arrival:
    """One request as the upstream saw it."""

    def __init__(self, t: float, method: str, path: str, body: bytes) -> None:
        self.t, self.method, self.path, self.body = t, method, path, body
        self.status = 0


class Upstream:
    """An adversarial upstream API on a free loopback port, in threads.

    ``rate``/``burst``: a strict token bucket; a request beyond it gets 429,
    with ``Retry-After: retry_after`` when retry_after is set. ``respond``
    (index, arrival) may answer instead (None: the default answer).
    ``delay`` holds every request that long (for in-flight bounds).
    """

    def __init__(self, rate: Optional[float] = None, burst: float = 1, *,
                 retry_after: Optional[str] = None, delay: float = 0.0,
                 respond: Optional[Callable[[int, Arrival], Optional[Answer]]] = None) -> None:
        self.rate, self.burst, self.retry_after = rate, burst, retry_after
        self.delay, self.respond = delay, respond
        self.lock = threading.Lock()
        self.arrivals: List[Arrival] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._tokens = float(burst)
        self._last = time.monotonic()
        up = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def handle_any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                status, headers, out = up.handle(self.command, self.path, body)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_DELETE = handle_any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, method: str, path: str, body: bytes) -> Answer:
        with self.lock:
            a = Arrival(time.monotonic(), method, path, body)
            i = len(self.arrivals)
            self.arrivals.append(a)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            limited = False
            if self.rate is not None:
                now = a.t
                self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
                self._last = now
                if self._tokens >= 1:
                    self._tokens -= 1
                else:
                    limited = True
        try:
            if self.delay:
                time.sleep(self.delay)
            ans = self.respond(i, a) if self.respond else None
            if ans is None:
                if limited:
                    h = {"Retry-After": self.retry_after} if self.retry_after else {}
                    ans = (429, h, b'{"error":"rate limited"}')
                else:
                    ans = (200, {}, json.dumps({"n": i, "path": path, "body": body.decode()}).encode())
            a.status = ans[0]
            return ans
        finally:
            with self.lock:
                self.in_flight -= 1

    def times(self, status: Optional[int] = None) -> List[float]:
        """Arrival times, of the answers with status when given."""
        with self.lock:
            return [a.t for a in self.arrivals if status is None or a.status == status]

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream() -> Iterator[Callable[..., Upstream]]:
    """Starts Upstreams; each is stopped at the end of the test."""
    made: List[Upstream] = []

    def make(*args: Any, **kw: Any) -> Upstream:
        u = Upstream(*args, **kw)
        made.append(u)
        return u

    yield make
    for u in made:
        u.close()
