"""fleetrate.httpx.PacedTransport end to end: httpx.AsyncClient →
PacedTransport → a real `fleetrate serve` and an adversarial upstream."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Dict, List, Optional, Tuple

import httpx
import pytest

import fleetrate
import fleetrate.httpx


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_paced_client_end_to_end(service: Any, upstream: Any) -> None:
    """A POST limited once (Retry-After: 0.3) is sent again with the same
    body and its final answer returned; GETs with queries are routed to
    their endpoint; the pause holds the other requests."""
    bodies: List[bytes] = []

    def respond(i: int, a: Any) -> Optional[Tuple[int, Dict[str, str], bytes]]:
        if a.method == "POST":
            bodies.append(a.body)
            if len(bodies) == 1:
                return 429, {"Retry-After": "0.3"}, b"{}"
        return None

    up = upstream(respond=respond)

    async def main() -> Tuple[httpx.Response, List[int]]:
        async with fleetrate.Client(service.url) as fr, httpx.AsyncClient(
                transport=fleetrate.httpx.PacedTransport(fr, "web"), base_url=up.url) as http:
            r = await http.post("/echo", json={"hotel": 7, "rooms": [1, 2]},
                                extensions={"fleetrate": {"entity": "hotel-7", "max_wait": 4}})
            gets = await asyncio.gather(*(http.get(f"/items/{i}", params={"q": "a b"}) for i in range(10)))
            return r, [g.status_code for g in gets]

    r, statuses = run(main())
    assert r.status_code == 200
    assert json.loads(r.json()["body"]) == {"hotel": 7, "rooms": [1, 2]}
    assert len(bodies) == 2 and bodies[0] == bodies[1]
    assert statuses == [200] * 10
    post_429 = up.times(429)
    assert len(post_429) == 1
    early = [t - post_429[0] for t in up.times() if 0.1 < t - post_429[0] < 0.25]
    assert early == [], "requests reached the upstream during its Retry-After"
    assert any(a.path.startswith("/items/") and "q=a+b" in a.path for a in up.arrivals)


def test_paced_client_gives_up(service: Any, upstream: Any) -> None:
    """Always 429: GaveUp from the httpx call after max_attempts (2)."""
    up = upstream(respond=lambda i, a: (429, {"Retry-After": "0.2"}, b"{}"))

    async def main() -> None:
        async with fleetrate.Client(service.url) as fr, httpx.AsyncClient(
                transport=fleetrate.httpx.PacedTransport(fr, "gaveup")) as http:
            await http.get(up.url + "/always-limited")

    with pytest.raises(fleetrate.GaveUp) as e:
        run(main())
    assert e.value.attempts == 2 and e.value.status == 429
    assert 0.1 <= e.value.retry_after <= 0.3
    assert len(up.times()) == 2


def test_paced_client_transport_error(service: Any, upstream: Any) -> None:
    """An upstream that cannot be reached: the httpx error is re-raised
    (reported as not sent), and the channel keeps working."""
    up = upstream()

    async def main() -> int:
        async with fleetrate.Client(service.url) as fr, httpx.AsyncClient(
                transport=fleetrate.httpx.PacedTransport(fr, "strict")) as http:
            with pytest.raises(httpx.ConnectError):
                await http.get("http://127.0.0.1:1/only")
            return (await http.get(up.url + "/only")).status_code

    assert run(main()) == 200


def test_paced_client_backpressure(service: Any, upstream: Any) -> None:
    """max_wait through the request's extensions: Backpressure from the
    httpx call when the turn is too far."""
    up = upstream()

    async def main() -> None:
        async with fleetrate.Client(service.url) as fr, httpx.AsyncClient(
                transport=fleetrate.httpx.PacedTransport(fr, "slow", max_wait=5)) as http:
            assert (await http.get(up.url + "/slow")).status_code == 200
            with pytest.raises(fleetrate.Backpressure):
                await http.get(up.url + "/slow", extensions={"fleetrate": {"max_wait": 0.05}})

    run(main())


def test_paced_client_costs_and_settle(service: Any, upstream: Any) -> None:
    """costs estimates 1000 tokens of a 1000/s meter, settle reads the
    tokens used (100) from the body: 8 calls take about 0.7 s instead of 7."""
    up = upstream(respond=lambda i, a: (200, {}, json.dumps({"usage": {"tokens": 100}}).encode()))
    seen: List[int] = []

    def settle(resp: httpx.Response) -> Dict[str, int]:
        used = int(resp.json()["usage"]["tokens"])
        seen.append(used)
        return {"tokens": used}

    async def main() -> float:
        async with fleetrate.Client(service.url) as fr, httpx.AsyncClient(
                transport=fleetrate.httpx.PacedTransport(
                    fr, "meter", max_wait=5, costs=lambda req: {"tokens": 1000}, settle=settle)) as http:
            t0 = time.monotonic()
            for _ in range(8):
                r = await http.post(up.url + "/complete", json={"prompt": "hi"})
                assert r.json()["usage"]["tokens"] == 100  # the body is still there
            return time.monotonic() - t0

    took = run(main())
    assert seen == [100] * 8
    assert 0.35 <= took <= 4.0, f"8 settled calls took {took:.2f}s, want about 0.7 s"


def test_paced_client_streaming(service: Any, upstream: Any) -> None:
    """A streamed response is handed over unread."""
    up = upstream()

    async def main() -> bytes:
        async with fleetrate.Client(service.url) as fr, httpx.AsyncClient(
                transport=fleetrate.httpx.PacedTransport(fr, "web")) as http:
            async with http.stream("GET", up.url + "/items/1") as r:
                return b"".join([c async for c in r.aiter_bytes()])

    assert json.loads(run(main()))["path"] == "/items/1"
