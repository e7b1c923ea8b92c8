"""The HTTP/1.1 client under the fleetrate client, against a scripted
asyncio server: keep-alive reuse, chunked answers, a kept-alive
connection the server closed meanwhile, and timeouts."""

from __future__ import annotations

import asyncio
import json
from typing import List, Tuple

import pytest

import fleetrate

BOOKED = json.dumps({"ticket": "t1", "endpoint": "e", "waited_ms": 0, "report_within_ms": 1000}).encode()


class Scripted:
    """A server answering every request with BOOKED; ``mode`` says how:
    "keep" (Content-Length, kept alive), "chunked", "close-after" (closes
    the connection after each answer without saying so), or "silent"
    (never answers)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.connections = 0
        self.requests: List[Tuple[str, bytes]] = []
        self.server: "asyncio.AbstractServer | None" = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                line = await r.readline()
                if not line:
                    return
                n = 0
                while True:
                    h = await r.readline()
                    if h in (b"\r\n", b""):
                        break
                    if h.lower().startswith(b"content-length:"):
                        n = int(h.split(b":")[1])
                body = await r.readexactly(n)
                self.requests.append((line.decode().split()[1], body))
                if self.mode == "silent":
                    await asyncio.sleep(60)
                if self.mode == "chunked":
                    half = len(BOOKED) // 2
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                            + b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, BOOKED[:half], len(BOOKED) - half, BOOKED[half:]))
                else:
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                            % (len(BOOKED), BOOKED))
                await w.drain()
                if self.mode == "close-after":
                    await asyncio.sleep(0.01)
                    w.close()
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            w.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()


@pytest.mark.parametrize("mode", ["keep", "chunked"])
def test_keep_alive(mode: str) -> None:
    """20 bookings one after the other use one connection; the path and
    the JSON body are as the contract says."""

    async def main() -> Scripted:
        s = Scripted(mode)
        url = await s.start()
        async with fleetrate.Client(url + "/prefix", token="tok") as fr:
            for _ in range(20):
                t = await fr.book("c", "GET", "/x?y=1", max_wait=1.5, costs={"tokens": 3})
                assert t.ticket == "t1" and t.endpoint == "e"
        await s.stop()
        return s

    s = asyncio.run(main())
    assert s.connections == 1
    path, body = s.requests[0]
    assert path == "/prefix/v1/outbound/book"
    assert json.loads(body) == {"channel": "c", "method": "GET", "path": "/x?y=1", "attempt": 1,
                                "max_wait_ms": 1500, "costs": {"tokens": 3}}


def test_connection_closed_by_the_server_is_replaced() -> None:
    """A kept-alive connection the server closed after its answer: the next
    request goes on a new connection, once, without an error."""

    async def main() -> Scripted:
        s = Scripted("close-after")
        url = await s.start()
        async with fleetrate.Client(url) as fr:
            for _ in range(5):
                await fr.book("c", "GET", "/")
                await asyncio.sleep(0.05)
        await s.stop()
        return s

    s = asyncio.run(main())
    assert len(s.requests) == 5  # each sent once
    assert s.connections == 5


def test_timeout_is_unavailable() -> None:
    """A service that never answers: Unavailable after timeout + max_wait."""

    async def main() -> None:
        s = Scripted("silent")
        url = await s.start()
        async with fleetrate.Client(url, timeout=0.2) as fr:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(fleetrate.Unavailable, match="no answer"):
                await fr.book("c", "GET", "/", max_wait=0.1)
            assert 0.25 <= loop.time() - t0 < 5
        await s.stop()

    asyncio.run(main())
