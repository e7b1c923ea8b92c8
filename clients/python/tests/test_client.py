"""The core client against a real `fleetrate serve` and an adversarial
upstream. Timing assertions are loose: the machine may be loaded."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple, TypeVar

import httpx
import pytest

import fleetrate
from fleetrate import Backpressure, GaveUp, Invalid, UnknownChannel, UnknownTicket

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


def sender(http: httpx.AsyncClient, method: str, url: str,
           body: bytes = b"") -> Callable[[], Awaitable[Tuple[int, httpx.Headers, httpx.Response]]]:
    """A send function for Client.call: the request, sent as often as
    asked; the call's result is the response."""

    async def send() -> Tuple[int, httpx.Headers, httpx.Response]:
        r = await http.request(method, url, content=body)
        return r.status_code, r.headers, r

    return send


def test_pacing(service: Any, upstream: Any) -> None:
    """30 calls by 8 tasks at the endpoint's 20/s (burst 1) take about
    29/20 s, and the upstream, strict at 25/s, never says 429."""
    up = upstream(rate=25, burst=3, retry_after="1")
    calls = 30

    async def main() -> float:
        async with fleetrate.Client(service.url) as fr, httpx.AsyncClient() as http:
            queue: "asyncio.Queue[int]" = asyncio.Queue()
            for i in range(calls):
                queue.put_nowait(i)

            async def worker() -> None:
                while not queue.empty():
                    i = queue.get_nowait()
                    status = (await fr.call("pace", "GET", f"/items/{i}",
                                                 sender(http, "GET", f"{up.url}/items/{i}"))).status_code
                    assert status == 200

            t0 = time.monotonic()
            await asyncio.gather(*(worker() for _ in range(8)))
            return time.monotonic() - t0

    took = run(main())
    want = (calls - 1) / 20
    assert want * 0.8 <= took <= want * 2.5 + 1.0, f"{calls} calls took {took:.2f}s, want about {want:.2f}s"
    assert len(up.times()) == calls
    assert up.times(429) == []


def test_pause_after_429_with_retry_after(service: Any, upstream: Any) -> None:
    """A 429 with Retry-After: 1 pauses every worker of the channel: no
    request reaches the upstream during the pause, and the limited request
    is sent again after it and succeeds."""

    def respond(i: int, a: Any) -> Optional[Tuple[int, Dict[str, str], bytes]]:
        return (429, {"Retry-After": "1"}, b"{}") if i == 5 else None

    up = upstream(respond=respond)
    results: List[int] = []

    async def main() -> None:
        async with fleetrate.Client(service.url) as fr, httpx.AsyncClient() as http:
            async def worker(w: int) -> None:
                for j in range(6):
                    status = (await fr.call("pause", "GET", f"/x/{w}/{j}",
                                                 sender(http, "GET", f"{up.url}/x/{w}/{j}"))).status_code
                    results.append(status)

            await asyncio.gather(*(worker(w) for w in range(4)))

    run(main())
    assert results == [200] * 24
    t429 = up.times(429)
    assert len(t429) == 1
    after = [t - t429[0] for t in up.times() if t > t429[0]]
    # Requests booked before the 429 was reported may still arrive just
    # after it; none in the rest of the pause.
    during = [round(d, 3) for d in after if 0.3 <= d <= 0.9]
    assert during == [], f"requests arrived during the pause, at {during} s after the 429"
    assert after and max(after) >= 0.9, "nothing was sent after the pause"


def test_pause_after_bare_429(service: Any, upstream: Any) -> None:
    """A 429 without Retry-After pauses the fleet too (for the transport's
    own backoff): 4 workers paced at 40/s leave a gap of at least 0.3 s in
    the arrivals after it, and every call succeeds, the limited one sent
    again."""

    def respond(i: int, a: Any) -> Optional[Tuple[int, Dict[str, str], bytes]]:
        return (429, {}, b"{}") if i == 5 else None

    up = upstream(respond=respond)
    results: List[int] = []

    async def main() -> None:
        async with fleetrate.Client(service.url) as fr, httpx.AsyncClient() as http:
            async def worker(w: int) -> None:
                for j in range(5):
                    results.append((await fr.call("bare", "GET", f"/y/{w}/{j}",
                                                  sender(http, "GET", f"{up.url}/y/{w}/{j}"))).status_code)

            await asyncio.gather(*(worker(w) for w in range(4)))

    run(main())
    assert results == [200] * 20
    t429 = up.times(429)
    assert len(t429) == 1
    assert len(up.times()) == 21  # the limited request was sent again
    after = [t for t in up.times() if t >= t429[0]]
    gaps = [b - a for a, b in zip(after, after[1:])]
    assert max(gaps) >= 0.3, f"no pause after a bare 429: gaps {[round(g, 3) for g in gaps]}"


def test_gave_up_after_max_attempts(service: Any, upstream: Any) -> None:
    """An upstream that always says 429: after max_attempts (2) sends, the
    call raises GaveUp with the attempts, the status and the Retry-After."""
    up = upstream(respond=lambda i, a: (429, {"Retry-After": "0.2"}, b"{}"))

    async def main() -> None:
        async with fleetrate.Client(service.url) as fr, httpx.AsyncClient() as http:
            await fr.call("gaveup", "GET", "/z", sender(http, "GET", f"{up.url}/z"))

    with pytest.raises(GaveUp) as e:
        run(main())
    assert e.value.attempts == 2
    assert e.value.status == 429
    assert len(up.times()) == 2
    assert isinstance(e.value, fleetrate.FleetrateError)


def test_backpressure_with_max_wait(service: Any) -> None:
    """At 1/s, a second booking that may wait 0.1 s is refused with
    Backpressure and a retry_after; nothing is booked, so a later one with
    enough max_wait goes through."""

    async def main() -> None:
        async with fleetrate.Client(service.url) as fr:
            first = await fr.book("slow", "GET", "/slow", max_wait=0.1)
            assert first.endpoint == "slow"
            with pytest.raises(Backpressure) as e:
                await fr.book("slow", "GET", "/slow", max_wait=0.1)
            assert 0.3 <= e.value.retry_after <= 1.5, e.value.retry_after
            assert e.value.code == "backpressure"
            assert (await first.report(200, {})).retry is False
            second = await fr.book("slow", "GET", "/slow", max_wait=3)
            assert second.waited >= 0.3
            await second.report(200, {})

    run(main())


def test_invalid_input_names_the_field(service: Any) -> None:
    """Bad input is refused with Invalid naming the field; an unknown
    channel is UnknownChannel; a path no endpoint matches is Invalid."""

    async def main() -> None:
        async with fleetrate.Client(service.url) as fr:
            with pytest.raises(Invalid) as e:
                await fr.book("strict", "GET", "/only", attempt=0)
            assert "attempt" in str(e.value) and e.value.status == 400
            with pytest.raises(Invalid) as e:
                await fr.book("strict", "GET", "only")
            assert "path" in str(e.value)
            with pytest.raises(Invalid) as e:
                await fr.book("strict", "", "/only")
            assert "method" in str(e.value)
            with pytest.raises(Invalid) as e:
                await fr.book("strict", "GET", "/only", max_wait=-1)
            assert "max_wait" in str(e.value)
            with pytest.raises(Invalid) as e:
                await fr.book("strict", "DELETE", "/elsewhere")
            assert e.value.status == 400
            with pytest.raises(Invalid) as e:
                await fr.book("strict", "GET", "/only", priority="no-such-class")
            assert "priority" in str(e.value) and "no-such-class" in str(e.value)
            t = await fr.book("strict", "GET", "/only", priority="bulk", entity="hotel-7")
            await t.report(200)
            with pytest.raises(UnknownChannel) as e:
                await fr.book("no-such-channel", "GET", "/only")
            assert "no-such-channel" in str(e.value)
            # Checked before any call: a wrong type.
            with pytest.raises(Invalid) as e:
                await fr.book("strict", "GET", "/only", attempt="2")  # type: ignore[arg-type]
            assert "attempt" in str(e.value) and e.value.status == 0
            with pytest.raises(Invalid) as e:
                await fr.book("strict", "GET", "/only", costs={"tokens": 1.5})  # type: ignore[dict-item]
            assert "costs" in str(e.value)

    run(main())


def test_unknown_ticket(service: Any) -> None:
    """A ticket never booked, or reported already, is UnknownTicket."""

    async def main() -> None:
        async with fleetrate.Client(service.url) as fr:
            t = await fr.book("strict", "GET", "/only")
            await t.report(200, {"Content-Type": "text/plain"})
            with pytest.raises(UnknownTicket):
                await t.report(200, {})
            forged = fleetrate.Ticket(client=fr, ticket="forged-ticket", channel="strict",
                                      endpoint="only", attempt=1, waited=0, report_within=60)
            with pytest.raises(UnknownTicket) as e:
                await forged.failed("timeout", sent=False)
            assert e.value.status == 404

    run(main())


def test_in_flight_bound_with_concurrency(service: Any, upstream: Any) -> None:
    """16 tasks on an endpoint with in_flight: 3: the upstream never holds
    more than 3 requests at once."""
    up = upstream(delay=0.1)

    async def main() -> None:
        async with fleetrate.Client(service.url) as fr, httpx.AsyncClient(timeout=30) as http:
            async def one(i: int) -> None:
                status = (await fr.call("inflight", "POST", "/work",
                                             sender(http, "POST", f"{up.url}/work", b"x"), max_wait=5)).status_code
                assert status == 200

            await asyncio.gather(*(one(i) for i in range(18)))

    run(main())
    assert len(up.times()) == 18
    assert 2 <= up.max_in_flight <= 3, f"max in flight {up.max_in_flight}, want the bound of 3"


def test_call_settles_costs(service: Any, upstream: Any) -> None:
    """Each call books 1000 tokens of a 1000/s meter and settles to 100: 8
    calls in a row take about 0.7 s, not the 7 s the estimates alone would."""
    up = upstream()

    async def main() -> float:
        async with fleetrate.Client(service.url) as fr, httpx.AsyncClient() as http:
            t0 = time.monotonic()
            for _ in range(8):
                await fr.call("meter", "POST", "/complete", sender(http, "POST", f"{up.url}/complete", b"{}"),
                              settle=lambda body: {"tokens": 100}, max_wait=5)
            return time.monotonic() - t0

    took = run(main())
    assert 0.35 <= took <= 4.0, f"8 settled calls took {took:.2f}s, want about 0.7 s"


def test_rate_limit_headers_hold_the_fleet(service: Any, upstream: Any) -> None:
    """An answer saying X-RateLimit-Remaining: 0 with a reset in 1 s holds
    the channel: the next request waits for the reset."""

    def respond(i: int, a: Any) -> Optional[Tuple[int, Dict[str, str], bytes]]:
        if i == 0:
            return 200, {"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1"}, b"{}"
        return None

    up = upstream(respond=respond)

    async def main() -> None:
        async with fleetrate.Client(service.url) as fr, httpx.AsyncClient() as http:
            for j in range(3):
                await fr.call("hdr", "GET", f"/h/{j}", sender(http, "GET", f"{up.url}/h/{j}"), max_wait=5)

    run(main())
    t = up.times()
    assert len(t) == 3
    assert t[1] - t[0] >= 0.6, f"the second request came {t[1] - t[0]:.3f}s after remaining 0, reset 1 s"


def test_failed_send_is_reported_and_raised(service: Any) -> None:
    """A send that raises is reported failed and its exception re-raised;
    the ticket is consumed."""

    async def main() -> None:
        async with fleetrate.Client(service.url) as fr:
            async def send() -> Tuple[int, Dict[str, str], None]:
                raise ConnectionRefusedError("upstream down")

            with pytest.raises(ConnectionRefusedError):
                await fr.call("strict", "GET", "/only", send)
            t = await fr.book("strict", "GET", "/only")
            v = await t.failed("timeout", sent=True)
            assert v.retry is False
            with pytest.raises(UnknownTicket):
                await t.failed("timeout", sent=True)

    run(main())


def test_token_and_environment(start_service: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """With tokens, a call without one (or with a wrong one) is
    Unauthorized; FLEETRATE_URL and FLEETRATE_TOKEN are the defaults."""
    tokens = tmp_path / "tokens"
    tokens.write_text("s3cret decide\n")
    svc = start_service("upstreams:\n  - channel: c\n    endpoints:\n      - name: e\n        pattern: \"/\"\n"
                        "        rate_limit: {unit: second, requests_per_unit: 100}\n",
                        "--auth-token-file", str(tokens))

    async def main() -> None:
        async with fleetrate.Client(svc.url, token="") as fr:
            with pytest.raises(fleetrate.Unauthorized) as e:
                await fr.book("c", "GET", "/")
            assert e.value.status == 401
        async with fleetrate.Client(svc.url, token="wrong") as fr:
            with pytest.raises(fleetrate.Unauthorized):
                await fr.book("c", "GET", "/")
        monkeypatch.setenv("FLEETRATE_URL", svc.url)
        monkeypatch.setenv("FLEETRATE_TOKEN", "s3cret")
        async with fleetrate.Client() as fr:
            assert fr.url == svc.url
            t = await fr.book("c", "GET", "/a?b=c")
            assert t.endpoint == "e"
            assert (await t.report(200)).retry is False

    run(main())


def test_unreachable_service_is_unavailable() -> None:
    """No service at the address: Unavailable, never a denial."""

    async def main() -> None:
        async with fleetrate.Client("http://127.0.0.1:1", timeout=2) as fr:
            with pytest.raises(fleetrate.Unavailable):
                await fr.book("c", "GET", "/")

    run(main())


def test_cancelled_booking_does_not_hang(service: Any) -> None:
    """A task cancelled while it waits for its turn ends at once, and the
    client stays usable."""

    async def main() -> None:
        async with fleetrate.Client(service.url) as fr:
            t = await fr.book("slow", "GET", "/slow", max_wait=3)
            waiting = asyncio.ensure_future(fr.book("slow", "GET", "/slow", max_wait=3))
            await asyncio.sleep(0.1)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await t.report(200)

    run(main())


def test_gave_up_message(service: Any, upstream: Any) -> None:
    """GaveUp's message is the service's, naming the channel and status."""
    up = upstream(respond=lambda i, a: (429, {"Retry-After": "0.1"}, b"{}"))

    async def main() -> None:
        async with fleetrate.Client(service.url) as fr, httpx.AsyncClient() as http:
            await fr.call("gaveup", "GET", "/m", sender(http, "GET", f"{up.url}/m"))

    with pytest.raises(GaveUp) as e:
        run(main())
    assert "gaveup" in str(e.value) and "429" in str(e.value), str(e.value)


def test_https(start_service: Any, tmp_path: Any) -> None:
    """The service over TLS: an https URL with a context trusting its
    certificate (a self-signed one made with openssl)."""
    import shutil
    import ssl
    import subprocess

    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=30)
    svc = start_service("upstreams:\n  - channel: c\n    endpoints:\n      - name: e\n        pattern: \"/\"\n"
                        "        rate_limit: {unit: second, requests_per_unit: 100}\n",
                        "--tls-cert-file", str(cert), "--tls-key-file", str(key))
    url = svc.url.replace("http://", "https://")

    async def main() -> None:
        ctx = ssl.create_default_context(cafile=str(cert))
        async with fleetrate.Client(url, ssl_context=ctx) as fr:
            for _ in range(3):  # the connection is kept alive and reused
                t = await fr.book("c", "GET", "/tls")
                assert (await t.report(200)).retry is False
        async with fleetrate.Client(url) as fr:  # the system's CAs do not trust it: a setup mistake
            with pytest.raises(fleetrate.FleetrateError) as e:
                await fr.book("c", "GET", "/tls")
            assert not isinstance(e.value, fleetrate.Unavailable) and e.value.code == "certificate"

    run(main())
