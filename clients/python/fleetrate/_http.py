"""A small HTTP/1.1 keep-alive JSON client on asyncio streams.

Only what the fleetrate service needs: POST of a JSON body, an answer with
Content-Length or chunked, connections kept alive in a pool and reused.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any, Dict, List, Optional
from urllib.parse import urlsplit

__all__ = ["Pool", "Response", "ConnectionFailed", "CertificateRefused"]

_MAX_LINE = 64 * 1024
_MAX_BODY = 16 * 1024 * 1024


class ConnectionFailed(Exception):
    """The request could not be sent or its answer could not be read.

    ``sent`` is False when the request certainly did not reach the service
    (the connection could not be opened).
    """

    def __init__(self, message: str, sent: bool) -> None:
        super().__init__(message)
        self.sent: bool = sent


class CertificateRefused(Exception):
    """The service's TLS certificate is not trusted: a setup mistake, not an
    outage."""


class Response:
    """A decoded answer: its status, headers (names lower-cased) and body."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: Dict[str, str], body: bytes) -> None:
        self.status: int = status
        self.headers: Dict[str, str] = headers
        self.body: bytes = body

    def json(self) -> Any:
        """The body decoded as JSON, or {} when it is empty or not JSON."""
        if not self.body:
            return {}
        try:
            return json.loads(self.body)
        except ValueError:
            return {}


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # pragma: no cover - closing a broken transport
            pass


class Pool:
    """Keep-alive connections to one HTTP origin.

    Any number of requests may run at once (one connection each); up to
    ``max_idle`` connections are kept for reuse when they end.
    """

    def __init__(self, url: str, *, max_idle: int = 32,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        u = urlsplit(url)
        if u.scheme not in ("http", "https"):
            raise ValueError(f"url: scheme must be http or https, got {url!r}")
        if not u.hostname:
            raise ValueError(f"url: no host in {url!r}")
        self.host: str = u.hostname
        self.port: int = u.port or (443 if u.scheme == "https" else 80)
        self.base: str = u.path.rstrip("/")
        self.authority: str = u.netloc.rpartition("@")[2]
        self.ssl: Optional[ssl.SSLContext] = None
        if u.scheme == "https":
            self.ssl = ssl_context or ssl.create_default_context()
        self.max_idle = max_idle
        self._idle: List[_Conn] = []
        self._closed = False

    async def _open(self) -> _Conn:
        try:
            reader, writer = await asyncio.open_connection(
                self.host, self.port, ssl=self.ssl,
                server_hostname=self.host if self.ssl else None, limit=_MAX_LINE)
        except ssl.SSLCertVerificationError as e:
            raise CertificateRefused(f"connecting to {self.host}:{self.port}: {e}") from e
        except OSError as e:
            raise ConnectionFailed(f"connecting to {self.host}:{self.port}: {e}", sent=False) from e
        return _Conn(reader, writer)

    def _put(self, c: _Conn) -> None:
        if self._closed or len(self._idle) >= self.max_idle:
            c.close()
        else:
            self._idle.append(c)

    async def post(self, path: str, body: bytes, headers: Dict[str, str],
                   timeout: float) -> Response:
        """POST body to path and return the answer, within timeout seconds.

        A kept-alive connection the service closed meanwhile is detected by
        its answer ending before a byte of it arrived; the request is then
        sent once more on a new connection.
        """
        head = (f"POST {self.base}{path} HTTP/1.1\r\nHost: {self.authority}\r\n"
                f"Content-Type: application/json\r\nAccept: application/json\r\n"
                f"Content-Length: {len(body)}\r\n")
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        raw = head.encode("latin-1") + b"\r\n" + body
        while self._idle:
            c = self._idle.pop()
            if c.reader.at_eof() or c.writer.is_closing():
                c.close()
                continue
            try:
                return await self._exchange(c, raw, timeout, reused=True)
            except _Stale:
                continue
        try:
            c = await asyncio.wait_for(self._open(), timeout)
        except asyncio.TimeoutError:
            raise ConnectionFailed(f"connecting to {self.host}:{self.port}: timed out after {timeout:g}s",
                                   sent=False) from None
        return await self._exchange(c, raw, timeout, reused=False)

    async def _exchange(self, c: _Conn, raw: bytes, timeout: float, reused: bool) -> Response:
        ok = False
        try:
            try:
                resp = await asyncio.wait_for(self._roundtrip(c, raw, reused), timeout)
            except asyncio.TimeoutError:
                raise ConnectionFailed(f"no answer within {timeout:g}s", sent=True) from None
            ok = resp.headers.get("connection", "").lower() != "close"
            return resp
        finally:
            # A connection that did not end cleanly (cancelled, timed out,
            # broken) is closed: the service sees the caller gone.
            if ok:
                self._put(c)
            else:
                c.close()

    async def _roundtrip(self, c: _Conn, raw: bytes, reused: bool) -> Response:
        try:
            c.writer.write(raw)
            await c.writer.drain()
            line = await c.reader.readline()
        except (OSError, asyncio.IncompleteReadError) as e:
            if reused:
                raise _Stale() from e
            raise ConnectionFailed(f"sending the request: {e}", sent=True) from e
        if not line:
            if reused:
                raise _Stale()
            raise ConnectionFailed("the connection closed before an answer", sent=True)
        try:
            return await self._read(c.reader, line)
        except (OSError, asyncio.IncompleteReadError, ValueError, asyncio.LimitOverrunError) as e:
            raise ConnectionFailed(f"reading the answer: {e}", sent=True) from e

    @staticmethod
    async def _read(r: asyncio.StreamReader, line: bytes) -> Response:
        parts = line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ValueError(f"not an HTTP/1.x status line: {line[:80]!r}")
        status = int(parts[1])
        headers: Dict[str, str] = {}
        while True:
            h = await r.readline()
            if h in (b"\r\n", b"\n"):
                break
            if not h:
                raise ValueError("the answer's headers end early")
            name, _, value = h.decode("latin-1").partition(":")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await _read_chunked(r)
        elif "content-length" in headers:
            n = int(headers["content-length"])
            if n < 0 or n > _MAX_BODY:
                raise ValueError(f"Content-Length {n} out of range")
            body = await r.readexactly(n)
        elif status in (204, 304) or 100 <= status < 200:
            body = b""
        else:  # read to the end; the connection cannot be reused
            body = await r.read(_MAX_BODY)
            headers["connection"] = "close"
        return Response(status, headers, body)

    async def close(self) -> None:
        """Close every idle connection; later requests are not pooled."""
        self._closed = True
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()
        for c in idle:
            try:
                await c.writer.wait_closed()
            except Exception:
                pass


class _Stale(Exception):
    """A reused connection turned out closed before the answer began."""


async def _read_chunked(r: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size_line = await r.readline()
        if not size_line:
            raise ValueError("chunked body ends early")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await r.readline()) not in (b"\r\n", b"\n", b""):
                pass
            return bytes(out)
        if len(out) + size > _MAX_BODY:
            raise ValueError("chunked body too large")
        out += await r.readexactly(size)
        await r.readexactly(2)

