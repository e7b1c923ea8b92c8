"""An httpx transport that paces every request through fleetrate's outbound
protocol::

    import httpx, fleetrate, fleetrate.httpx

    async with fleetrate.Client() as fr, httpx.AsyncClient(
            transport=fleetrate.httpx.PacedTransport(fr, "booking_com")) as http:
        r = await http.get("https://api.example.com/v1/hotels/7")

Each request is booked with its method, path (and query) and host, sent
through the inner transport (httpx.AsyncHTTPTransport by default), its
status and headers reported, and sent again when the service says so; after
the last attempt GaveUp is raised. This module imports httpx; the rest of
the package does not need it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Optional

import httpx

from .client import Client, _report_in_background, failed_or_keep, report_or_keep

__all__ = ["PacedTransport", "Costs", "Settle"]

#: Estimates a request's costs by meter before it is sent.
Costs = Callable[[httpx.Request], Optional[Mapping[str, int]]]
#: Reads a response's actual costs by meter (its body is read already).
Settle = Callable[[httpx.Response], Optional[Mapping[str, int]]]


class PacedTransport(httpx.AsyncBaseTransport):
    """An httpx.AsyncBaseTransport pacing every request of the upstream
    ``channel`` through ``client`` (a fleetrate.Client).

    ``inner`` sends the requests (default: a new httpx.AsyncHTTPTransport,
    closed with this one). ``max_wait``, ``priority`` and ``entity`` are
    book's for every request; a request's ``extensions={"fleetrate": {...}}``
    may override them, and give ``costs``. ``costs(request)`` estimates a
    request's costs by meter; ``settle(response)`` reads what it really cost
    from the response, whose body is read first.

    A request body is read once and replayed on a retry. Book's errors
    (Backpressure, Unavailable, ...) and GaveUp are raised from the
    request; a transport error of the inner transport is reported (sent
    False when the connection could not be made) and re-raised, unless the
    service says to retry. An answer whose report fails (the service
    unavailable, the ticket expired) is returned as it is, with a warning
    on the "fleetrate" logger.
    """

    def __init__(self, client: Client, channel: str,
                 inner: Optional[httpx.AsyncBaseTransport] = None, *,
                 max_wait: Optional[float] = None, priority: Optional[str] = None,
                 entity: Optional[str] = None, costs: Optional[Costs] = None,
                 settle: Optional[Settle] = None) -> None:
        self.client: Client = client
        self.channel: str = channel
        self._own_inner = inner is None
        self.inner: httpx.AsyncBaseTransport = inner if inner is not None else httpx.AsyncHTTPTransport()
        self.max_wait: Optional[float] = max_wait
        self.priority: Optional[str] = priority
        self.entity: Optional[str] = entity
        self.costs: Optional[Costs] = costs
        self.settle: Optional[Settle] = settle

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Book, send, report and retry as the service says; return the
        answer of the last attempt."""
        await request.aread()  # the body, replayable on a retry
        opts: Mapping[str, Any] = request.extensions.get("fleetrate") or {}
        costs = opts.get("costs")
        if costs is None and self.costs is not None:
            costs = self.costs(request)
        path = request.url.raw_path.decode("ascii")
        attempt = 1
        while True:
            ticket = await self.client.book(
                self.channel, request.method, path, attempt=attempt,
                max_wait=opts.get("max_wait", self.max_wait),
                priority=opts.get("priority", self.priority),
                entity=opts.get("entity", self.entity),
                costs=costs, host=request.url.host or None)
            try:
                ticket.mark_sent()
                response = await self.inner.handle_async_request(request)
                ticket.mark_answered()
            except asyncio.CancelledError:
                _report_in_background(ticket.failed("cancelled", sent=True))
                raise
            except Exception as e:
                verdict = await failed_or_keep(ticket, e, _sent(e))
                if not verdict.retry:
                    raise
            else:
                try:
                    actual = None
                    if self.settle is not None:
                        await response.aread()
                        actual = self.settle(response)
                    verdict = await report_or_keep(ticket, response.status_code, response.headers, actual)
                except BaseException:
                    await response.aclose()
                    raise
                if not verdict.retry:
                    return response
                await response.aclose()
            await asyncio.sleep(verdict.retry_in)
            attempt = verdict.attempt

    async def aclose(self) -> None:
        """Close the inner transport when this transport made it."""
        if self._own_inner:
            await self.inner.aclose()


def _sent(e: BaseException) -> bool:
    """Whether a failed send may have reached the upstream: not when the
    connection could not be made (or no connection of the pool was free)."""
    return not isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout,
                              httpx.UnsupportedProtocol))
